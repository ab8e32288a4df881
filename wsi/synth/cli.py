"""``python -m wsi.synth``: the command line, generated from :class:`SynthConfig`."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path

from plumbing.cli import (
    ConfigError,
    Flag,
    add_model_flags,
    exit_on_bad_parameters,
    given,
    validate,
)
from wsi.catalogue import NODE_LABELS
from wsi.synth.config import SynthConfig, SynthSettings
from wsi.synth.dataset import generate_dataset

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------


def _parser() -> tuple[argparse.ArgumentParser, list[Flag]]:
    parser = argparse.ArgumentParser(
        prog="python -m wsi.synth",
        description=(
            "Write a synthetic Camelyon-17-like dataset: pyramidal JPEG BigTIFF slides, "
            "ASAP lesion annotations and stage_labels.csv. A node is itc / micro / macro by "
            "the largest lesion's extent against the real 0.2 mm / 2 mm thresholds scaled by "
            "min(1, slide short side / 8 mm); see the module docstring for every rule."
        ),
    )
    parser.add_argument("--out", type=Path, required=True, help="dataset root to write")
    flags = add_model_flags(parser, SynthConfig)
    flags += add_model_flags(parser, SynthSettings, exclude=set(SynthConfig.model_fields))
    parser.add_argument("--no-progress", action="store_true", help="log instead of a bar")
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser, flags


@exit_on_bad_parameters
def main(argv: Sequence[str] | None = None) -> int:
    parser, flags = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    values = given(args, flags)
    chosen = {flag.key[0]: value for flag, value in values.items()}
    workers = chosen.pop("workers", SynthSettings.model_fields["workers"].default)
    if "num_centers" in chosen:
        if "centers" in chosen:
            raise ConfigError("command line", "give --centers or --num-centers, not both")
        chosen["centers"] = list(range(validate(
            SynthSettings, {"num_centers": chosen.pop("num_centers")}, "command line", values
        ).num_centers))  # fmt: skip
    config = validate(SynthConfig, chosen, "command line", values)
    total = len(config.patients()) * config.nodes_per_patient
    log.info(
        "writing %d slides of %dx%d px at %g µm/px (%d levels) to %s; labels: itc < %.1f µm, "
        "micro %.1f-%.1f µm, macro > %.1f µm (largest lesion extent)",
        total,
        config.width,
        config.height,
        config.mpp,
        config.level_count,
        args.out,
        config.itc_max_um,
        config.itc_max_um,
        config.macro_min_um,
        config.macro_min_um,
    )
    if args.no_progress:
        manifest = generate_dataset(
            args.out,
            config,
            workers=workers,
            on_slide=lambda s: log.info("wrote %s (%s)", s.slide_path, s.label),
        )
    else:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        with Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        ) as progress:
            bar = progress.add_task("slides", total=total)
            manifest = generate_dataset(
                args.out,
                config,
                workers=workers,
                on_slide=lambda s: progress.update(
                    bar, advance=1, description=f"{s.slide_id} {s.label}"
                ),
            )
    counts = {label: sum(s.label == label for s in manifest.slides) for label in NODE_LABELS}
    log.info(
        "done in %.1f s: %s; %d annotation files; %s",
        manifest.seconds,
        ", ".join(f"{n} {label}" for label, n in counts.items()),
        sum(s.annotation_path is not None for s in manifest.slides),
        manifest.stage_labels_path,
    )
    return 0
