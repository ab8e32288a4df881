"""Per-rank, per-round checkpoints: written atomically, the last few kept, resumed together.

Each rank writes ``RUN_DIR/checkpoints/rank_{k}/round_{r:04d}.pt`` after round r: models,
optimizer states, accountant history, generator states, PushSum weight, its send/access
logs and timings — everything needed for ``--resume`` to continue to the same result as an
uninterrupted run. A rank can be at most one round ahead of another when a run dies (the
per-round metrics gather keeps them in step), so with two or more checkpoints kept every
rank still holds the round that all ranks agree on (the minimum of their latest rounds).
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Any

import torch

from plumbing.atomic import atomic_path

_PATTERN = re.compile(r"round_(\d+)\.pt$")


def checkpoint_dir(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"rank_{rank}"


def checkpoint_path(run_dir: Path, rank: int, round_number: int) -> Path:
    return checkpoint_dir(run_dir, rank) / f"round_{round_number:04d}.pt"


def available_rounds(run_dir: Path, rank: int) -> list[int]:
    """Rounds this rank has a complete checkpoint for, in increasing order."""
    directory = checkpoint_dir(run_dir, rank)
    if not directory.is_dir():
        return []
    rounds = []
    for entry in directory.iterdir():
        match = _PATTERN.search(entry.name)
        if match and not entry.name.startswith("."):
            rounds.append(int(match.group(1)))
    return sorted(rounds)


def save_checkpoint(
    run_dir: Path, rank: int, round_number: int, state: dict[str, Any], keep: int = 2
) -> Path:
    """Write ``state`` atomically, then delete all but the newest ``keep`` checkpoints."""
    path = checkpoint_path(run_dir, rank, round_number)
    with atomic_path(path) as temporary:  # removed if saving fails or is interrupted
        torch.save(state, temporary)
    for old in available_rounds(run_dir, rank)[:-keep]:
        checkpoint_path(run_dir, rank, old).unlink(missing_ok=True)
    return path


def load_checkpoint(run_dir: Path, rank: int, round_number: int) -> dict[str, Any]:
    """A checkpoint as :func:`save_checkpoint` wrote it, read with ``weights_only=True``:
    tensors, plain containers and numbers, NumPy arrays and the evaluation scores, nothing
    else. A checkpoint holding any other object (a tampered run directory) is refused
    instead of running its code."""
    with torch.serialization.safe_globals(_checkpoint_globals()):
        return torch.load(
            checkpoint_path(run_dir, rank, round_number), map_location="cpu", weights_only=True
        )


# Where Scores lived before proxyfl/ was split into rooms: a run interrupted then still
# resumes from its checkpoints, which name the class by that path.
_SCORES_FORMERLY = "proxyfl.evaluate.Scores"


def _checkpoint_globals() -> list[Any]:
    """What a checkpoint may hold beyond tensors and plain data: NumPy arrays (PrivateKT's
    item indices and buffer) and :class:`~proxyfl.engine.evaluate.Scores` (by its path
    now, or by its former one)."""
    import numpy as np

    from proxyfl.engine.evaluate import Scores

    core = getattr(np, "_core", None) or np.core  # NumPy 2 renamed numpy.core
    # numeric dtypes only: an object array could carry arbitrary pickles
    numeric = [type(np.dtype(kind)) for kind in ("?", "i1", "i2", "i4", "i8", "u1", "u2",
                                                 "u4", "u8", "f2", "f4", "f8")]  # fmt: skip
    return [Scores, (Scores, _SCORES_FORMERLY), np.ndarray, np.dtype,
            core.multiarray._reconstruct, *numeric]  # fmt: skip


def clear_checkpoints(run_dir: Path, rank: int) -> None:
    """Delete this rank's checkpoints, and the checkpoint folders once they are empty."""
    for old in available_rounds(run_dir, rank):
        checkpoint_path(run_dir, rank, old).unlink(missing_ok=True)
    for directory in (checkpoint_dir(run_dir, rank), Path(run_dir) / "checkpoints"):
        # not empty (another rank's, a stray file) or already gone: leave it
        with contextlib.suppress(OSError):
            directory.rmdir()
