"""The Camelyon-17 catalogue: which slides a dataset root holds, and what is known of each.

Layout scanned (the challenge's, as unzipped; the flat variant works too)::

    ROOT/center_{c}/patient_{ppp}/patient_{ppp}_node_{n}.tif
    ROOT/center_{c}/patient_{ppp}_node_{n}.tif
    ROOT/lesion_annotations/patient_{ppp}_node_{n}.xml
    ROOT/stage_labels.csv      "patient,stage" (optionally a "center" column)

``stage_labels.csv`` has a row ``patient_XXX.zip,<pN stage>`` per patient and a row
``patient_XXX_node_Y.tif,<negative|itc|micro|macro>`` per slide. A slide's centre is the
labels file's ``center`` column when it has one, else the ``center_{c}`` folder it sits
in, else ``patient // 20``. Every inconsistency becomes a :class:`CatalogueProblem`
with the file and line it concerns; none stops the scan of the rest.
"""

from __future__ import annotations

import csv
import io
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from plumbing.errors import PipelineError
from plumbing.fingerprints import file_identities, walk_folders
from wsi.nodes import NODE_LABELS, PATIENT_STAGES, patient_stage

PATIENTS_PER_CENTER = 20
LABELS_FILE = "stage_labels.csv"
ANNOTATIONS_DIR = "lesion_annotations"

_SLIDE_NAME = re.compile(r"^patient_(\d{3})_node_(\d+)$")
_PATIENT_NAME = re.compile(r"^patient_(\d{3})$")
_CENTER_DIR = re.compile(r"^center_(\d+)$")
_SLIDE_SUFFIXES = (".tif", ".tiff")
_ROW_SUFFIX = re.compile(r"\.(zip|tiff?)$", re.IGNORECASE)  # a row's patient or slide name


def source_identities(data_root: str | os.PathLike[str], center: int) -> dict[str, list[int]]:
    """``{relative path: [size, mtime_ns]}`` of every file of the dataset a centre's
    artefacts are made from (its slides, the annotations, the stage labels), read without
    opening them; absent ones are left out. The freshness records of the stores
    (:mod:`wsi.freshness`) and of the staging (:mod:`analysis.staging.freshness`) hold it."""
    root = Path(data_root)
    return file_identities(
        root, (root / f"center_{center}", root / ANNOTATIONS_DIR, root / LABELS_FILE)
    )


@dataclass(frozen=True)
class SlideRecord:
    """One slide and what the dataset says about it."""

    slide_id: str
    path: Path
    patient: int
    node: int
    center: int
    node_label: str | None
    patient_stage: str | None
    annotation: Path | None

    @property
    def patient_id(self) -> str:
        return f"patient_{self.patient:03d}"


@dataclass(frozen=True)
class CatalogueProblem:
    """An inconsistency found while scanning: the file, the line (if any), what is wrong,
    and the centre it concerns when that is known."""

    path: Path
    line: int | None
    message: str
    center: int | None = None

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line is not None else str(self.path)
        return f"{where}: {self.message}"


@dataclass
class Catalogue:
    """All slides found under ``root``, sorted by slide id, and the problems met."""

    root: Path
    slides: list[SlideRecord] = field(default_factory=list)
    problems: list[CatalogueProblem] = field(default_factory=list)

    def for_centers(self, centers: Iterable[int]) -> list[SlideRecord]:
        wanted = set(centers)
        return [slide for slide in self.slides if slide.center in wanted]

    @property
    def centers(self) -> list[int]:
        return sorted({slide.center for slide in self.slides})

    def unlabelled_centre_reason(self, center: int) -> str | None:
        """Why ``center`` cannot be preprocessed from this dataset (no slide of it has a
        label), or ``None``: the one check of a centre a command is asked for, made before
        any work (``preprocess``, ``pipeline --check``)."""
        labelled = sorted({slide.center for slide in self.slides if slide.node_label is not None})
        if center in labelled:
            return None
        return (f"centre {center} has no labelled slide under {self.root} (centres with "
                f"labelled slides: {labelled})")  # fmt: skip

    def get(self, slide_id: str) -> SlideRecord:
        for slide in self.slides:
            if slide.slide_id == slide_id:
                return slide
        raise KeyError(f"no slide {slide_id!r} under {self.root}")


@dataclass
class _Labels:
    nodes: dict[str, str] = field(default_factory=dict)
    patients: dict[int, str] = field(default_factory=dict)
    center_of_patient: dict[int, int] = field(default_factory=dict)
    node_lines: dict[str, int] = field(default_factory=dict)
    stage_lines: dict[int, int] = field(default_factory=dict)


def _read_labels(path: Path, problems: list[CatalogueProblem]) -> _Labels:
    labels = _Labels()
    if not path.is_file():
        problems.append(CatalogueProblem(path, None, "labels file not found; slides unlabelled"))
        return labels
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as error:  # a spreadsheet's "Unicode text" is UTF-16
        problems.append(CatalogueProblem(
            path, None, f"not UTF-8 text (byte {error.start}): save it as CSV UTF-8; slides "
            "unlabelled"))  # fmt: skip
        return labels
    with io.StringIO(text, newline="") as handle:
        reader = csv.reader(handle)
        header = [cell.strip().lower() for cell in next(reader, [])]
        if header[:2] != ["patient", "stage"]:
            problems.append(
                CatalogueProblem(path, 1, f"header is {header}, expected 'patient,stage'")
            )
            return labels
        center_column = header.index("center") if "center" in header else None
        for row in reader:
            line = reader.line_num
            if not any(cell.strip() for cell in row):
                continue
            if len(row) < 2:
                problems.append(CatalogueProblem(path, line, f"unparseable row {row}"))
                continue
            name, value = row[0].strip(), row[1].strip()
            stem = _ROW_SUFFIX.sub("", name)
            slide_match = _SLIDE_NAME.match(stem)
            patient_match = _PATIENT_NAME.match(stem)
            if slide_match and value in NODE_LABELS:
                if stem in labels.nodes:
                    problems.append(CatalogueProblem(path, line, f"{stem} labelled twice"))
                    continue
                labels.nodes[stem] = value
                labels.node_lines[stem] = line
            elif patient_match and value in PATIENT_STAGES:
                patient = int(patient_match.group(1))
                if patient in labels.patients:
                    problems.append(CatalogueProblem(
                        path, line, f"{stem} staged twice (line {labels.stage_lines[patient]}: "
                        f"{labels.patients[patient]}); this row ignored"))  # fmt: skip
                    continue
                labels.patients[patient] = value
                labels.stage_lines[patient] = line
            else:
                problems.append(CatalogueProblem(path, line, f"unparseable row {','.join(row)!r}"))
                continue
            if center_column is not None:
                patient = int((slide_match or patient_match).group(1))  # type: ignore[union-attr]
                try:
                    center = int(row[center_column])
                except (IndexError, ValueError):
                    problems.append(CatalogueProblem(path, line, "missing or bad center value"))
                    continue
                known = labels.center_of_patient.setdefault(patient, center)
                if known != center:
                    problems.append(CatalogueProblem(
                        path, line, f"center {center} for patient_{patient:03d}, whose earlier "
                        f"rows say {known}; {known} kept"))  # fmt: skip
    return labels


def _stages_unlike_their_nodes(labels: _Labels) -> list[tuple[int, str, int, str]]:
    """(patient, its stage, the stage's line, the stage its node rows give) for every
    staged patient with node rows whose stage is not theirs by the challenge's rule."""
    nodes_of: dict[int, list[str]] = {}
    for stem, node_label in labels.nodes.items():
        nodes_of.setdefault(int(stem[len("patient_") : len("patient_000")]), []).append(node_label)
    unlike = []
    for patient, stage in sorted(labels.patients.items()):
        if patient in nodes_of and patient_stage(nodes_of[patient]) != stage:
            unlike.append((patient, stage, labels.stage_lines[patient],
                           patient_stage(nodes_of[patient])))  # fmt: skip
    return unlike


def _find_slides(root: Path) -> list[tuple[Path, int | None]]:
    """(slide path, centre folder number or None) for every slide file below ``root``."""
    found = []
    for here, filenames in walk_folders(root):
        center = None
        for part in (here.name, here.parent.name):
            match = _CENTER_DIR.match(part)
            if match:
                center = int(match.group(1))
                break
        for filename in filenames:
            if filename.lower().endswith(_SLIDE_SUFFIXES):
                found.append((here / filename, center))
    return found


def _find_annotations(folder: Path, problems: list[CatalogueProblem]) -> dict[str, Path]:
    """Every ASAP file below ``folder`` by its stem (``.xml`` in any case; an archive
    unzipped into a folder of its own name lies a level down); one stem twice is a
    problem, the first kept."""
    found: dict[str, Path] = {}
    if not folder.is_dir():
        return found
    for here, filenames in walk_folders(folder):
        for filename in filenames:
            path = here / filename
            if path.suffix.lower() != ".xml":
                continue
            if path.stem in found:
                problems.append(
                    CatalogueProblem(path, None, f"duplicate of {found[path.stem]}; skipped")
                )
                continue
            found[path.stem] = path
    return found


def _center_of_name(stem: str, center_of_patient: dict[int, int]) -> int | None:
    """The centre of a slide known only by name: the labels file's, else ``patient // 20``."""
    match = _SLIDE_NAME.match(stem)
    if match is None:
        return None
    patient = int(match.group(1))
    return center_of_patient.get(patient, patient // PATIENTS_PER_CENTER)


class DatasetRootError(PipelineError):
    """The dataset root is not a Camelyon-17 dataset at all (missing, or without the labels
    file or any slide): nothing can be preprocessed from it."""


def check_dataset_root(root: str | os.PathLike[str]) -> None:
    """Raise :class:`DatasetRootError` unless ``root`` is a directory with the labels file
    and at least one slide file; problems of single files are :func:`scan_camelyon`'s."""
    root = Path(root)
    if not root.is_dir():
        reason = "exists but is not a directory" if root.exists() else "no such directory"
        raise DatasetRootError(root, reason)
    if not (root / LABELS_FILE).is_file():
        raise DatasetRootError(root, f"no {LABELS_FILE}: not a Camelyon-17 dataset root")
    if not _find_slides(root):
        raise DatasetRootError(root, "holds no slide files (*.tif, *.tiff)")


def scan_camelyon(root: str | os.PathLike[str]) -> Catalogue:
    """Scan a Camelyon-17 dataset root. Never raises for content problems; see ``problems``."""
    root = Path(root)
    catalogue = Catalogue(root=root)
    problems = catalogue.problems
    if not root.is_dir():
        problems.append(CatalogueProblem(root, None, "dataset root is not a directory"))
        return catalogue
    labels_path = root / LABELS_FILE
    labels = _read_labels(labels_path, problems)

    annotations = _find_annotations(root / ANNOTATIONS_DIR, problems)

    seen: dict[str, Path] = {}
    for path, folder_center in _find_slides(root):
        stem = path.stem
        match = _SLIDE_NAME.match(stem)
        if match is None:
            problems.append(CatalogueProblem(path, None, "not named patient_XXX_node_Y; skipped"))
            continue
        if stem in seen:
            problems.append(CatalogueProblem(path, None, f"duplicate of {seen[stem]}; skipped"))
            continue
        seen[stem] = path
        patient, node = int(match.group(1)), int(match.group(2))
        center = labels.center_of_patient.get(patient, folder_center)
        if center is None:
            center = patient // PATIENTS_PER_CENTER
        elif folder_center is not None and folder_center != center:
            problems.append(
                CatalogueProblem(
                    path,
                    None,
                    f"in center_{folder_center} but the labels file says {center}",
                    center,
                )
            )
        node_label = labels.nodes.get(stem)
        if node_label is None and labels_path.is_file():
            problems.append(
                CatalogueProblem(path, None, f"no row for {stem} in {LABELS_FILE}", center)
            )
        catalogue.slides.append(
            SlideRecord(
                slide_id=stem,
                path=path,
                patient=patient,
                node=node,
                center=center,
                node_label=node_label,
                patient_stage=labels.patients.get(patient),
                annotation=annotations.get(stem),
            )
        )

    for patient, stage, line, derived in _stages_unlike_their_nodes(labels):
        problems.append(CatalogueProblem(
            labels_path, line, f"patient_{patient:03d} is staged {stage}, but its node rows "
            f"give {derived} (the challenge's rule: wsi.nodes.patient_stage)",
            labels.center_of_patient.get(patient, patient // PATIENTS_PER_CENTER)))  # fmt: skip
    for stem, line in sorted(labels.node_lines.items(), key=lambda item: item[1]):
        if stem not in seen:
            problems.append(
                CatalogueProblem(
                    labels_path, line, f"label for missing slide {stem}",
                    _center_of_name(stem, labels.center_of_patient),
                )
            )  # fmt: skip
    for stem, path in annotations.items():
        if stem not in seen:
            problems.append(
                CatalogueProblem(
                    path, None, f"annotation for unknown slide {stem}",
                    _center_of_name(stem, labels.center_of_patient),
                )
            )  # fmt: skip
    for slide in catalogue.slides:
        if slide.annotation is not None and slide.node_label == "negative":
            problems.append(
                CatalogueProblem(
                    slide.annotation, None, f"{slide.slide_id} is labelled negative", slide.center
                )
            )
    catalogue.slides.sort(key=lambda slide: slide.slide_id)
    return catalogue
