"""The files a finished run keeps, and whether they are still the bytes it wrote: without
torch, for the launcher that decides whether a finished run is kept
(:mod:`proxyfl.launch.rundir`) as well as for the loader of its models
(:mod:`proxyfl.engine.trained`)."""

from __future__ import annotations

import os
from pathlib import Path

from plumbing.verified import DamagedFileError, recorded_digest, verify

MODELS_DIR = "models"  # RUN_DIR/models/client_{c}/{evaluated_model}.safetensors and .json


def retrain_hint(path: str | os.PathLike[str]) -> str:
    """The command that trains again the run a kept model at ``path`` belongs to
    (``RUNS/ALGORITHM/seed_S/models/client_C/NAME.safetensors``)."""
    run_dir = Path(path).parents[2]
    algorithm, seed = run_dir.parent.name, run_dir.name.removeprefix("seed_")
    if not seed.isdigit():
        return f"train the run at {run_dir} again (its flow's --replace)"
    return (f"train the run again: `python -m flows.train --algorithms {algorithm} --seeds "
            f"{seed} --replace` (or `dvc repro -f train@{algorithm}-{seed}`)")  # fmt: skip


def damaged_models(run_dir: str | os.PathLike[str]) -> list[DamagedFileError]:
    """What is wrong with the kept models of the run at ``run_dir``: every model file and
    card whose recorded digest does not match (files of runs made before digests were
    recorded have none and are not checked)."""
    problems = []
    folder = Path(run_dir) / MODELS_DIR
    for path in sorted(folder.glob("client_*/*")) if folder.is_dir() else []:
        if path.suffix in (".safetensors", ".json") and recorded_digest(path) is not None:
            try:
                verify(path, retrain_hint(path))
            except DamagedFileError as error:
                problems.append(error)
    return problems
