"""Per-rank, per-round checkpoints: written atomically, the last few kept, resumed together.

Each rank writes ``RUN_DIR/checkpoints/rank_{k}/round_{r:04d}.pt`` after round r: models,
optimizer states, accountant history, generator states, PushSum weight, its send/access
logs and timings — everything needed for ``--resume`` to continue to the same result as an
uninterrupted run. A rank can be at most one round ahead of another when a run dies (the
per-round barrier keeps them in step), so with two or more checkpoints kept every rank
still holds the round that all ranks agree on (the minimum of their latest rounds).

:class:`CheckpointWriter` takes the writing off a round's critical path: round r's
checkpoint is written while round r + 1 trains, and is on disk before that round's
barrier, which keeps the bound above.

Each checkpoint's SHA-256 is recorded beside it once it is written
(``round_{r:04d}.pt.sha256``, :mod:`plumbing.verified`), and :func:`verified_rounds` checks
them before a resume: a checkpoint cut short or damaged on disk is skipped, with the reason,
and the run resumes from the newest round every rank holds intact.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import pickle
import re
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from plumbing.atomic import atomic_path
from plumbing.verified import (
    SUFFIX,
    DamagedFileError,
    record_digest,
    recorded_digest,
    remove_with_digest,
    verify,
)

logger = logging.getLogger(__name__)

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
        # into a handle of ours: a full disk is then the OSError of its write (ENOSPC, named
        # by atomic_path, under the RuntimeError torch's writer ends with), where torch's
        # own writer of a path says only "file write failed"
        with temporary.open("wb") as handle:
            torch.save(state, handle)
        # recorded before the rename: a checkpoint in place always has its record (a kill
        # between the two leaves a record alone, which the next write of that round replaces)
        record_digest(path, contents=temporary)
    for old in available_rounds(run_dir, rank)[:-keep]:
        remove_with_digest(checkpoint_path(run_dir, rank, old))
    return path


CHECKPOINT_MODEL_COPIES = 3
"""A checkpoint's bound in copies of its models' weights: the weights, and an optimizer's
state of at most two tensors of their size (Adam's two moments; SGD's momentum, one)."""
CHECKPOINT_OTHER_BYTES = 256 * 1024
"""A bound on the rest of a checkpoint and the run's records of a rank (generator states,
accountant history, send log, scores): small beside the models."""


def rank_bytes_needed(model_bytes: int, keep: int, on_disk: int = 0) -> int:
    """Bytes a rank's run still needs on its filesystem, ``model_bytes`` being the size of
    the weights it checkpoints (its shared and private models): with checkpoint size
    ``C = 3 model_bytes + 256 KiB`` (:data:`CHECKPOINT_MODEL_COPIES`), the writer holds
    ``keep + 1`` checkpoints at once (the next is written before the oldest goes), and the
    run keeps the models once more at its end:

        ``needed = max(0, (keep + 1) C - on_disk) + model_bytes``

    where ``on_disk`` is what its checkpoints already take (a resumed run)."""
    checkpoint = CHECKPOINT_MODEL_COPIES * model_bytes + CHECKPOINT_OTHER_BYTES
    return max(0, (keep + 1) * checkpoint - on_disk) + model_bytes


def checkpoints_on_disk(run_dir: Path, rank: int) -> int:
    """Bytes the checkpoints of ``rank`` take now (their digests included)."""
    directory = checkpoint_dir(run_dir, rank)
    if not directory.is_dir():
        return 0
    return sum(entry.stat().st_size for entry in directory.iterdir() if entry.is_file())


def repair_hint(run_dir: Path) -> str:
    """What to do about a checkpoint that does not verify."""
    return (f"the run resumes from an older intact checkpoint, or from round 1 without one "
            f"(delete {Path(run_dir) / 'checkpoints'} to start over)")  # fmt: skip


def verified_rounds(run_dir: Path, rank: int) -> tuple[list[int], list[tuple[int, str]]]:
    """``(rounds whose checkpoint verifies, in increasing order, [(round, why skipped)])``.

    A checkpoint verifies when its bytes match the digest recorded beside it; one without
    a record (written before digests were recorded) verifies when it loads: the rule
    :func:`load_checkpoint` applies."""
    good, skipped = [], []
    for round_number in available_rounds(run_dir, rank):
        path = checkpoint_path(run_dir, rank, round_number)
        try:
            if recorded_digest(path) is None:
                load_checkpoint(run_dir, rank, round_number)
            else:
                verify(path, repair_hint(run_dir))
        except DamagedFileError as error:
            skipped.append((round_number, f"{path}: {error.problem}"))
            continue
        except pickle.UnpicklingError as error:  # an old checkpoint cut short, or tampered
            skipped.append((round_number, f"{path}: not a checkpoint it can load ({error})"))
            continue
        good.append(round_number)
    return good, skipped


def host_copy(state: Any) -> Any:
    """A copy of ``state`` that shares nothing mutable with it: every tensor copied to host
    memory, containers and other values copied (a state dict's ``_metadata`` kept). What a
    rank goes on training after a round cannot change the checkpoint of that round."""
    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, dict):
        copied = copy.copy(state)  # its type and attributes (OrderedDict._metadata)
        for key, value in state.items():
            copied[key] = host_copy(value)
        return copied
    if type(state) in (list, tuple):
        return type(state)(host_copy(value) for value in state)
    return copy.deepcopy(state)


class CheckpointWriter:
    """A rank's checkpoints written by one background thread, one at a time.

    :meth:`submit` copies the state (:func:`host_copy`: the copy is all the round waits
    for) and hands the writing (:func:`save_checkpoint`: atomic, then the old ones deleted)
    to the thread; :meth:`wait` blocks until the write in flight is on disk and raises its
    error, if it failed. The training loop waits before each round's barrier, so once any
    rank has passed the barrier of round r + 1 every rank has its checkpoint of round r on
    disk: ranks' newest checkpoints differ by at most one round, as with writes in line.
    :meth:`close` waits and stops the thread; use the writer as a context manager.
    """

    def __init__(self, run_dir: Path, rank: int, keep: int) -> None:
        self.run_dir, self.rank, self.keep = Path(run_dir), rank, keep
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"checkpoint-rank{rank}")
        self._pending: Future[Path] | None = None

    def submit(self, round_number: int, state: dict[str, Any]) -> None:
        """Write ``state`` as round ``round_number``'s checkpoint, after the one in flight."""
        self.wait()
        snapshot = host_copy(state)
        self._pending = self._executor.submit(
            save_checkpoint, self.run_dir, self.rank, round_number, snapshot, self.keep
        )

    def wait(self) -> None:
        """Block until the checkpoint in flight is written; raise its error if it failed."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._executor.shutdown(wait=True)

    def __enter__(self) -> CheckpointWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        try:  # on an error too: the round in flight is still a checkpoint to resume from
            self.close()
        except Exception as error:
            if kind is None:
                raise
            # the error already on its way says more
            logger.error("checkpoint of rank %d not written: %s", self.rank, error)


def load_checkpoint(run_dir: Path, rank: int, round_number: int) -> dict[str, Any]:
    """A checkpoint as :func:`save_checkpoint` wrote it, its digest checked first where one
    is recorded (a checkpoint without a record, from before digests were recorded, must
    still load whole: torn bytes fail to unpickle), read with
    ``weights_only=True``: tensors, plain containers and numbers, NumPy arrays and the
    evaluation scores, nothing else. A checkpoint holding any other object (a tampered run
    directory) is refused instead of running its code. A damaged one raises
    :class:`~plumbing.verified.DamagedFileError`."""
    path = checkpoint_path(run_dir, rank, round_number)
    if recorded_digest(path) is not None:
        verify(path, repair_hint(run_dir))
    try:
        with torch.serialization.safe_globals(_checkpoint_globals()):
            return torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, ValueError) as error:
        problem = f"not a checkpoint torch can read ({' '.join(str(error).split())[:200]})"
        raise DamagedFileError(path, problem, repair_hint(run_dir)) from None


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
        remove_with_digest(checkpoint_path(run_dir, rank, old))
    for record in checkpoint_dir(run_dir, rank).glob("round_*.pt" + SUFFIX):
        record.unlink(missing_ok=True)  # a record alone: killed before its rename
    for directory in (checkpoint_dir(run_dir, rank), Path(run_dir) / "checkpoints"):
        # not empty (another rank's, a stray file) or already gone: leave it
        with contextlib.suppress(OSError):
            directory.rmdir()
