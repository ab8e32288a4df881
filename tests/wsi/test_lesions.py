"""Lesions from a map: connected regions, their Feret extents, the node's class; checked
against brute force and against the synthetic slides' own labels with the ground truth as
the map."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import ndimage

from wsi.annotations import read_asap
from wsi.catalogue import scan_camelyon
from wsi.lesions import largest_lesion_um, lesion_extents, lesion_labels, node_label_of_map
from wsi.masks import tumor_mask
from wsi.nodes import NodeThresholds, patient_stage


def _brute_force_extents(mask: np.ndarray, cell_um: float) -> list[float]:
    """Every pair of corners of every cell of each 8-connected region."""
    labels, count = ndimage.label(mask, structure=np.ones((3, 3)))
    extents = []
    for index in range(1, count + 1):
        corners = {(r + dr, c + dc) for r, c in np.argwhere(labels == index)
                   for dr, dc in itertools.product((0, 1), repeat=2)}  # fmt: skip
        points = np.array(sorted(corners), dtype=float)
        extents.append(max(np.hypot(*(a - b)) for a in points for b in points) * cell_um)
    return sorted(extents, reverse=True)


def test_extents_are_those_of_the_cells_union_by_brute_force() -> None:
    rng = np.random.default_rng(0)
    for trial in range(40):
        mask = rng.random((9, 11)) < (0.15 + 0.02 * trial % 0.5)
        cell_um = float(rng.uniform(0.5, 200.0))
        expected = _brute_force_extents(mask, cell_um)
        assert lesion_extents(mask.astype(float), 0.5, cell_um) == pytest.approx(expected)


def test_shapes_whose_extent_is_known() -> None:
    single = np.zeros((5, 5))
    single[2, 2] = 1.0
    assert largest_lesion_um(single, 0.5, 128.0) == pytest.approx(128.0 * np.sqrt(2))
    bar = np.zeros((5, 8))
    bar[1, 2:7] = 0.9  # 5 cells in a row
    assert largest_lesion_um(bar, 0.5, 10.0) == pytest.approx(10.0 * np.hypot(5, 1))
    diagonal = np.eye(4)  # touching at corners: one lesion, corner to corner
    assert lesion_labels(diagonal, 0.5)[1] == 1
    assert largest_lesion_um(diagonal, 0.5, 1.0) == pytest.approx(4 * np.sqrt(2))
    ring = np.ones((6, 6))
    ring[1:5, 1:5] = 0.0  # hollow: the extent of its outline
    assert largest_lesion_um(ring, 0.5, 1.0) == pytest.approx(6 * np.sqrt(2))
    yy, xx = np.mgrid[:2001, :2001]
    disc = np.hypot(yy - 1000, xx - 1000) <= 1000  # large: the boundary alone is measured
    assert largest_lesion_um(disc, 0.5, 0.5) == pytest.approx(1000.0, abs=0.5 * np.sqrt(2))


def test_the_threshold_is_inclusive_and_nan_cells_are_never_lesion() -> None:
    grid = np.array([[0.5, np.nan, 0.49], [np.nan, np.nan, np.nan], [0.2, 0.7, 0.0]])
    labels, count = lesion_labels(grid, 0.5)
    assert count == 2 and labels[0, 0] and labels[2, 1] and not labels[0, 2]
    assert largest_lesion_um(np.full((3, 3), np.nan), 0.5, 1.0) is None
    assert largest_lesion_um(np.zeros((3, 3)), 0.5, 1.0) is None
    assert lesion_labels(grid, 0.8)[1] == 0
    with pytest.raises(ValueError, match="2-D"):
        lesion_labels(np.zeros((2, 2, 2)), 0.5)


def test_a_map_classes_its_node_by_its_largest_lesion() -> None:
    real = NodeThresholds()
    grid = np.zeros((40, 40))
    assert node_label_of_map(grid, 0.5, 128.0, real) == "negative"
    grid[3, 3] = 0.9  # one 128 µm patch: 181 µm across, isolated tumour cells
    assert node_label_of_map(grid, 0.5, 128.0, real) == "itc"
    grid[10, 10:12] = 0.9  # two patches: 286 µm
    assert node_label_of_map(grid, 0.5, 128.0, real) == "micro"
    grid[20:35, 20:32] = 0.9  # 15 x 12 patches: 2.46 mm
    assert node_label_of_map(grid, 0.5, 128.0, real) == "macro"
    assert node_label_of_map(grid, 0.95, 128.0, real) == "negative"


def test_the_ground_truth_as_the_map_gives_every_node_and_patient_its_label(
    synthetic_dataset,  # type: ignore[no-untyped-def]
) -> None:
    """The pipeline is right before any model is: each synthetic slide's annotated lesions,
    drawn at its full resolution and read as a map, give the class ``stage_labels.csv``
    says, and the classes give each patient its stage."""
    config = synthetic_dataset.config
    thresholds = NodeThresholds.for_section(min(config.width, config.height) * config.mpp)
    catalogue = scan_camelyon(synthetic_dataset.root)
    assert not catalogue.problems
    by_patient: dict[str, list[str]] = {}
    stages = {record.patient_id: record.patient_stage for record in catalogue.slides}
    for record in catalogue.slides:
        shape = (config.height, config.width)
        if record.annotation is None:
            truth = np.zeros(shape, dtype=bool)
        else:
            lesions = read_asap(record.annotation)
            truth = tumor_mask([r.vertices for r in lesions.tumor],
                               [r.vertices for r in lesions.carve_outs], shape, 1.0)  # fmt: skip
        label = node_label_of_map(truth, 0.5, config.mpp, thresholds)
        assert label == record.node_label, record.slide_id
        by_patient.setdefault(record.patient_id, []).append(label)
    assert {label for labels in by_patient.values() for label in labels} >= {"negative", "macro"}
    for patient, labels in by_patient.items():
        assert len(labels) == 5 and patient_stage(labels) == stages[patient], patient
