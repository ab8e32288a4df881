"""One centre's staging with real slides, a real store and real kept models: the slides
of its store's test patients, maps by every model in one read, each patient's threshold
cross-fitted on the other test patients, calls, files within the centre's folder,
verified; a slide that cannot be read is recorded and the others are staged."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from analysis.report.staging import staging_of_runs, staging_table
from analysis.staging.centre import (
    CALLS_FILE,
    SlideMapper,
    SlideMaps,
    StagingSlide,
    centre_calls,
    centre_dir,
    centre_slides,
    choose_threshold,
    cross_fitted_thresholds,
    map_path,
    read_centre,
    write_centre,
)
from analysis.staging.models import StagingModelError, model_predictor, staging_model
from analysis.staging.summary import summarise
from plumbing.verified import DamagedFileError, record_digest
from proxyfl.engine.models import build_model
from proxyfl.engine.trained import CLASSES, NORMALISATION, ModelCard, save_trained
from proxyfl.kept import trained_path
from wsi.cache import CandidateCache
from wsi.catalogue import scan_camelyon
from wsi.center import SamplingParams
from wsi.heatmap import read_map
from wsi.nodes import NodeThresholds
from wsi.patches import PatchParams
from wsi.preprocess import center_store, slide_patches
from wsi.store.reader import read_store_info
from wsi.store.schema import store_path

PARAMS = PatchParams(patch_size=32, level=2)


def _keep(run_dir: Path, algorithm: str, client: int, name: str, center: int, seed: int) -> None:
    torch.manual_seed(seed)
    model = build_model("cnn1", n_classes=2, input_size=32)
    card = ModelCard("cnn1", 2, 32, 32, NORMALISATION, CLASSES, name, algorithm, 0, client,
                     center, 1, "sha256:" + "0" * 64)  # fmt: skip
    save_trained(model, trained_path(run_dir, client, name), card)


@pytest.fixture(scope="module")
def centre(synthetic_dataset, tmp_path_factory):  # type: ignore[no-untyped-def]
    """Centre 0 of the synthetic dataset, its store, and two runs' kept models."""
    root = tmp_path_factory.mktemp("staging")
    shutil.copytree(synthetic_dataset.root, root / "data")
    records = [r for r in scan_camelyon(root / "data").for_centers([0]) if r.node_label]
    patches = [slide_patches(r, PARAMS, CandidateCache(root / "cache")) for r in records]
    sampling = SamplingParams(patches_per_class=8, test_fraction=0.5)
    center_store(0, patches, PARAMS, sampling, root / "stores", records=records)
    runs = root / "runs"
    for name in ("private", "proxy"):
        _keep(runs / "ProxyFL" / "seed_0", "ProxyFL", 0, name, 0, seed=1)
    _keep(runs / "ProxyFL" / "seed_0", "ProxyFL", 1, "private", 1, seed=2)
    _keep(runs / "Joint" / "seed_0", "Joint", 0, "local", -1, seed=3)
    return root, records


def test_each_run_stages_a_centre_with_the_model_the_hospital_came_for(centre) -> None:  # type: ignore[no-untyped-def]
    root, _ = centre
    proxyfl = staging_model(root / "runs/ProxyFL/seed_0", "ProxyFL", 0, [0, 1], 0)
    assert proxyfl.path.name == "private.safetensors" and proxyfl.client == 0
    assert proxyfl.digest.startswith("sha256:") and proxyfl.key == "ProxyFL/seed_0"
    assert staging_model(root / "runs/ProxyFL/seed_0", "ProxyFL", 0, [0, 1], 1).client == 1
    joint = staging_model(root / "runs/Joint/seed_0", "Joint", 0, [0, 1], 1)
    assert joint.path.name == "local.safetensors" and joint.client == 0
    with pytest.raises(StagingModelError, match="no kept model"):
        staging_model(root / "runs/FedAvg/seed_0", "FedAvg", 0, [0, 1], 0)
    with pytest.raises(StagingModelError, match="centre 2 is not one of its clients"):
        staging_model(root / "runs/ProxyFL/seed_0", "ProxyFL", 0, [0, 1], 2)


def test_a_centre_is_staged_within_its_folder_from_its_own_splits(centre, tmp_path) -> None:  # type: ignore[no-untyped-def]
    root, records = centre
    slides = centre_slides(records, store_path(root / "stores", 0))
    test_patients = {s.patient for s in slides}
    stored = read_store_info(store_path(root / "stores", 0), ("train", "test")).splits
    assert test_patients == set(stored["test"].patients) and test_patients
    assert len(slides) == 5 * len(test_patients)  # every node of each, none of training
    models = {m.key: m for m in (
        staging_model(root / "runs/ProxyFL/seed_0", "ProxyFL", 0, [0, 1], 0),
        staging_model(root / "runs/Joint/seed_0", "Joint", 0, [0, 1], 0),
    )}  # fmt: skip
    predictors = {key: model_predictor(m, torch.device("cpu"), 64) for key, m in models.items()}
    real = NodeThresholds()
    mapper = SlideMapper(PARAMS, predictors, 50, real, 8000.0)
    mapped = [mapper.map_or_failure(s) for s in slides]
    assert all(isinstance(m, SlideMaps) for m in mapped)
    first = mapped[0]
    assert isinstance(first, SlideMaps)
    # a 3072 x 2048 px slide at 0.25 µm: 512 µm across, thresholds scaled by 0.064
    assert first.thresholds.itc_max_um == pytest.approx(12.8)
    assert set(first.maps) == set(models)
    assert not np.array_equal(first.maps["ProxyFL/seed_0"], first.maps["Joint/seed_0"],
                              equal_nan=True)  # fmt: skip

    calls = centre_calls(0, mapped, [], {k: m.digest for k, m in models.items()}, [0.3, 0.5, 0.9])
    assert calls.test_patients == sorted(test_patients)
    for key in models:
        entry = calls.models[key]
        # one test patient: no other to choose on, the lowest candidate
        assert entry["thresholds"] == {p: 0.3 for p in test_patients}
        staged = [c.slide_id for c in calls.calls_of(key)]
        assert staged == [s.slide_id for s in slides]
    written = write_centre(tmp_path, calls, mapped)
    assert written == centre_dir(tmp_path, 0) / CALLS_FILE
    files = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.h5")}
    assert files == {f"center_0/{key}/{s.slide_id}.h5" for key in models for s in slides}
    back = read_centre(tmp_path, 0)
    assert back.models == calls.models
    tested = [s.slide_id for s in slides]
    assert sorted(back.pictures) == sorted(tested)
    for picture in back.pictures.values():  # each test slide drawn, beside its maps
        assert (centre_dir(tmp_path, 0) / picture).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for call in back.models["ProxyFL/seed_0"]["calls"]:  # each call is its map's
        tumour_map = read_map(map_path(tmp_path, 0, "ProxyFL/seed_0", call["slide_id"]), "-")
        assert tumour_map.model == models["ProxyFL/seed_0"].digest
        assert call["score"] == pytest.approx(float(np.nanmax(tumour_map.probability)))
    (centre_dir(tmp_path, 0) / CALLS_FILE).write_text("{}")
    with pytest.raises(DamagedFileError, match="camelyon-proxyfl stage --centers 0"):
        read_centre(tmp_path, 0)
    # calls of the earlier format (one threshold per model, chosen on training patients)
    old = {"format": 1, **{k: v for k, v in calls.to_json().items() if k != "format"}}
    (centre_dir(tmp_path, 0) / CALLS_FILE).write_text(json.dumps(old))
    record_digest(centre_dir(tmp_path, 0) / CALLS_FILE)
    with pytest.raises(DamagedFileError, match=r"another version.*stage --centers 0"):
        read_centre(tmp_path, 0)


def _every_node(records) -> list[StagingSlide]:  # type: ignore[no-untyped-def]
    """Centre 0's labelled slides, of both its patients (as if both were tested)."""
    return [StagingSlide(r.slide_id, r.path, r.patient_id, r.node_label, r.annotation)
            for r in records if r.node_label]  # fmt: skip


def test_the_threshold_is_the_best_on_the_calibration_nodes_and_the_lowest_on_a_tie(centre) -> None:  # type: ignore[no-untyped-def]
    _, records = centre
    slides = _every_node(records)
    truth_as_map = {"truth": lambda p: np.zeros(len(p))}  # set below, per slide
    mapper = SlideMapper(PARAMS, truth_as_map, 500, NodeThresholds(), 8000.0)
    mapped = [mapper.map_or_failure(s) for s in slides]
    # every map 0.6 where the slide has tumour: only thresholds <= 0.6 find it
    for m in mapped:
        assert isinstance(m, SlideMaps)
        inside = ~np.isnan(m.maps["truth"])
        value = 0.6 if m.slide.truth != "negative" else 0.0
        m.maps["truth"][inside] = value
    threshold, accuracy = choose_threshold(mapped, "truth", [0.9, 0.7, 0.5, 0.3])
    negatives = np.mean([m.slide.truth == "negative" for m in mapped])
    assert accuracy["0.9"] == accuracy["0.7"] == pytest.approx(negatives)  # no lesion found
    # the whole tissue one lesion: the macro nodes right as well as the negative ones
    macro = np.mean([m.slide.truth == "macro" for m in mapped])
    assert accuracy["0.5"] == accuracy["0.3"] == pytest.approx(negatives + macro)
    assert macro > 0 and threshold == 0.3  # a tie: the lowest wins
    assert choose_threshold([], "truth", [0.7, 0.5]) == (0.5, {})


def test_each_patient_is_staged_at_the_threshold_of_the_other_patients(centre) -> None:  # type: ignore[no-untyped-def]
    _, records = centre
    slides = _every_node(records)
    patients = sorted({s.patient for s in slides})
    assert len(patients) == 2
    mapper = SlideMapper(PARAMS, {"model": lambda p: np.zeros(len(p))}, 500,
                         NodeThresholds(), 8000.0)  # fmt: skip
    mapped = [m for m in map(mapper.map_or_failure, slides) if isinstance(m, SlideMaps)]
    assert len(mapped) == len(slides)
    # the first patient's tumour shows at 0.6 and its negative nodes at 0; the second's
    # tumour at 0.95 and its negative nodes at 0.7: alone, each would choose its own
    # threshold (0.5 finds the first's tumour; 0.9 spares the second's negative nodes)
    tumour = {patients[0]: 0.6, patients[1]: 0.95}
    healthy = {patients[0]: 0.0, patients[1]: 0.7}
    for m in mapped:
        inside = ~np.isnan(m.maps["model"])
        level = healthy if m.slide.truth == "negative" else tumour
        m.maps["model"][inside] = level[m.slide.patient]
    candidates = [0.5, 0.9]
    alone = {p: choose_threshold([m for m in mapped if m.slide.patient == p], "model",
                                 candidates)[0] for p in patients}  # fmt: skip
    assert alone == {patients[0]: 0.5, patients[1]: 0.9}
    chosen = cross_fitted_thresholds(mapped, "model", candidates)
    assert {p: t for p, (t, _) in chosen.items()} == {patients[0]: 0.9, patients[1]: 0.5}
    for patient in patients:
        others = [m for m in mapped if m.slide.patient != patient]
        assert chosen[patient] == choose_threshold(others, "model", candidates)
    # a patient's own labels never choose its threshold: relabel them, it does not move
    relabelled = [SlideMaps(StagingSlide(m.slide.slide_id, m.slide.path, m.slide.patient,
                                         "negative"), m.cells, m.maps, m.thresholds)
                  if m.slide.patient == patients[0] else m for m in mapped]  # fmt: skip
    assert cross_fitted_thresholds(relabelled, "model", candidates)[patients[0]] == chosen[
        patients[0]]  # fmt: skip
    calls = centre_calls(0, mapped, [], {"model": "sha256:" + "1" * 64}, candidates)
    assert calls.models["model"]["thresholds"] == {p: t for p, (t, _) in chosen.items()}


def test_an_unreadable_slide_is_recorded_and_the_rest_are_staged(centre, tmp_path) -> None:  # type: ignore[no-untyped-def]
    root, records = centre
    slides = centre_slides(records, store_path(root / "stores", 0))
    victim = slides[0]
    broken = tmp_path / victim.path.name
    shutil.copy(victim.path, broken)
    with broken.open("r+b") as handle:
        handle.seek(0)
        handle.write(b"\x00" * 16)  # not a TIFF any more
    slides[0] = type(victim)(victim.slide_id, broken, victim.patient, victim.truth)
    model = staging_model(root / "runs/Joint/seed_0", "Joint", 0, [0, 1], 0)
    predictors = {model.key: model_predictor(model, torch.device("cpu"), 64)}
    mapper = SlideMapper(PARAMS, predictors, 64, NodeThresholds(), 8000.0)
    outcomes = [mapper.map_or_failure(s) for s in slides]
    assert isinstance(outcomes[0], str) and str(broken) in outcomes[0]
    assert all(isinstance(o, SlideMaps) for o in outcomes[1:])
    mapped = [o for o in outcomes if isinstance(o, SlideMaps)]
    calls = centre_calls(0, mapped, [(slides[0], outcomes[0])], {model.key: model.digest}, [0.5])
    assert calls.failures[0]["slide"] == victim.slide_id
    assert victim.patient in calls.test_patients
    summary = summarise([calls], {r.patient_id: r.patient_stage for r in records},
                        n_resamples=100, seed=0)  # fmt: skip
    entry = summary["methods"][model.key]
    assert entry["n_slides"] == len(mapped)
    # the summary names the model it staged with: shown beside this run while it keeps it
    assert entry["models"] == {"0": model.digest} and model.digest.startswith("sha256:")
    assert staging_of_runs(summary, {model.key: {0: model.digest}})[0] is not None
    _keep(tmp_path / "retrained", "Joint", 0, "local", -1, seed=4)
    retrained = staging_model(tmp_path / "retrained", "Joint", 0, [0, 1], 0)
    assert retrained.digest != model.digest
    assert staging_of_runs(summary, {model.key: {0: retrained.digest}})[0] is None
    table = staging_table(summary)
    assert "Joint/seed_0" in table and victim.slide_id in table


def test_a_centre_is_staged_again_exactly_when_an_input_changed(centre, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from analysis.staging.freshness import CentreInputs, inputs_path, record_inputs, stale_reason
    from camelyon_proxyfl.params.staging import StagingParams

    root, _ = centre
    model = staging_model(root / "runs/Joint/seed_0", "Joint", 0, [0, 1], 0)
    settings = StagingParams().centre_settings()

    def inputs(models: dict[str, str] | None = None, **changed: object) -> CentreInputs:
        return CentreInputs.now(0, {**settings, **changed}, models or {model.key: model.digest},
                                root / "data", store_path(root / "stores", 0))  # fmt: skip

    now = inputs()
    calls = centre_dir(tmp_path, 0) / CALLS_FILE
    assert stale_reason(tmp_path, now) == f"no {calls} yet"
    write_centre(tmp_path, centre_calls(0, [], [], {model.key: model.digest}, [0.5]), [])
    assert stale_reason(tmp_path, now).startswith("no readable record of its inputs")
    record_inputs(tmp_path, now)
    assert stale_reason(tmp_path, inputs()) is None  # the same inputs, computed again
    # the record lies beside the centre's folder, which DVC hashes, not in it
    assert inputs_path(tmp_path, 0).parent == tmp_path
    assert not list(centre_dir(tmp_path, 0).rglob("*.inputs.json"))

    assert stale_reason(tmp_path, inputs(**{"stage.thresholds": [0.7]})) == "its settings changed"
    retrained = {model.key: "sha256:" + "1" * 64}
    assert stale_reason(tmp_path, inputs(retrained)) == "its models changed"
    slide = sorted((root / "data").rglob("*.tif"))[0]
    times = slide.stat()
    try:  # a slide copied or rewritten: its time changed
        os.utime(slide, ns=(times.st_atime_ns, times.st_mtime_ns + 1_000_000_000))
        assert stale_reason(tmp_path, inputs()) == "its slides changed"
    finally:
        os.utime(slide, ns=(times.st_atime_ns, times.st_mtime_ns))
    assert stale_reason(tmp_path, inputs()) is None
    # a map or picture of the folder gone (the report would refuse the staging, naming
    # `camelyon-proxyfl stage` as the repair: that must stage the centre again)
    picture = centre_dir(tmp_path, 0) / "pictures" / "patient_000_node_0.png"
    assert picture.parent.is_dir()  # write_centre made it
    picture.write_bytes(b"\x89PNG")
    record_inputs(tmp_path, inputs())
    assert stale_reason(tmp_path, inputs()) is None
    picture.unlink()
    assert stale_reason(tmp_path, inputs()) == (
        f"{centre_dir(tmp_path, 0)} is not the directory its record describes"
    )
    picture.write_bytes(b"\x89PNG")
    assert stale_reason(tmp_path, inputs()) is None
    calls.write_text(calls.read_text() + " ")  # the calls are not those staged
    assert stale_reason(tmp_path, inputs()) == f"{calls} is not the file its record describes"
