"""One centre's staging, within its own folder: maps of its test patients' slides by its
models, a threshold per model and patient chosen on the centre's other test patients, node
calls.

**Which slides.** The centre's store says which patients are tested (its test split);
each of their labelled slides in the catalogue is mapped (:mod:`wsi.heatmap`), by every
model at once. The training patients' slides are not: a model is confident on the
patients it trained on, and a threshold chosen there overfits them (the most confident
models chose 0.95 and called the fewest nodes right).

**The threshold** that stages test patient ``p`` is *cross-fitted*: the candidate
(``stage.thresholds``) whose lesions give the most nodes of the centre's *other* test
patients their true class (:func:`choose_threshold`; on a tie, the lowest: the most
sensitive); with no other test patient, the lowest candidate. So no patient's own labels
choose its call, and no patient the model trained on chooses any: leave-one-patient-out
over patients the model never saw, rather than a validation split that would take
patients from training in centres of a few (the demo's three). It is chosen per centre
and model, since each hospital stages with its own.

**The calls.** On each test slide: the node's true class (the labels file), the class of
its map's largest lesion at the model's threshold, the extent of that lesion and the
slide's score (its largest probability). The node thresholds are the challenge's,
scaled to the slide's section (:meth:`wsi.nodes.NodeThresholds.scaled_to`: synthetic
slides are smaller than real ones).

**Files**, all under ``STAGING/center_{c}/`` (no slide, patch or map leaves it):
``{ALGORITHM}/seed_{S}/{slide_id}.h5``, the test slides' maps (:func:`wsi.heatmap.
write_map`); ``pictures/{slide_id}.png``, each test slide with every model's map
(:mod:`analysis.staging.pictures`); and ``calls.json`` (:data:`CALLS_FILE`): per model each
test patient's threshold, the node accuracy of each candidate on the patients that chose
it, and the calls, the slides that could not be mapped with the reason, the pictures;
written last, atomically, with its digest.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from analysis.report.staging import NodeCall
from plumbing.atomic import write_bytes, write_json
from plumbing.verified import DamagedFileError, record_digest, verify
from wsi.catalogue import SlideRecord
from wsi.heatmap import Predictor, SlideCells, TumourMap, predict_cells, slide_cells, write_map
from wsi.lesions import largest_lesion_um
from wsi.nodes import NodeThresholds, node_label
from wsi.params import PatchParams
from wsi.patches import failure_reason
from wsi.slide import Backend, open_slide
from wsi.store.reader import read_store_info

log = logging.getLogger(__name__)

CALLS_FILE = "calls.json"
CALLS_FORMAT = 2
PICTURES_DIR = "pictures"


def centre_dir(staging_dir: str | Path, center: int) -> Path:
    return Path(staging_dir) / f"center_{center}"


def map_path(staging_dir: str | Path, center: int, model_key: str, slide_id: str) -> Path:
    return centre_dir(staging_dir, center) / model_key / f"{slide_id}.h5"


@dataclass(frozen=True)
class StagingSlide:
    """A labelled slide of a test patient of the centre."""

    slide_id: str
    path: Path
    patient: str
    truth: str  # its node class in the labels file
    annotation: Path | None = None  # its lesions' ASAP file, where it has one


def centre_slides(records: Sequence[SlideRecord], store: str | Path) -> list[StagingSlide]:
    """The labelled slides of ``records`` (one centre's catalogue) whose patient is in the
    test split of the centre's ``store``, sorted by slide id."""
    tested = set(read_store_info(store, ("test",)).splits["test"].patients)
    slides = [StagingSlide(r.slide_id, r.path, r.patient_id, r.node_label, r.annotation)
              for r in records if r.node_label is not None and r.patient_id in tested]  # fmt: skip
    return sorted(slides, key=lambda s: s.slide_id)


@dataclass(frozen=True)
class SlideMaps:
    """One slide mapped by every model: the maps, the cells and the slide's thresholds."""

    slide: StagingSlide
    cells: SlideCells
    maps: dict[str, np.ndarray]  # model key -> float32 (rows, cols), NaN: not predicted
    thresholds: NodeThresholds

    def largest_lesion_um(self, model_key: str, threshold: float) -> float | None:
        return largest_lesion_um(self.maps[model_key], threshold, self.cells.cell_um)

    def node_label(self, model_key: str, threshold: float) -> str:
        return node_label(self.largest_lesion_um(model_key, threshold), self.thresholds)

    def score(self, model_key: str) -> float:
        """The slide's largest probability of tumour (0 where nothing was predicted)."""
        values = self.maps[model_key]
        return float(np.nanmax(values)) if np.isfinite(values).any() else 0.0


@dataclass(frozen=True)
class SlideMapper:
    """How a centre's slides are mapped: the patch geometry (preprocessing's), its models'
    predictors, the batch, and the node rule's thresholds for a real-size section."""

    params: PatchParams
    predictors: Mapping[str, Predictor]
    batch_size: int
    thresholds: NodeThresholds
    reference_um: float
    backend: Backend = "auto"

    def map(self, slide: StagingSlide) -> SlideMaps:
        """Every model's map of ``slide``, with the node thresholds of its section."""
        cells = slide_cells(slide.path, self.params, self.backend)
        maps = predict_cells(slide.path, cells, self.params, self.predictors,
                             batch_size=self.batch_size, backend=self.backend)  # fmt: skip
        thresholds = self.thresholds.scaled_to(cells.short_side_um, self.reference_um)
        return SlideMaps(slide, cells, maps, thresholds)

    def map_or_failure(self, slide: StagingSlide) -> SlideMaps | str:
        """:meth:`map`, or why it failed: any failure of one slide (a file that cannot be
        read, no tissue, out of memory) is that slide's, and the others go on."""
        try:
            return self.map(slide)
        except Exception as error:
            log.warning("%s: not mapped: %s", slide.slide_id, failure_reason(error))
            return failure_reason(error)


def choose_threshold(
    calibration: Sequence[SlideMaps], model_key: str, candidates: Sequence[float]
) -> tuple[float, dict[str, float]]:
    """``(threshold, {candidate: node accuracy on the calibration slides})``: the
    candidate giving the most calibration nodes their true class, the lowest on a tie;
    the lowest candidate, and no accuracy, when there is no calibration slide."""
    ordered = sorted(candidates)
    if not calibration:
        return ordered[0], {}
    accuracy = {}
    for candidate in ordered:
        right = [m.node_label(model_key, candidate) == m.slide.truth for m in calibration]
        accuracy[f"{candidate:g}"] = float(np.mean(right))
    best = max(accuracy.values())
    return next(c for c in ordered if accuracy[f"{c:g}"] == best), accuracy


def cross_fitted_thresholds(
    tested: Sequence[SlideMaps], model_key: str, candidates: Sequence[float]
) -> dict[str, tuple[float, dict[str, float]]]:
    """Per test patient, :func:`choose_threshold` on the slides of the others (the module
    docstring): ``{patient: (threshold, {candidate: accuracy})}``."""
    patients = sorted({m.slide.patient for m in tested})
    return {p: choose_threshold([m for m in tested if m.slide.patient != p], model_key,
                                candidates) for p in patients}  # fmt: skip


@dataclass
class CentreCalls:
    """What a centre's staging gives, ``calls.json``'s content."""

    center: int
    models: dict[str, dict[str, Any]] = field(default_factory=dict)
    failures: list[dict[str, str]] = field(default_factory=list)
    test_patients: list[str] = field(default_factory=list)
    pictures: dict[str, str] = field(default_factory=dict)  # slide -> PNG, in the folder

    def calls_of(self, model_key: str) -> list[NodeCall]:
        return [NodeCall(**call) for call in self.models[model_key]["calls"]]

    def to_json(self) -> dict[str, Any]:
        return {"format": CALLS_FORMAT, **asdict(self)}


def centre_calls(
    center: int,
    mapped: Sequence[SlideMaps],
    failures: Sequence[tuple[StagingSlide, str]],
    digests: Mapping[str, str],
    candidates: Sequence[float],
) -> CentreCalls:
    """Each model's thresholds (cross-fitted over the test patients) and calls."""
    result = CentreCalls(
        center=center,
        failures=[
            {"slide": s.slide_id, "patient": s.patient, "reason": why} for s, why in failures
        ],
        test_patients=sorted({m.slide.patient for m in mapped} | {s.patient for s, _ in failures}),
    )
    for key, digest in digests.items():
        chosen = cross_fitted_thresholds(mapped, key, candidates)
        calls = []
        for m in mapped:
            extent = m.largest_lesion_um(key, chosen[m.slide.patient][0])
            call = NodeCall(m.slide.patient, m.slide.slide_id, m.slide.truth,
                            node_label(extent, m.thresholds), m.score(key), extent)  # fmt: skip
            calls.append(asdict(call))
        result.models[key] = {
            "model": digest,
            "thresholds": {patient: threshold for patient, (threshold, _) in chosen.items()},
            "calibration_accuracy": {
                patient: accuracy for patient, (_, accuracy) in chosen.items()
            },
            "calls": calls,
        }
    return result


def slide_picture_png(m: SlideMaps, calls: CentreCalls, backend: Backend = "auto") -> bytes:
    """:func:`~analysis.staging.pictures.slide_picture` of a test slide: the slide with its
    annotated lesions, and each model's map, threshold and call."""
    from analysis.staging.pictures import Panel, panel_titles, picture_downsample, slide_picture
    from wsi.annotations import read_asap

    with open_slide(m.slide.path, backend) as handle:
        downsample = picture_downsample(handle.dimensions)
        thumbnail = handle.thumbnail_at_downsample(downsample)
    annotation = m.slide.annotation
    lesions = [r.vertices for r in read_asap(annotation).tumor] if annotation else []
    titles = panel_titles(list(m.maps))
    panels = []
    for key, probability in m.maps.items():
        call = next(c for c in calls.models[key]["calls"] if c["slide_id"] == m.slide.slide_id)
        threshold = calls.models[key]["thresholds"][m.slide.patient]
        panels.append(Panel(titles[key], probability, threshold, call["predicted"]))
    title = f"{m.slide.slide_id} (centre {calls.center})"
    return slide_picture(thumbnail, downsample, lesions, m.slide.truth, m.cells.extent,
                         panels, title)  # fmt: skip


def write_centre(
    staging_dir: str | Path,
    calls: CentreCalls,
    mapped: Sequence[SlideMaps],
    backend: Backend = "auto",
) -> Path:
    """The test slides' maps and pictures, then ``calls.json`` (last: it says the centre
    is whole)."""
    folder = centre_dir(staging_dir, calls.center)
    (folder / PICTURES_DIR).mkdir(parents=True, exist_ok=True)
    for m in mapped:
        for key, probability in m.maps.items():
            write_map(map_path(staging_dir, calls.center, key, m.slide.slide_id),
                      TumourMap(m.slide.slide_id, probability, m.cells.tissue_fraction,
                                m.cells.cell_um, m.cells.extent,
                                calls.models[key]["model"]))  # fmt: skip
        picture = Path(PICTURES_DIR) / f"{m.slide.slide_id}.png"
        write_bytes(folder / picture, slide_picture_png(m, calls, backend))
        calls.pictures[m.slide.slide_id] = picture.as_posix()
    path = folder / CALLS_FILE
    write_json(path, calls.to_json())
    record_digest(path)
    return path


def read_centre(staging_dir: str | Path, center: int) -> CentreCalls:
    """A centre's ``calls.json``, verified (a :class:`~plumbing.verified.DamagedFileError`
    names it, and the command that stages the centre again)."""
    path = centre_dir(staging_dir, center) / CALLS_FILE
    again = f"stage the centre again: `camelyon-proxyfl stage --centers {center}`"
    verify(path, again)
    content = json.loads(path.read_text())
    if content.pop("format", None) != CALLS_FORMAT:
        raise DamagedFileError(path, f"written by another version (not format {CALLS_FORMAT})",
                               again)  # fmt: skip
    return CentreCalls(**content)
