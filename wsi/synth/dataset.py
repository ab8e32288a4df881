"""Writing a whole dataset: slides in a process pool, annotations, stage labels."""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from plumbing.atomic import write_bytes
from wsi.annotations import write_asap_xml
from wsi.catalogue import ANNOTATIONS_DIR, LABELS_FILE, PATIENTS_PER_CENTER
from wsi.nodes import node_label, patient_stage
from wsi.synth.config import CARVE_OUT_GROUP, TUMOUR_GROUP, Layout, SynthConfig
from wsi.synth.plan import plan_slide
from wsi.synth.render import render_slide_bands
from wsi.synth.rules import assign_cohort, slide_id
from wsi.synth.tiff import write_pyramidal_tiff

log = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class SynthSlide:
    """One generated slide: where it is, its label, and the lesions drawn on it."""

    center: int
    patient: int
    node: int
    label: str
    slide_path: Path
    annotation_path: Path | None
    metastases: tuple[np.ndarray, ...]
    carve_outs: tuple[np.ndarray, ...]
    largest_extent_um: float
    tissue_fraction: float

    @property
    def slide_id(self) -> str:
        return slide_id(self.patient, self.node)


@dataclass(frozen=True)
class SynthManifest:
    """What :func:`generate_dataset` wrote."""

    root: Path
    config: SynthConfig
    slides: tuple[SynthSlide, ...]
    stages: Mapping[int, str]
    stage_labels_path: Path
    seconds: float = 0.0

    def for_center(self, center: int) -> list[SynthSlide]:
        return [s for s in self.slides if s.center == center]

    def by_id(self) -> dict[str, SynthSlide]:
        return {s.slide_id: s for s in self.slides}


# --------------------------------------------------------------------------------------
# The dataset
# --------------------------------------------------------------------------------------


def slide_path(root: Path, patient: int, node: int, layout: Layout) -> Path:
    center_dir = root / f"center_{patient // PATIENTS_PER_CENTER}"
    name = f"{slide_id(patient, node)}.tif"
    if layout == "flat":
        return center_dir / name
    return center_dir / f"patient_{patient:03d}" / name


def annotation_path(root: Path, patient: int, node: int) -> Path:
    return root / ANNOTATIONS_DIR / f"{slide_id(patient, node)}.xml"


@dataclass(frozen=True)
class _SlideTask:
    root: Path
    config: SynthConfig
    patient: int
    node: int
    label: str


def generate_slide(task: _SlideTask) -> SynthSlide:
    """Plan, render and write one slide (and its annotation when it has lesions)."""
    config = task.config
    plan = plan_slide(config, task.patient, task.node, task.label)
    extent_um = max((lesion.extent_px for lesion in plan.lesions), default=None)
    extent_um = None if extent_um is None else extent_um * config.mpp
    label = node_label(extent_um, config.thresholds)
    if label != task.label:  # cannot happen: extents are drawn inside the label's range
        raise RuntimeError(f"{slide_id(task.patient, task.node)}: drew {label}, not {task.label}")
    path = slide_path(task.root, task.patient, task.node, config.layout)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_pyramidal_tiff(
        path,
        render_slide_bands(plan, config.tile_size),
        shape=(config.height, config.width),
        mpp=config.mpp,
        tile_size=config.tile_size,
        levels=config.level_count,
        description=(
            f"Synthetic Camelyon-17-like slide {slide_id(task.patient, task.node)} "
            f"(wsi.synth, seed {config.seed}); level-0 mpp {config.mpp}"
        ),
        jpeg_quality=config.jpeg_quality,
    )
    xml_path = None
    if plan.lesions:
        xml_path = annotation_path(task.root, task.patient, task.node)
        xml_path.parent.mkdir(parents=True, exist_ok=True)
        groups = {TUMOUR_GROUP: list(plan.metastases)}
        if plan.carve_outs:
            groups[CARVE_OUT_GROUP] = list(plan.carve_outs)
        write_asap_xml(xml_path, groups)
    return SynthSlide(
        center=plan.center,
        patient=task.patient,
        node=task.node,
        label=label,
        slide_path=path,
        annotation_path=xml_path,
        metastases=plan.metastases,
        carve_outs=plan.carve_outs,
        largest_extent_um=0.0 if extent_um is None else float(extent_um),
        tissue_fraction=float((plan.tissue_field > 0).mean()),
    )


def stage_labels_text(labels: Mapping[int, Sequence[str]]) -> str:
    """``stage_labels.csv`` for {patient: node labels}: a patient row, then its nodes."""
    lines = ["patient,stage"]
    for patient in sorted(labels):
        lines.append(f"patient_{patient:03d}.zip,{patient_stage(labels[patient])}")
        lines.extend(
            f"{slide_id(patient, node)}.tif,{label}" for node, label in enumerate(labels[patient])
        )
    return "\n".join(lines) + "\n"


def dataset_is_written(root: str | os.PathLike[str]) -> bool:
    """Whether ``root`` holds a whole generated dataset: :func:`generate_dataset` writes the
    labels file last, once every slide and annotation is in place."""
    return (Path(root) / LABELS_FILE).is_file()


def generate_dataset(
    out: str | os.PathLike[str],
    config: SynthConfig,
    *,
    workers: int = 1,
    on_slide: Callable[[SynthSlide], None] | None = None,
) -> SynthManifest:
    """Write a synthetic Camelyon-17 dataset under ``out``; see the module docstring.

    ``workers`` > 1 renders slides in a process pool (the output does not change).
    ``on_slide`` is called in this process after each slide is written. Existing files of
    the same names are replaced; other files under ``out`` are left alone.
    """
    started = time.perf_counter()
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    labels = assign_cohort(config)
    tasks = [
        _SlideTask(root, config, patient, node, label)
        for patient, node_labels in labels.items()
        for node, label in enumerate(node_labels)
    ]
    slides: list[SynthSlide] = []

    def done(slide: SynthSlide) -> None:
        slides.append(slide)
        log.debug("wrote %s (%s)", slide.slide_path, slide.label)
        if on_slide is not None:
            on_slide(slide)

    if workers > 1 and len(tasks) > 1:
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(min(workers, len(tasks)), mp_context=context) as pool:
            for slide in pool.map(generate_slide, tasks):
                done(slide)
    else:
        for task in tasks:
            done(generate_slide(task))

    stage_labels_path = root / LABELS_FILE
    write_bytes(stage_labels_path, stage_labels_text(labels).encode("ascii"))
    slides.sort(key=lambda s: (s.patient, s.node))
    return SynthManifest(
        root=root,
        config=config,
        slides=tuple(slides),
        stages={patient: patient_stage(node_labels) for patient, node_labels in labels.items()},
        stage_labels_path=stage_labels_path,
        seconds=time.perf_counter() - started,
    )
