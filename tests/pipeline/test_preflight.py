"""The checks before any work (camelyon_proxyfl.preflight, ``flows.pipeline --check``) on a
real synthetic dataset whose candidates are computed by the real preprocessing steps: the
sizes they plan are the sizes the stores get, and each mistake is found with its reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from camelyon_proxyfl.findings import Finding, errors
from camelyon_proxyfl.params.data import DATA_ROOT_FIX
from camelyon_proxyfl.params.whole import Params
from camelyon_proxyfl.preflight import preflight
from flows.pipeline import main as pipeline_main
from tests.pipeline.conftest import tiny_params_under, write_params
from wsi.cache import CandidateCache
from wsi.catalogue import scan_camelyon
from wsi.preprocess import center_store, slide_patches
from wsi.synth import SynthManifest


def params_with(directory: Path, data_root: Path, **changes: Any) -> Params:
    """The tiny pipeline parameters on ``data_root``, with ``section__key`` changes."""
    document = tiny_params_under(directory, data_root)
    for dotted, value in changes.items():
        *sections, key = dotted.split("__")
        level = document
        for section in sections:
            level = level[section]
        level[key] = value
    return Params.model_validate(document)


def messages(findings: list[Finding], level: str) -> list[str]:
    return [f"{f.subject}: {f.message}" for f in findings if f.level == level]


@pytest.fixture(scope="module")
def root(synthetic_dataset: SynthManifest) -> Path:
    """The session's synthetic dataset: centres 0 and 1, two patients each."""
    return synthetic_dataset.root


@pytest.fixture(scope="module")
def cached(root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory whose candidate cache holds every slide of centres 0 and 1."""
    directory = tmp_path_factory.mktemp("preflight")
    params = params_with(directory, root)
    cache = CandidateCache(params.preprocess.cache_dir)
    for record in scan_camelyon(root).for_centers([0, 1]):
        if record.node_label is not None:
            slide_patches(record, params.preprocess.patch, cache)
    return directory


def test_before_the_cache_sizes_are_bounded_and_said_to_be_unknown(
    root: Path, tmp_path: Path
) -> None:
    findings = preflight(params_with(tmp_path, root))
    assert not errors(findings)
    assert all("candidates are not cached yet" in m for m in messages(findings, "note"))
    # 6 patches per label: no centre can train with a batch of 13 (12 patches at most);
    # Joint can (24 pooled)
    findings = preflight(params_with(tmp_path, root, train__options__batch_size=13))
    assert messages(findings, "error") == [
        "train.options.batch_size: 13 is larger than the 12 patches at most "
        f"(2 × patches_per_class) of centre {c}"
        for c in (0, 1)
    ]


def test_with_the_cache_the_plan_is_the_stores_sizes(root: Path, cached: Path) -> None:
    params = params_with(cached, root)
    findings = preflight(params)
    assert not errors(findings), findings
    planned = messages(findings, "note")
    catalogue = scan_camelyon(root)
    cache = CandidateCache(params.preprocess.cache_dir)
    stored: dict[int, tuple[int, int]] = {}
    for center in (0, 1):
        records = [r for r in catalogue.for_centers([center]) if r.node_label is not None]
        slides = [slide_patches(record, params.preprocess.patch, cache) for record in records]
        report = center_store(center, slides, params.preprocess.patch,
                              params.preprocess.sampling(center), params.preprocess.out,
                              records=records)  # fmt: skip
        train, test = (sum(report.counts[split].values()) for split in ("train", "test"))
        assert (f"centre {center}: {train} training and {test} test patches (planned from "
                f"the cached candidates of its {len(records)} slides)") in planned  # fmt: skip
        stored[center] = (train, test)

    # without the cache, the sizes of the stores built with these parameters; a store built
    # with other parameters (another seed) is not taken for the one to come
    empty = str(cached / "empty-cache")
    notes = messages(preflight(params_with(cached, root, preprocess__cache_dir=empty)), "note")
    for center, (train, test) in stored.items():
        assert any(note.startswith(f"centre {center}: ") and note.endswith(
            f"its current store holds {train} training, {test} test patches") for note in notes
        ), notes  # fmt: skip
    other = preflight(params_with(cached, root, preprocess__cache_dir=empty, preprocess__seed=1))
    assert not any("current store" in note for note in messages(other, "note"))


def test_mistakes_are_errors_naming_key_centre_and_numbers(root: Path, cached: Path) -> None:
    def found(**changes: Any) -> list[str]:
        return messages(preflight(params_with(cached, root, **changes)), "error")

    short = found(preprocess__patches_per_class={0: 6, 1: 100000})
    assert len(short) == 1 and short[0].startswith("centre 1: can supply only ")
    assert "100000 of each requested" in short[0]

    smallest = min(int(m.split(": ")[1].split()[0]) for m in messages(
        preflight(params_with(cached, root)), "note"))  # fmt: skip
    too_big = found(train__options__batch_size=smallest + 1)
    assert too_big and all(
        m.startswith(f"train.options.batch_size: {smallest + 1} is larger than the ")
        and m.endswith(("training patches of centre 0", "training patches of centre 1"))
        for m in too_big
    ), too_big

    public = found(preprocess__centers=[0, 1, 9], preprocess__patches_per_class=6)
    assert public == ["preprocess.centers: centre 9 has no labelled slide under "
                      f"{root} (centres with labelled slides: [0, 1])"]  # fmt: skip

    pool = found(train__algorithms=["PrivateKT"], train__centers=[0],
                 train__options__public_pool="center", train__options__public_center=1,
                 train__options__kt_samples=10**6)  # fmt: skip
    assert len(pool) == 1 and pool[0].startswith("train.options.kt_samples: 1000000 is larger ")
    assert pool[0].endswith("items of the public pool (centre 1)")
    share = found(
        train__algorithms=["PrivateKT"], train__centers=[0], train__options__kt_samples=10**6
    )  # the paper's pool: 20 % of centre 0's
    assert len(share) == 1 and share[0].startswith("train.options.kt_samples: 1000000 is ")
    assert share[0].endswith("(a share 0.2 of centres [0]' training splits)")


def test_a_missing_data_root_is_an_error_unless_it_is_the_synthetic_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = preflight(params_with(tmp_path, tmp_path / "nowhere"))
    assert messages(missing, "error") == [
        f"data.root: {tmp_path / 'nowhere'}: no such directory; {DATA_ROOT_FIX}"
    ]
    monkeypatch.chdir(tmp_path)  # data/synthetic, relative to the working directory
    synthetic = preflight(params_with(tmp_path, Path("data/synthetic")))
    assert not errors(synthetic)
    assert "the pipeline writes the synthetic dataset first" in messages(synthetic, "note")[0]


def test_where_training_would_run_is_checked_with_the_rest(tmp_path: Path) -> None:
    """A hostfile that is not there is found before any work, like a missing data root."""
    hosts = tmp_path / "hosts.txt"
    findings = preflight(params_with(tmp_path, tmp_path / "nowhere", train__hostfile=hosts))
    missing = f"train.hostfile: {hosts}: no such file"
    assert any(m.startswith(missing) for m in messages(findings, "error")), findings
    hosts.write_text("node-a:2\nnode-b:2\n")
    findings = preflight(params_with(tmp_path, tmp_path / "nowhere", train__hostfile=hosts))
    assert not [f for f in findings if f.subject == "train.hostfile"]


def test_check_flag_runs_only_the_checks_and_exits_2_on_errors(
    root: Path, cached: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = write_params(cached / "good.yaml", tiny_params_under(cached, root))
    assert pipeline_main(["--config", str(good), "--check"]) == 0
    assert "0 error(s)" in capsys.readouterr().out
    document = tiny_params_under(cached, root)
    document["train"]["options"]["batch_size"] = 10**5
    bad = write_params(cached / "bad.yaml", document)
    assert pipeline_main(["--config", str(bad), "--check"]) == 2
    out = capsys.readouterr().out
    assert "error: train.options.batch_size: 100000 is larger than the " in out
    assert "3 error(s)" in out  # centre 0, centre 1, Joint's pooled centres
    assert not (cached / "runs").exists() and not (cached / "results").exists()
