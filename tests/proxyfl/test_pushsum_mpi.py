"""PushSum over real mpiexec: without training, de-biased proxies reach the average.

Two mpiexec launches (4 and 3 ranks) run every case; the tests read their results.
"""

from __future__ import annotations

import json
import queue
import threading
from pathlib import Path
from typing import NoReturn

import numpy as np
import pytest

SCRIPT = Path(__file__).with_name("mpi_pushsum_check.py")


def _launch(helpers, out: Path, ranks: int, cases: dict[str, str]) -> None:
    args = [out, *(f"{name}={spec}" for name, spec in cases.items())]
    result = helpers.run_mpi(ranks, args, timeout=180, script=SCRIPT)
    assert result.returncode == 0, helpers.explain(result)


def _load(out: Path, name: str, ranks: int) -> list[dict]:
    return [dict(np.load(out / name / f"rank_{k}.npz")) for k in range(ranks)]


@pytest.fixture(scope="module")
def four_ranks(helpers, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pushsum4")
    _launch(helpers, out, 4, four_rank_cases(out))
    return out


def four_rank_cases(out: Path) -> dict[str, str]:
    """The cases of the four-rank launch (its graph file written into ``out``)."""
    rng = np.random.default_rng(7)
    matrices = []
    for _ in range(3):
        matrix = rng.uniform(0.05, 1.0, size=(4, 4))
        matrices.append((matrix / matrix.sum(axis=0, keepdims=True)).tolist())
    graph = out / "graph.json"
    graph.write_text(json.dumps({"matrices": matrices}))
    return {
        "mix": "exponential_mix@2",
        "uneven": "exponential_uneven@60",
        "dense": f"file:{graph}@40",
        "paper": "exponential@3",
        "server_all": "server:0,1,2,3@1",
        "server_others": "server:3,1,2@1",
    }


@pytest.fixture(scope="module")
def three_ranks(helpers, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pushsum3")
    _launch(helpers, out, 3, {"uneven": "exponential_uneven@60"})
    return out


def test_exponential_mix_averages_exactly_in_log2_rounds(four_ranks: Path) -> None:
    ranks = _load(four_ranks, "mix", 4)
    average = np.mean([r["initial"] for r in ranks], axis=0)
    for r in ranks:
        np.testing.assert_allclose(r["history"][-1], average, rtol=0, atol=1e-6)
        np.testing.assert_allclose(r["weights"], 1.0)
        # One peer per round, the whole proxy in one buffer.
        assert r["sent_values"].tolist() == [1000, 1000]
    # After one round only pairs are mixed: not yet the average.
    assert not np.allclose(ranks[0]["history"][0], average, atol=1e-3)


@pytest.mark.parametrize("ranks_count", [4, 3])
def test_uneven_column_stochastic_schedule_debiased_to_average(
    four_ranks: Path, three_ranks: Path, ranks_count: int
) -> None:
    out = four_ranks if ranks_count == 4 else three_ranks
    ranks = _load(out, "uneven", ranks_count)
    average = np.mean([r["initial"] for r in ranks], axis=0)
    weights = np.array([r["weights"][-1] for r in ranks])
    # The schedule is not doubly stochastic: the weights drift away from 1, and their sum
    # (the PushSum mass) is conserved.
    assert np.abs(weights - 1).max() > 0.05
    assert weights.sum() == pytest.approx(ranks_count, rel=1e-9)
    for r in ranks:
        np.testing.assert_allclose(r["history"][-1], average, rtol=0, atol=1e-4)
    # Without the de-biasing (w·θ is what the numerators hold) it is not the average.
    biased = weights[0] * ranks[0]["history"][-1]
    assert not np.allclose(biased, average, atol=1e-2)


def test_dense_schedule_from_file(four_ranks: Path) -> None:
    ranks = _load(four_ranks, "dense", 4)
    average = np.mean([r["initial"] for r in ranks], axis=0)
    for r in ranks:
        np.testing.assert_allclose(r["history"][-1], average, rtol=0, atol=1e-4)
        assert set(r["sent_values"].tolist()) == {1000}
        assert len(r["sent_values"]) == 3 * 40  # dense graph: three out-neighbours a round


def test_paper_exponential_permutation_moves_whole_proxies(four_ranks: Path) -> None:
    """The paper's graph replaces each proxy with a peer's: a permutation, mass conserved."""
    ranks = _load(four_ranks, "paper", 4)
    initial = [r["initial"] for r in ranks]
    offsets = [1, 2, 1]  # s = 2^(t mod (floor(log2 3) + 1)) for t = 0, 1, 2
    for k, r in enumerate(ranks):
        shift = 0
        for t, offset in enumerate(offsets):
            shift += offset
            np.testing.assert_array_equal(r["history"][t], initial[(k - shift) % 4])
        np.testing.assert_array_equal(r["weights"], 1.0)
    total = np.sum([r["history"][-1] for r in ranks], axis=0)
    np.testing.assert_allclose(total, np.sum(initial, axis=0), atol=1e-5)


@pytest.mark.parametrize(("name", "members"), [("server_all", [0, 1, 2, 3]),
                                               ("server_others", [3, 1, 2])])  # fmt: skip
def test_the_server_average_is_the_members_sum_in_their_order(
    four_ranks: Path, name: str, members: list[int]
) -> None:
    """Summed by the server in the members' order, in float32, whatever the transport would
    have done: four members are not MPI Reduce's pairwise (θ0+θ1)+(θ2+θ3), bit for bit."""
    ranks = _load(four_ranks, name, 4)
    total = ranks[members[0]]["initial"].copy()
    for member in members[1:]:
        total += ranks[member]["initial"]
    expected = total / np.float32(len(members))
    for rank, saved in enumerate(ranks):
        if rank in members or rank == 0:
            assert saved["average"].dtype == np.float32
            assert saved["average"].tobytes() == expected.tobytes(), rank
        else:
            assert "average" not in saved
    if name == "server_all":  # the order is what the test checks: a tree's differs
        initial = [saved["initial"] for saved in ranks]
        pairwise = ((initial[0] + initial[1]) + (initial[2] + initial[3])) / np.float32(4)
        assert pairwise.tobytes() != expected.tobytes()


class _Mailboxes:
    """The messages between threads of this process: a queue per (receiver, sender, tag)."""

    def __init__(self) -> None:
        self._queues: dict[tuple[int, int, str], queue.Queue] = {}
        self._lock = threading.Lock()

    def __call__(self, receiver: int, sender: int, tag: str) -> queue.Queue:
        with self._lock:
            return self._queues.setdefault((receiver, sender, tag), queue.Queue())


class _ThreadLink:
    """One thread's rank: sends into its peers' mailboxes, receives from its own."""

    def __init__(self, mailboxes: _Mailboxes, rank: int) -> None:
        self.mailboxes, self.rank = mailboxes, rank

    def send(self, peer: int, tag: str, payload: bytes) -> None:
        self.mailboxes(peer, self.rank, tag).put(payload)

    def receive(self, peer: int, tag: str) -> bytes:
        return self.mailboxes(self.rank, peer, tag).get(timeout=60)

    def abort(self, status: int) -> NoReturn:
        raise SystemExit(status)


def test_a_world_of_messages_writes_mpis_bytes(four_ranks: Path, tmp_path: Path) -> None:
    """The same exchanges (PushSum on four schedules, the server's averages) over
    :class:`~proxyfl.comm.world.MessageWorld`, its four ranks threads of this process: every
    saved vector, weight and buffer size is MPI's, byte for byte."""
    from proxyfl.comm.world import MessageWorld
    from tests.proxyfl.mpi_pushsum_check import run_cases

    cases = four_rank_cases(tmp_path)
    mailboxes = _Mailboxes()
    failures: list[BaseException] = []

    def rank(number: int) -> None:
        try:
            world = MessageWorld(_ThreadLink(mailboxes, number), number, 4)
            run_cases(tmp_path, [f"{name}={spec}" for name, spec in cases.items()], world)
        except BaseException as failure:
            failures.append(failure)

    threads = [threading.Thread(target=rank, args=(number,)) for number in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not failures, failures
    for name in cases:
        for number in range(4):
            ours = np.load(tmp_path / name / f"rank_{number}.npz")
            theirs = np.load(four_ranks / name / f"rank_{number}.npz")
            assert sorted(ours.files) == sorted(theirs.files), (name, number)
            for key in theirs.files:
                assert ours[key].tobytes() == theirs[key].tobytes(), (name, number, key)
