"""Many clients on few ranks, in one process: the placement of clients on ranks, and the
links between them (in memory on a rank, over a rank-level link between ranks) with the
baton that lets one client of a rank compute at a time (proxyfl.comm.clients)."""

from __future__ import annotations

import threading
from typing import NoReturn

import numpy as np
import pytest

from proxyfl.comm.clients import Baton, ClientLink, ClientPlacement, routed_tag
from proxyfl.comm.inbox import Inbox
from proxyfl.comm.mpi_link import frame, unframe
from proxyfl.comm.world import MessageWorld


@pytest.mark.parametrize("clients", range(1, 23))
def test_every_client_is_placed_once_in_blocks_of_floor_or_ceiling(clients: int) -> None:
    for ranks in range(1, clients + 1):
        placement = ClientPlacement(clients, ranks)
        blocks = placement.as_record()
        assert [c for block in blocks for c in block] == list(range(clients))
        sizes = [len(block) for block in blocks]
        assert set(sizes) <= {clients // ranks, -(-clients // ranks)}
        assert sizes == sorted(sizes, reverse=True)  # the larger blocks first
        for rank, block in enumerate(blocks):
            assert all(placement.rank_of(client) == rank for client in block)


def test_a_placement_needs_a_client_for_every_rank() -> None:
    with pytest.raises(ValueError, match="cannot be placed"):
        ClientPlacement(2, 3)
    with pytest.raises(ValueError):
        ClientPlacement(4, 2).rank_of(4)


def test_a_frame_carries_its_tag_and_payload() -> None:
    payload = np.arange(7, dtype=np.float32).tobytes()
    assert unframe(frame("0>3:p101", payload)) == ("0>3:p101", payload)
    assert unframe(bytearray(frame("ü", b""))) == ("ü", b"")


class _RankLink:
    """Ranks of one process: a rank-level link of in-memory inboxes, counting what it
    carries (the transport that a rank's clients must use for other ranks' clients only)."""

    def __init__(self, inboxes: dict[int, Inbox], rank: int) -> None:
        self.inboxes, self.rank = inboxes, rank
        self.carried: list[str] = []

    def send(self, peer: int, tag: str, payload: bytes) -> None:
        assert peer != self.rank, "a rank's own clients are served in memory"
        self.carried.append(tag)
        self.inboxes[peer].deliver(self.rank, tag, payload)

    def receive(self, peer: int, tag: str) -> bytes:
        return self.inboxes[self.rank].take(peer, tag)

    def abort(self, status: int) -> NoReturn:
        raise SystemExit(status)


def _run_ring(placement: ClientPlacement, rounds: int) -> tuple[dict[int, list[float]],
                                                               list[_RankLink], int]:  # fmt: skip
    """Every client passes a number round a ring, ``rounds`` times, each rank's clients in
    threads passing their rank's baton; returns what each client ended with, the rank
    links and the most clients of one rank that ever ran at once."""
    rank_inboxes = {rank: Inbox() for rank in range(placement.ranks)}
    rank_links = [_RankLink(rank_inboxes, rank) for rank in range(placement.ranks)]
    batons = [Baton() for _ in range(placement.ranks)]
    client_inboxes = {rank: {c: Inbox() for c in placement.clients_of(rank)}
                      for rank in range(placement.ranks)}  # fmt: skip
    running = [0] * placement.ranks
    most = [0]
    lock = threading.Lock()
    seen: dict[int, list[float]] = {}

    def client(c: int) -> None:
        rank = placement.rank_of(c)
        link = ClientLink(c, placement, rank, rank_links[rank], client_inboxes[rank],
                          batons[rank])  # fmt: skip
        world = MessageWorld(link, c, placement.clients)
        value = np.array([float(c)])
        received = np.empty(1)
        with batons[rank]:
            for _ in range(rounds):
                with lock:
                    running[rank] += 1
                    most[0] = max(most[0], running[rank])
                total = float(np.sum(np.arange(20_000.0)))  # some work while it holds the baton
                assert total > 0
                with lock:
                    running[rank] -= 1
                world.Sendrecv(value, dest=(c + 1) % placement.clients, recvbuf=received,
                               source=(c - 1) % placement.clients)  # fmt: skip
                value = received.copy()
                seen.setdefault(c, []).append(float(value[0]))

    threads = [threading.Thread(target=client, args=(c,)) for c in range(placement.clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
        assert not thread.is_alive(), "a client waits for ever"
    return seen, rank_links, most[0]


@pytest.mark.parametrize("ranks", [1, 2, 3, 5])
def test_clients_of_a_rank_run_in_turn_and_their_messages_arrive_wherever_they_are(
    ranks: int,
) -> None:
    placement = ClientPlacement(5, ranks)
    seen, links, most = _run_ring(placement, rounds=4)
    # each round every value moved one client on, whatever the placement
    for c in range(5):
        assert seen[c] == [float((c - r) % 5) for r in range(1, 5)]
    assert most == 1  # one client of a rank computes at a time
    # only messages between ranks went over the ranks' link, tagged with both clients
    crossing = [c for c in range(5) if placement.rank_of(c) != placement.rank_of((c + 1) % 5)]
    carried = sorted(tag for link in links for tag in link.carried)
    assert carried == sorted(routed_tag(c, (c + 1) % 5, "p0") for c in crossing for _ in range(4))


def test_a_client_link_refuses_a_client_of_another_rank() -> None:
    placement = ClientPlacement(4, 2)
    inboxes = {c: Inbox() for c in placement.clients_of(0)}
    rank_link = _RankLink({0: Inbox(), 1: Inbox()}, 0)
    with pytest.raises(ValueError, match="not one of rank 0's clients"):
        ClientLink(2, placement, 0, rank_link, inboxes, Baton())
