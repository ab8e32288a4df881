"""Tile one slide: its tissue mask, candidate grid and labels, with a preview picture.

    python -m wsi.tile --data-root data/synthetic --slide patient_001_node_2
    python -m wsi.tile path/to/slide.tif --annotations path/to/slide.xml --node-label macro

Prints how many candidates the slide offers per label and how long masks and candidates
took, and writes a PNG preview (thumbnail, tissue outline, lesions, labelled candidates).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import numpy as np

from plumbing.cli import Flag, add_model_flags, exit_on_bad_parameters, given, validate
from wsi.annotations import AnnotationError, SlideAnnotations, read_asap
from wsi.catalogue import scan_camelyon
from wsi.patches import HEALTHY, TUMOR, PatchError, PatchParams, SlideCandidates, compute_candidates
from wsi.slide import SlideReadError, open_slide

log = logging.getLogger(__name__)


def render_preview(
    thumbnail: np.ndarray, candidates: SlideCandidates, annotations: SlideAnnotations | None
) -> np.ndarray:
    """The thumbnail with healthy candidates outlined green and tumour ones red."""
    from skimage.draw import polygon_perimeter, rectangle_perimeter

    preview = thumbnail.copy()
    scale = candidates.mask_downsample
    colours = {HEALTHY: (0, 170, 0), TUMOR: (220, 0, 0)}
    for label, colour in colours.items():
        for x, y in candidates.coords[candidates.labels == label]:
            start = (int(y / scale), int(x / scale))
            extent = (max(1, int(candidates.extent / scale) - 1),) * 2
            rr, cc = rectangle_perimeter(start, extent=extent, shape=preview.shape[:2])
            preview[rr, cc] = colour
    if annotations is not None:
        for region in annotations.regions:
            rr, cc = polygon_perimeter(
                region.vertices[:, 1] / scale, region.vertices[:, 0] / scale, shape=preview.shape
            )
            preview[rr, cc] = (0, 0, 0) if region.is_tumor else (0, 0, 255)
    zoom = max(1, 768 // preview.shape[1])
    return np.repeat(np.repeat(preview, zoom, axis=0), zoom, axis=1)


def _parser() -> tuple[argparse.ArgumentParser, list[Flag]]:
    parser = argparse.ArgumentParser(prog="python -m wsi.tile", description=__doc__.split("\n")[0])
    parser.add_argument("slide", nargs="?", type=Path, help="slide file (or use --data-root)")
    parser.add_argument("--data-root", type=Path, help="Camelyon-17 dataset root")
    parser.add_argument("--slide-id", "--slide", dest="slide_id", help="e.g. patient_001_node_2")
    parser.add_argument("--annotations", type=Path, help="ASAP XML for a slide given by path")
    parser.add_argument("--node-label", choices=["negative", "itc", "micro", "macro"])
    parser.add_argument("--backend", default="auto", choices=["auto", "openslide", "tiffslide"])
    parser.add_argument("--preview", type=Path, help="PNG to write (default: SLIDE_ID.png here)")
    group = parser.add_argument_group("patch parameters (as in params.yaml's preprocess:)")
    return parser, add_model_flags(group, PatchParams)


@exit_on_bad_parameters
def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    parser, patch_flags = _parser()
    args = parser.parse_args(argv)
    flags = given(args, patch_flags)
    params = validate(PatchParams, {f.key[0]: v for f, v in flags.items()}, "command line", flags)

    if args.data_root is not None:
        catalogue = scan_camelyon(args.data_root)
        for problem in catalogue.problems:
            log.warning("%s", problem)
        # by default the first macro-metastasis slide: its lesions surely give patches
        annotated = sorted(
            (s for s in catalogue.slides if s.annotation is not None),
            key=lambda s: (s.node_label != "macro", s.slide_id),
        )
        if args.slide_id is None and not annotated:
            print(f"error: no annotated slide under {args.data_root}", file=sys.stderr)
            return 2
        try:
            record = catalogue.get(args.slide_id) if args.slide_id else annotated[0]
        except KeyError as error:
            print(f"error: {error.args[0]}", file=sys.stderr)
            return 2
        slide_path, annotation_path, node_label = record.path, record.annotation, record.node_label
        slide_id = record.slide_id
    elif args.slide is not None:
        slide_path, annotation_path, node_label = args.slide, args.annotations, args.node_label
        slide_id = args.slide.stem
    else:
        print("error: give a slide path or --data-root", file=sys.stderr)
        return 2

    started = time.perf_counter()
    try:
        annotations = read_asap(annotation_path) if annotation_path else None
        with open_slide(slide_path, args.backend) as slide:
            candidates = compute_candidates(
                slide, annotations, node_label, params, slide_id=slide_id
            )
            elapsed = time.perf_counter() - started
            thumbnail = slide.thumbnail_at_downsample(candidates.mask_downsample)
    except (SlideReadError, AnnotationError, PatchError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1

    counts = candidates.label_counts()
    on_tissue = int((candidates.tissue_fraction >= params.tissue_fraction_min).sum())
    print(
        f"{slide_id} ({node_label or 'unlabelled'}): {len(candidates)} candidates of "
        f"{candidates.extent} px at level 0, {on_tissue} on tissue; healthy {counts['healthy']}, "
        f"tumour {counts['tumor']}; masks and candidates in {elapsed:.2f} s"
    )
    preview_path = args.preview or Path(f"{slide_id}.png")
    from PIL import Image

    preview_path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(render_preview(thumbnail, candidates, annotations)).save(preview_path)
    print(f"preview: {preview_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
