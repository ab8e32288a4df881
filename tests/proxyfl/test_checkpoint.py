"""Checkpoints are written whole or not at all, a write cut short leaves nothing, and a
tampered one is refused rather than run."""

from __future__ import annotations

import errno
import os
import pickle
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from plumbing.atomic import remove_stale_temporaries, temporary_path
from plumbing.refusals import machine_refusal
from proxyfl.engine.checkpoint import (
    CHECKPOINT_MODEL_COPIES,
    CHECKPOINT_OTHER_BYTES,
    CheckpointWriter,
    available_rounds,
    checkpoint_path,
    checkpoints_on_disk,
    load_checkpoint,
    rank_bytes_needed,
    save_checkpoint,
)
from proxyfl.engine.evaluate import Scores
from proxyfl.engine.models import build_model
from proxyfl.engine.trained import CLASSES, NORMALISATION, ModelCard, save_trained


class _Unpicklable:
    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __reduce__(self) -> tuple[object, ...]:
        raise self.error


def _card() -> ModelCard:
    return ModelCard(
        architecture="cnn1", n_classes=2, input_size=32, patch_size=32,
        normalisation=NORMALISATION, classes=CLASSES[:2],
        evaluated_model="private", algorithm="Regular", seed=0, client=0, center=0, rounds=1,
        config_digest="0" * 64,
    )  # fmt: skip


# A disk with no room: the temporary a write goes to is a link to /dev/full (every write
# to it fails with ENOSPC), as a full file system fails a write, without mounting one.
@pytest.mark.skipif(not Path("/dev/full").is_char_device(), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize("written", ["checkpoint", "trained model"])
def test_a_full_disk_is_an_oserror_that_names_the_file_and_leaves_nothing(
    tmp_path: Path, written: str
) -> None:
    """torch's and safetensors' own writers of a path say "file write failed" or raise their
    own error type on a full disk: the rank's one line (``machine_refusal``) needs the
    ENOSPC of a write, with the file it was for."""
    if written == "checkpoint":
        path = checkpoint_path(tmp_path, 0, 1)
        save = lambda: save_checkpoint(tmp_path, 0, 1, {"w": torch.zeros(300_000)})  # noqa: E731
    else:
        path = tmp_path / "models" / "client_0" / "private.safetensors"
        save = lambda: save_trained(build_model("cnn1", 2, 32), path, _card())  # noqa: E731
    path.parent.mkdir(parents=True)
    temporary_path(path).symlink_to("/dev/full")
    with pytest.raises(OSError) as raised:
        save()
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(path)
    assert machine_refusal(raised.value) == (
        f"{path}: no space left on its device (ENOSPC): free space there, or write elsewhere"
    )
    assert list(path.parent.iterdir()) == []  # the temporary (here the link) removed


@pytest.mark.parametrize("error", [RuntimeError("disk gone"), KeyboardInterrupt()])
def test_a_failed_save_leaves_no_temporary_and_the_last_checkpoint_intact(
    tmp_path: Path, error: BaseException
) -> None:
    save_checkpoint(tmp_path, 0, 1, {"weights": torch.ones(3)})
    with pytest.raises(type(error)):
        save_checkpoint(tmp_path, 0, 2, {"weights": torch.ones(3), "bad": _Unpicklable(error)})
    directory = checkpoint_path(tmp_path, 0, 1).parent
    assert sorted(p.name for p in directory.iterdir()) == ["round_0001.pt", "round_0001.pt.sha256"]
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


class _SlowToPickle:
    """A state entry whose writing waits for ``release`` (at most 10 s); copying it is free."""

    release = threading.Event()

    def __deepcopy__(self, memo: dict[int, object]) -> _SlowToPickle:
        return self

    def __reduce__(self) -> tuple[object, tuple[()]]:
        self.release.wait(10)
        return _SlowToPickle, ()


def test_a_checkpoint_is_written_while_the_round_goes_on(tmp_path: Path) -> None:
    """submit returns once the state is copied; the write runs beside the caller, which
    then changes its models in place without changing the checkpoint; wait blocks until the
    round is on disk; a state dict loads back into its model."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.GroupNorm(1, 2))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "history": [(1.4, 0.1, 3)], "slow": _SlowToPickle()}  # fmt: skip
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    moment = optimizer.state_dict()["state"][0]["exp_avg"].clone()
    _SlowToPickle.release.clear()
    with CheckpointWriter(tmp_path, 0, keep=2) as writer:
        started = time.perf_counter()
        writer.submit(1, state)
        assert time.perf_counter() - started < 5  # not waiting for the write
        model(torch.randn(4, 3)).sum().backward()
        optimizer.step()  # the next round changes the models and optimizer in place
        state["history"].append((1.4, 0.1, 6))
        assert available_rounds(tmp_path, 0) == []  # still being written
        _SlowToPickle.release.set()
        writer.wait()
        assert available_rounds(tmp_path, 0) == [1]
    written = torch.load(checkpoint_path(tmp_path, 0, 1), weights_only=False)
    assert all(torch.equal(written["model"][k], v) for k, v in expected.items())
    assert not torch.equal(written["model"]["0.weight"], model.state_dict()["0.weight"])
    assert torch.equal(written["optimizer"]["state"][0]["exp_avg"], moment)
    assert written["history"] == [(1.4, 0.1, 3)]
    assert written["model"]._metadata == model.state_dict()._metadata  # load_state_dict's
    model.load_state_dict(written["model"])


class _FailsToWrite:
    """Copied (by the round) without trouble, failing when written (by the thread)."""

    def __deepcopy__(self, memo: dict[int, object]) -> _FailsToWrite:
        return self

    def __reduce__(self) -> tuple[object, ...]:
        raise RuntimeError("disk gone")


def test_the_writer_keeps_the_newest_checkpoints_and_raises_a_failed_write(
    tmp_path: Path,
) -> None:
    with CheckpointWriter(tmp_path, 0, keep=2) as writer:
        for round_number in (1, 2, 3):
            writer.submit(round_number, {"weights": torch.full((2,), float(round_number))})
        writer.wait()
        assert available_rounds(tmp_path, 0) == [2, 3]
        writer.submit(4, {"bad": _FailsToWrite()})
        with pytest.raises(RuntimeError, match="disk gone"):
            writer.wait()
        writer.submit(5, {"weights": torch.ones(2)})  # the writer goes on
    assert available_rounds(tmp_path, 0) == [3, 5]
    assert not list(checkpoint_path(tmp_path, 0, 1).parent.glob(".*.tmp"))


def test_a_round_in_flight_is_written_when_the_loop_fails(tmp_path: Path) -> None:
    """An error in the round after a submit (a crash, Ctrl-C) still leaves the submitted
    round on disk to resume from, and the writer's thread ended."""
    _SlowToPickle.release.clear()
    with pytest.raises(KeyboardInterrupt), CheckpointWriter(tmp_path, 0, keep=2) as writer:
        writer.submit(1, {"slow": _SlowToPickle(), "weights": torch.ones(2)})
        threading.Timer(0.2, _SlowToPickle.release.set).start()
        raise KeyboardInterrupt
    assert available_rounds(tmp_path, 0) == [1]
    assert not any(t.name.startswith("checkpoint-rank0") for t in threading.enumerate())


def test_every_checkpoint_is_verified_and_a_damaged_one_is_skipped_with_its_reason(
    tmp_path: Path,
) -> None:
    """A digest is recorded beside each checkpoint; truncated bytes, flipped bytes, a lost
    record and an old checkpoint without one are told apart, and only intact ones count."""
    from plumbing.verified import DamagedFileError, digest_path
    from proxyfl.engine.checkpoint import verified_rounds

    for round_number in (1, 2, 3, 4):
        save_checkpoint(tmp_path, 0, round_number, {"w": torch.arange(1000.0)}, keep=4)
    assert verified_rounds(tmp_path, 0) == ([1, 2, 3, 4], [])
    truncated, flipped, unrecorded = (checkpoint_path(tmp_path, 0, r) for r in (4, 3, 2))
    os.truncate(truncated, 500)
    data = bytearray(flipped.read_bytes())
    data[-300:-100] = bytes(byte ^ 0xFF for byte in data[-300:-100])
    flipped.write_bytes(bytes(data))
    digest_path(unrecorded).unlink()  # as an old run's, or a crash between the two writes
    good, skipped = verified_rounds(tmp_path, 0)
    assert good == [1, 2]  # round 2 without a record still loads: accepted
    assert torch.equal(load_checkpoint(tmp_path, 0, 2)["w"], torch.arange(1000.0))  # resumed
    reasons = dict(skipped)
    assert set(reasons) == {3, 4}
    assert str(truncated) in reasons[4] and "500 bytes" in reasons[4]
    assert "SHA-256 differs" in reasons[3]
    with pytest.raises(DamagedFileError, match=r"round_0004\.pt: its bytes are not those"):
        load_checkpoint(tmp_path, 0, 4)
    os.truncate(unrecorded, 500)  # no record, and it does not load either
    assert verified_rounds(tmp_path, 0)[0] == [1]


def test_a_checkpoint_in_place_always_has_its_record_and_a_record_alone_is_no_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record is written before the rename, so a kill between the two leaves a record
    alone (never a checkpoint without one): no round is counted for it, the next write of
    that round replaces it, and clearing the checkpoints removes it."""
    import plumbing.atomic
    from plumbing.atomic import temporary_path
    from plumbing.verified import digest_path, recorded_digest
    from proxyfl.engine.checkpoint import checkpoint_dir, clear_checkpoints, verified_rounds

    path = checkpoint_path(tmp_path, 0, 1)
    recorded_at_rename: list[bool] = []
    rename = plumbing.atomic.commit

    def look_then_rename(temporary: Path, target: Path) -> None:
        if target == path:  # the record is itself renamed into place first
            recorded_at_rename.append(recorded_digest(target) is not None)
        rename(temporary, target)

    monkeypatch.setattr(plumbing.atomic, "commit", look_then_rename)  # the real rename
    save_checkpoint(tmp_path, 0, 1, {"w": torch.ones(3)})
    monkeypatch.undo()
    assert recorded_at_rename == [True] and verified_rounds(tmp_path, 0) == ([1], [])

    orphan = checkpoint_path(tmp_path, 0, 2)  # as a kill after the record, before the rename
    digest_path(orphan).write_text(digest_path(path).read_text())
    assert not temporary_path(orphan).exists()
    assert verified_rounds(tmp_path, 0) == ([1], [])
    save_checkpoint(tmp_path, 0, 2, {"w": torch.zeros(3)}, keep=2)
    assert verified_rounds(tmp_path, 0) == ([1, 2], [])
    digest_path(checkpoint_path(tmp_path, 0, 3)).write_text("sha256:" + "0" * 64 + "\n")
    clear_checkpoints(tmp_path, 0)
    assert not checkpoint_dir(tmp_path, 0).exists()


def test_a_checkpoint_is_within_the_bound_the_room_check_takes(
    tmp_path: Path, helpers: Any
) -> None:
    """A real checkpoint after a round (its Adam optimizers' two moments made): more than
    twice its models' weights, at most CHECKPOINT_MODEL_COPIES of them plus
    CHECKPOINT_OTHER_BYTES: the size proxyfl.run's room check counts for each of the
    keep + 1 checkpoints a rank holds at once."""
    trainer = helpers.one_client(tmp_path)
    trainer.train_round()
    weights = trainer.checkpointed_model_bytes
    path = save_checkpoint(tmp_path / "run", 0, 1, trainer.state_dict(1))
    assert (
        weights < path.stat().st_size <= CHECKPOINT_MODEL_COPIES * weights + CHECKPOINT_OTHER_BYTES
    )
    needed = rank_bytes_needed(weights, keep=2)
    checkpoint = CHECKPOINT_MODEL_COPIES * weights + CHECKPOINT_OTHER_BYTES
    assert needed == 3 * checkpoint + weights
    # a resumed run with its two checkpoints on disk needs one more, and its models
    assert rank_bytes_needed(weights, keep=2, on_disk=2 * checkpoint) == checkpoint + weights
    assert checkpoints_on_disk(tmp_path / "run", 0) == sum(
        p.stat().st_size for p in path.parent.iterdir()
    )
