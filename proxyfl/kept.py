"""The files a finished run keeps, and whether they are still the bytes it wrote, shared by
the library and what reads finished runs (:mod:`analysis`): without torch, for the
launcher that decides whether a finished run is kept (:mod:`proxyfl.launch.rundir`) as
well as for the loader of its models (:mod:`proxyfl.engine.trained`), the report and the
audit.

What is verified (:mod:`plumbing.verified`: a ``NAME.sha256`` beside each, written once
the file is whole): the kept models and their cards, each client's predictions, and, once
the run has finished, its ``metrics.jsonl`` and its ``run.json`` (recorded last, after
"finished"). Files of runs made before digests were recorded have none and are not
checked."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from plumbing.verified import DamagedFileError, recorded_digest, verify
from proxyfl.results import METRICS_FILE, PREDICTIONS_DIR, RUN_FILE

MODELS_DIR = "models"  # RUN_DIR/models/client_{c}/{evaluated_model}.safetensors and .json

DEPLOYED_MODELS: tuple[str, ...] = ("private", "central", "local")
"""The evaluated models a hospital would deploy, in order of preference: the client's
``private`` model (ProxyFL, FML), else its ``central`` one (FedAvg, PrivateKT), else its
``local`` one; never the proxy, which was shared."""
POOLED = "Joint"  # one client trained on every centre's data: it serves every centre


def trained_path(run_dir: str | os.PathLike[str], client: int, evaluated_model: str) -> Path:
    """``RUN_DIR/models/client_{c}/{evaluated_model}.safetensors``."""
    return Path(run_dir) / MODELS_DIR / f"client_{client}" / f"{evaluated_model}.safetensors"


def deployed_model(
    run_dir: str | os.PathLike[str], algorithm: str, centers: Sequence[int], center: int
) -> tuple[int, Path] | None:
    """``(client, path)`` of the kept model that serves ``center`` in the run at
    ``run_dir`` (trained on ``centers``, one client each, client k the k-th centre;
    Joint's one client serves every centre): the first of :data:`DEPLOYED_MODELS` it
    keeps; None when it keeps none or ``center`` is not one of its clients'."""
    if center not in centers:
        return None
    client = 0 if algorithm == POOLED else list(centers).index(center)
    for name in DEPLOYED_MODELS:
        path = trained_path(run_dir, client, name)
        if path.is_file():
            return client, path
    return None


def rerun_hint(run_dir: str | os.PathLike[str]) -> str:
    """The command that trains again the run at ``run_dir`` (``RUNS/ALGORITHM/seed_S``)."""
    run_dir = Path(run_dir)
    algorithm, seed = run_dir.parent.name, run_dir.name.removeprefix("seed_")
    if not seed.isdigit():
        return f"train the run at {run_dir} again (its flow's --replace)"
    return (f"train the run again: `python -m flows.train --algorithms {algorithm} --seeds "
            f"{seed} --replace` (or `dvc repro -f train@{algorithm}-{seed}`)")  # fmt: skip


def retrain_hint(path: str | os.PathLike[str]) -> str:
    """:func:`rerun_hint` of the run a kept model at ``path`` belongs to
    (``RUNS/ALGORITHM/seed_S/models/client_C/NAME.safetensors``)."""
    return rerun_hint(Path(path).parents[2])


def verify_kept(path: str | os.PathLike[str], run_dir: str | os.PathLike[str]) -> None:
    """:class:`DamagedFileError` naming ``path`` (a file of the run at ``run_dir``) and the
    command that trains the run again, where a digest was recorded and does not match."""
    if recorded_digest(path) is not None:
        verify(path, rerun_hint(run_dir))


def _kept_files(run_dir: Path) -> list[Path]:
    records = [run_dir / RUN_FILE, run_dir / METRICS_FILE]
    predictions = sorted((run_dir / PREDICTIONS_DIR).glob("client_*.csv"))
    models = sorted(p for p in (run_dir / MODELS_DIR).glob("client_*/*")
                    if p.suffix in (".safetensors", ".json"))  # fmt: skip
    return records + predictions + models


def damaged_files(run_dir: str | os.PathLike[str]) -> list[DamagedFileError]:
    """What is wrong with the files the finished run at ``run_dir`` keeps: its records,
    predictions, models and cards whose recorded digest does not match."""
    run_dir = Path(run_dir)
    problems = []
    for path in _kept_files(run_dir):
        try:
            verify_kept(path, run_dir)
        except DamagedFileError as error:
            problems.append(error)
    return problems
