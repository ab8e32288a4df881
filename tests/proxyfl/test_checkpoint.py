"""Checkpoints are written whole or not at all, a write cut short leaves nothing, and a
tampered one is refused rather than run."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from plumbing.atomic import remove_stale_temporaries, temporary_path
from proxyfl.engine.checkpoint import (
    available_rounds,
    checkpoint_path,
    load_checkpoint,
    save_checkpoint,
)
from proxyfl.engine.evaluate import Scores


class _Unpicklable:
    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __reduce__(self) -> tuple[object, ...]:
        raise self.error


@pytest.mark.parametrize("error", [RuntimeError("disk gone"), KeyboardInterrupt()])
def test_a_failed_save_leaves_no_temporary_and_the_last_checkpoint_intact(
    tmp_path: Path, error: BaseException
) -> None:
    save_checkpoint(tmp_path, 0, 1, {"weights": torch.ones(3)})
    with pytest.raises(type(error)):
        save_checkpoint(tmp_path, 0, 2, {"weights": torch.ones(3), "bad": _Unpicklable(error)})
    directory = checkpoint_path(tmp_path, 0, 1).parent
    assert sorted(p.name for p in directory.iterdir()) == ["round_0001.pt"]
    assert available_rounds(tmp_path, 0) == [1]
    assert torch.equal(load_checkpoint(tmp_path, 0, 1)["weights"], torch.ones(3))


def test_a_temporary_of_a_killed_writer_is_swept_and_never_counted(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, 0, 1, {"weights": torch.zeros(2)})
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    stale = temporary_path(checkpoint_path(tmp_path, 0, 2), pid=int(dead.stdout))
    stale.write_bytes(b"half a checkpoint")
    live = temporary_path(checkpoint_path(tmp_path, 0, 3), pid=os.getpid())
    live.write_bytes(b"being written")
    assert available_rounds(tmp_path, 0) == [1]
    assert remove_stale_temporaries(stale.parent) == [stale]
    assert live.exists()  # a live writer's file is never removed


class _RunsCode:
    """What a tampered checkpoint could hold: unpickling it would run a command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        import os

        return os.system, (f"touch {self.marker}",)


def test_a_tampered_checkpoint_is_refused_without_running_its_code(tmp_path: Path) -> None:
    marker = tmp_path / "code-ran"
    save_checkpoint(tmp_path, 0, 1, {"round": 1, "payload": _RunsCode(marker)})
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        load_checkpoint(tmp_path, 0, 1)
    assert not marker.exists()
    # what a checkpoint does hold loads: tensors, numbers, NumPy arrays, scores
    scores = {"private": Scores(0.5, 0.5, 4, (0.5, None))}
    state = {"round": 2, "model": {"w": torch.ones(2)}, "items": np.arange(3),
             "scores": scores, "rng": {"state": 2**70}}  # fmt: skip
    save_checkpoint(tmp_path, 0, 2, state)
    loaded = load_checkpoint(tmp_path, 0, 2)
    assert np.array_equal(loaded["items"], state["items"]) and loaded["scores"] == state["scores"]
    assert torch.equal(loaded["model"]["w"], state["model"]["w"]) and loaded["rng"] == state["rng"]


def test_a_checkpoint_written_before_the_move_of_scores_still_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checkpoints of runs interrupted before proxyfl/ was split into rooms name
    ``proxyfl.evaluate.Scores``; they resume, and only that old name is let through."""
    import types

    former = types.ModuleType("proxyfl.evaluate")
    former.Scores = Scores  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "proxyfl.evaluate", former)
    monkeypatch.setattr(Scores, "__module__", "proxyfl.evaluate")
    scores = {"proxy": Scores(0.5, 0.5, 4, (0.5, 0.5))}
    save_checkpoint(tmp_path, 0, 1, {"round": 1, "last_scores": scores})
    monkeypatch.undo()  # the class is back at its path, and the old module is gone
    assert "proxyfl.evaluate" not in sys.modules
    assert b"proxyfl.evaluate" in checkpoint_path(tmp_path, 0, 1).read_bytes()
    assert load_checkpoint(tmp_path, 0, 1)["last_scores"] == scores
