"""Which node gets which label (the module docstring of :mod:`wsi.synth` states the
rules; the node and stage rules themselves live in :mod:`wsi.nodes`)."""

from __future__ import annotations

import numpy as np
from scipy.spatial.distance import pdist

from wsi.nodes import NODE_LABELS
from wsi.synth.config import _STREAM_LABELS, TUMOUR_LABELS, SynthConfig

# --------------------------------------------------------------------------------------
# Labels and stages
# --------------------------------------------------------------------------------------


def slide_id(patient: int, node: int) -> str:
    return f"patient_{patient:03d}_node_{node}"


def assign_node_labels(config: SynthConfig, patient: int) -> tuple[str, ...]:
    """Target labels of a patient's nodes, from the stream (seed, patient)."""
    rng = np.random.default_rng([config.seed, patient, 0, _STREAM_LABELS])
    labels = ["negative"] * config.min_negative_nodes
    if config.min_tumour_nodes:  # one macro-metastasis: large lesions give tumour patches
        labels.append("macro")
    more_tumour = max(config.min_tumour_nodes - 1, 0)
    labels += [str(rng.choice(TUMOUR_LABELS, p=[0.5, 0.5])) for _ in range(more_tumour)]
    free = config.nodes_per_patient - len(labels)
    labels += [str(rng.choice(NODE_LABELS, p=[0.45, 0.15, 0.15, 0.25])) for _ in range(free)]
    order = rng.permutation(len(labels))
    return tuple(labels[i] for i in order)


def max_feret_diameter(vertices: np.ndarray) -> float:
    """The largest distance between two vertices of a polygon."""
    if len(vertices) < 2:
        return 0.0
    return float(pdist(np.asarray(vertices, dtype=np.float64)).max())
