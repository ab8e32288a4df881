"""A synthetic Camelyon-17-like dataset: pyramidal slides, ASAP annotations, stage labels.

``python -m wsi.synth --out ROOT --patients-per-center N --seed S`` writes the layout of
the real challenge (see ``wsi.catalogue``)::

    ROOT/center_{c}/patient_{ppp}/patient_{ppp}_node_{n}.tif   (--layout flat:
         ROOT/center_{c}/patient_{ppp}_node_{n}.tif)
    ROOT/lesion_annotations/patient_{ppp}_node_{n}.xml          itc, micro and macro slides
    ROOT/stage_labels.csv                                       header "patient,stage"

Rules the generated data follow
-------------------------------
* **Patients and centres.** Centre ``c`` holds patients ``20c .. 20c+N-1`` (N <= 20), so
  centre = patient // 20 as in Camelyon-17; every patient has ``nodes_per_patient`` (5)
  slides, nodes ``0..4``.
* **Node labels.** A node's label is set by the *extent* of its largest lesion, the
  largest distance between two vertices of one ``metastases`` polygon (its maximum
  Feret diameter), against two thresholds:
  ``itc`` if extent < ``T_itc``, ``micro`` if ``T_itc`` <= extent <= ``T_macro``, ``macro``
  if extent > ``T_macro``; ``negative`` when the slide has no lesion. The real thresholds
  are 0.2 mm and 2 mm on sections about 8 mm across; synthetic slides are smaller, so
  both are multiplied by ``label_scale = min(1, slide short side in µm / 8000 µm)``.
  With the defaults (6144 x 4096 px at 0.25 µm/px, short side 1.024 mm) the scale is
  0.128: ``T_itc`` = 25.6 µm (102 px) and ``T_macro`` = 256 µm (1024 px). The CLI prints
  the thresholds it used; :attr:`SynthConfig.itc_max_um` and
  :attr:`SynthConfig.macro_min_um` give them in code.
* **Which stages, which labels** (:mod:`wsi.synth.rules`, stream ``(seed, centre)`` for
  stages, ``(seed, patient)`` for nodes): each patient's pN stage is drawn first, from
  ``stage_weights`` (pN0 0.36, pN0(i+) 0.12, pN1mi 0.16, pN1 0.24, pN2 0.12), except
  ``tumour_patients_per_center`` (2) patients of each centre, drawn pN1 or pN2 with at
  least one negative node, so that every centre has annotated slides with large lesions
  (tumour patches) and negative slides (healthy patches) even with N = 1 or 2. Its nodes
  are then drawn to give that stage back under :func:`wsi.nodes.patient_stage`; a pN0
  patient has five negative slides and gives healthy patches only.
* **Patient stage** (pN rules, as in Camelyon-17): ``pN0`` all nodes negative;
  ``pN0(i+)`` only ITCs; ``pN1mi`` micro-metastases but no macro; ``pN1`` 1-3 positive
  (micro or macro) nodes with at least one macro; ``pN2`` 4-9 positive nodes with at
  least one macro.
* **Annotations.** Every non-negative slide has an ASAP XML file (the real format:
  ``Type="Polygon"``, float level-0 pixel coordinates). Lesions are group
  ``metastases`` (12-40 vertices, irregular, inside tissue); some large lesions have a
  carve-out polygon in group ``normal`` strictly inside them, drawn as healthy tissue.
  The pixels of a lesion are exactly where its polygon (minus carve-outs) lies.
* **Pixels.** White glass (RGB about 235-245, low saturation) around one to three
  irregular tissue blobs covering about 30-55 % of the slide. Healthy tissue, like a
  lymph node: pink eosin stroma with fibrous texture, dense with small, round, dark
  nuclei (lymphocytes). Tumour: cytoplasm shifted towards purple, with large, pale,
  elongated nuclei. Colours come from a Beer-Lambert H&E model.
* **Centres differ like hospitals** (:class:`CenterLook`, fixed per centre, independent
  of the seed): stain (hue and strength of both stains, the glass colour), scanner
  (focus blur, noise), nucleus size, and how purple tumour cytoplasm turns. So centres
  are not IID: colour cues that separate the classes in one centre mislead in another,
  and a classifier trained on one centre scores lower on the others than one trained on
  all of them, while nuclear size and paleness separate the classes everywhere. Each
  slide jitters its centre's stain strengths slightly.
* **Slides.** Tiled pyramidal BigTIFF, JPEG tiles (``tile_size``, a multiple of 16), all
  levels in the main IFD chain, levels > 0 with ``subfiletype=1``, each level half the
  previous down to a longer side <= 512 px, resolution ``1e4 / mpp`` pixels per cm. Both
  OpenSlide (generic-tiff, ``openslide.mpp-x``) and tiffslide (``tiffslide.mpp-x``)
  read them. Level 0 is rendered one row of tiles at a time; lower levels are 2x2 block
  means of the level above.
* **Determinism.** Everything is drawn from ``numpy.random.default_rng`` streams keyed
  by ``(seed, patient, node, purpose)``, no timestamps are written, so the same
  configuration gives byte-identical files whatever the order or the number of
  workers. Each file is written atomically (:mod:`plumbing.atomic`: a temporary beside
  its target, renamed into place).
"""

from __future__ import annotations

import importlib
from typing import Any

# Each module has one job: config (settings, label thresholds, pyramid geometry; light, so
# that reading params.yaml imports no image code), rules (labels, stages), stain (each
# centre's look), plan (a slide's tissue, lesions and nuclei), render (pixels), tiff
# (pyramidal TIFF), dataset (the whole dataset), cli (the command line). The ASAP writer
# lives beside its reader, in wsi.annotations. Names load on first use.
_HOMES: dict[str, str] = {
    **dict.fromkeys(["LAYOUTS", "Layout", "SynthConfig", "SynthSettings", "auto_level_count",
                     "level_dimensions"], "wsi.synth.config"),
    **dict.fromkeys(["SynthManifest", "SynthSlide", "annotation_path", "dataset_is_written",
                     "generate_dataset",
                     "generate_slide", "slide_path", "stage_labels_text"], "wsi.synth.dataset"),
    **dict.fromkeys(["assign_cohort", "assign_node_labels", "draw_patients", "max_feret_diameter",
                     "slide_id"], "wsi.synth.rules"),
    **dict.fromkeys(["node_label", "patient_stage"], "wsi.nodes"),
    **dict.fromkeys(["CenterLook", "StainProfile", "center_look", "center_stain"],
                    "wsi.synth.stain"),
    "plan_slide": "wsi.synth.plan",
    "render_slide": "wsi.synth.render",
    "write_pyramidal_tiff": "wsi.synth.tiff",
    "write_asap_xml": "wsi.annotations",
    "main": "wsi.synth.cli",
}  # fmt: skip
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'wsi.synth' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)


def __dir__() -> list[str]:
    return __all__
