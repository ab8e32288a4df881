"""Lymph nodes and patients: a node's class from its largest lesion, a patient's pN stage
from its nodes. The rules of the Camelyon-17 challenge (Bandi et al., IEEE TMI 2019,
§II-B; the AJCC 8th edition's breast pN categories), in one place: the synthetic data's
generator (:mod:`wsi.synth`) labels its slides with them, and the staging of trained
models (:mod:`wsi.lesions`, :mod:`analysis.staging`) classifies with them.

**Node class** from the extent ``e`` of the node's largest lesion, the largest distance
between two of its points (its maximum Feret diameter), and two thresholds ``T_itc`` and
``T_macro``:

============  ==============================  ==========================================
class         rule                            Camelyon-17's words
============  ==============================  ==========================================
negative      no lesion
itc           ``e <= T_itc``                  isolated tumour cells, not larger than
                                              0.2 mm (AJCC; the challenge: "smaller")
micro         ``T_itc < e <= T_macro``        micro-metastasis, larger than 0.2 mm, not
                                              larger than 2.0 mm
macro         ``e > T_macro``                 macro-metastasis, larger than 2.0 mm
============  ==============================  ==========================================

``T_itc`` = 200 µm and ``T_macro`` = 2000 µm hold for real sections, about 8 mm across.
A smaller section (the synthetic slides: 1-2 mm) scales both by
``s = min(1, short side / 8000 µm)`` (:meth:`NodeThresholds.for_section`), so that its
lesions keep the classes' proportions to the tissue; real slides have ``s = 1``. (The
challenge also counts cells, more than 200 making a micro-metastasis; a map of patches
does not see cells, so the extent alone decides here, as it does in the challenge's
annotations.)

**pN stage** from the classes of a patient's nodes, with *positive* = micro or macro
(isolated tumour cells do not count as metastases):

- ``pN0``: every node negative;
- ``pN0(i+)``: only isolated tumour cells;
- ``pN1mi``: micro-metastases, no macro-metastasis;
- ``pN1``: metastases in 1-3 nodes, at least one a macro-metastasis;
- ``pN2``: metastases in 4-9 nodes, at least one a macro-metastasis.

:data:`PATIENT_STAGES` lists them in the order of the challenge's quadratic weighted
kappa.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

NODE_LABELS: tuple[str, ...] = ("negative", "itc", "micro", "macro")
"""A node's classes, from none to the largest lesion (the kappa's order)."""
METASTASIS_LABELS: tuple[str, ...] = ("micro", "macro")
"""The classes that count as a positive node in the pN stage."""
PATIENT_STAGES: tuple[str, ...] = ("pN0", "pN0(i+)", "pN1mi", "pN1", "pN2")
"""A patient's pN stages, in the order of the challenge's quadratic weighted kappa."""

ITC_MAX_UM = 200.0
"""Isolated tumour cells are smaller than 0.2 mm (Camelyon-17, AJCC 8th edition)."""
MACRO_MIN_UM = 2000.0
"""A macro-metastasis is larger than 2.0 mm (Camelyon-17, AJCC 8th edition)."""
REFERENCE_SECTION_UM = 8000.0
"""The short side of a real lymph-node section, about 8 mm: where the scale is 1."""


@dataclass(frozen=True)
class NodeThresholds:
    """The two extents that separate a node's classes, in µm (see the module docstring)."""

    itc_max_um: float = ITC_MAX_UM
    macro_min_um: float = MACRO_MIN_UM

    def __post_init__(self) -> None:
        if not 0 < self.itc_max_um < self.macro_min_um:
            raise ValueError(
                f"need 0 < itc_max_um < macro_min_um; got {self.itc_max_um}, {self.macro_min_um}"
            )

    def scaled_to(
        self, short_side_um: float, reference_um: float = REFERENCE_SECTION_UM
    ) -> NodeThresholds:
        """These thresholds times ``label_scale(short_side_um, reference_um)``: a section's."""
        scale = label_scale(short_side_um, reference_um)
        return NodeThresholds(self.itc_max_um * scale, self.macro_min_um * scale)

    @classmethod
    def for_section(
        cls, short_side_um: float, reference_um: float = REFERENCE_SECTION_UM
    ) -> NodeThresholds:
        """The challenge's thresholds, scaled to a section (:meth:`scaled_to`)."""
        return cls().scaled_to(short_side_um, reference_um)


def label_scale(short_side_um: float, reference_um: float = REFERENCE_SECTION_UM) -> float:
    """``min(1, short_side_um / reference_um)``: how much smaller than a real section's
    a section's thresholds are."""
    if not short_side_um > 0 or not reference_um > 0:
        raise ValueError(f"sides must be positive; got {short_side_um}, {reference_um}")
    return min(1.0, short_side_um / reference_um)


def node_label(extent_um: float | None, thresholds: NodeThresholds) -> str:
    """The class of a node whose largest lesion spans ``extent_um`` (``None``: no lesion)."""
    if extent_um is None:
        return "negative"
    if extent_um <= thresholds.itc_max_um:  # micro is "larger than 0.2 mm"
        return "itc"
    if extent_um <= thresholds.macro_min_um:
        return "micro"
    return "macro"


def patient_stage(node_labels: Iterable[str]) -> str:
    """The pN stage of a patient from the classes of its nodes (any number of them)."""
    labels = list(node_labels)
    unknown = set(labels) - set(NODE_LABELS)
    if unknown:
        raise ValueError(f"unknown node labels {sorted(unknown)}")
    positive = sum(label in METASTASIS_LABELS for label in labels)
    if "macro" in labels:
        return "pN1" if positive <= 3 else "pN2"
    if "micro" in labels:
        return "pN1mi"
    if "itc" in labels:
        return "pN0(i+)"
    return "pN0"
