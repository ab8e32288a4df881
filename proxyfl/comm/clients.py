"""Many clients on few ranks: a world of C clients over a job of R ≤ C ranks.

A job of R ranks trains C clients, rank r hosting a contiguous block of them
(:class:`ClientPlacement`: ⌈C/R⌉ clients on each of the first C mod R ranks, ⌊C/R⌋ on the
others). Each client is a rank of its own world, a :class:`~proxyfl.comm.world.MessageWorld`
of size C over a :class:`ClientLink`, so that the rank program runs unchanged once per
client, with the client's index as its rank: its models, optimisers, random streams, privacy
accountant, checkpoints and records are the client's own and are named by it, whatever
rank hosts it.

- A message between two clients of one rank is handed over in memory: filed in the
  receiver's :class:`~proxyfl.comm.inbox.Inbox`, never through the transport.
- A message to a client of another rank goes over the rank-level link (MPI's
  :class:`~proxyfl.comm.mpi_link.MpiLink`, or any other
  :class:`~proxyfl.comm.world.Link`) to its host, tagged with both clients and the
  client-level tag, so that each (sender, receiver, tag) keeps its order.
- The clients of a rank run in threads that pass a :class:`Baton`: one computes at a time,
  and a client hands the baton on only while it waits for a message. A rank therefore
  trains its clients in turn, each round, and each client's arithmetic is the one it does
  alone on a rank of its own: the same bytes on any placement.
- What a process holds once but a client's computation reads (torch's global generator,
  which seeds a model's initialisation and is kept in its checkpoints) is each client's
  own: its :class:`ClientState` is kept when it hands the baton on and put back when it
  has the baton again.

The same program then sends every message it sent before, to the same client, and logs
it in its send log the same way: the send log, like every record, does not depend on the
placement.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn, Protocol

from proxyfl.comm.inbox import Inbox
from proxyfl.comm.world import Link, MessageWorld

if TYPE_CHECKING:
    from proxyfl.engine.residency import DeviceResidency


@dataclass(frozen=True)
class ClientPlacement:
    """``clients`` clients over ``ranks`` ranks, in contiguous blocks (module doc)."""

    clients: int
    ranks: int

    def __post_init__(self) -> None:
        if not 1 <= self.ranks <= self.clients:
            raise ValueError(f"{self.clients} client(s) cannot be placed on {self.ranks} rank(s)")

    def clients_of(self, rank: int) -> range:
        """The clients rank ``rank`` hosts."""
        if not 0 <= rank < self.ranks:
            raise ValueError(f"rank {rank} of {self.ranks}")
        base, extra = divmod(self.clients, self.ranks)
        start = rank * base + min(rank, extra)
        return range(start, start + base + (1 if rank < extra else 0))

    def rank_of(self, client: int) -> int:
        """The rank that hosts ``client``."""
        if not 0 <= client < self.clients:
            raise ValueError(f"client {client} of {self.clients}")
        base, extra = divmod(self.clients, self.ranks)
        if client < extra * (base + 1):
            return client // (base + 1)
        return extra + (client - extra * (base + 1)) // base

    def as_record(self) -> list[list[int]]:
        """The clients of each rank, in rank order (what ``machine.json`` records)."""
        return [list(self.clients_of(rank)) for rank in range(self.ranks)]


class Baton:
    """One client of a rank computes at a time: a client's thread holds the baton while it
    runs and lets go of it only while it waits (:meth:`released`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __enter__(self) -> Baton:
        self._lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    @contextlib.contextmanager
    def released(self) -> Iterator[None]:
        """Another client may run inside the block; this one has the baton again after it."""
        self._lock.release()
        try:
            yield
        finally:
            self._lock.acquire()


class ClientState(Protocol):
    """The part of a process's state that is each client's own while it runs."""

    def keep(self) -> None:
        """Note the running client's state (it is about to hand the baton on)."""

    def put_back(self) -> None:
        """Make the noted state the process's again (the client has the baton back)."""

    def hold(self, residency: DeviceResidency) -> None:
        """The client's models and optimisers, from now on off the device while the rank's
        other clients compute (:mod:`proxyfl.engine.residency`)."""


class NoClientState:
    """Clients that share nothing of their process's state."""

    def keep(self) -> None:
        return None

    def put_back(self) -> None:
        return None

    def hold(self, residency: DeviceResidency) -> None:
        return None


def routed_tag(sender: int, receiver: int, tag: str) -> str:
    """The rank-level tag of a client-level message: both clients, then its own tag."""
    return f"{sender}>{receiver}:{tag}"


class ClientLink:
    """Client ``client``'s :class:`~proxyfl.comm.world.Link`, hosted by ``rank``: in memory
    to the clients of ``inboxes`` (this rank's, by client), over ``rank_link`` to the
    others (module doc). Every wait for a message lets go of ``baton``, ``state`` kept
    meanwhile."""

    def __init__(
        self,
        client: int,
        placement: ClientPlacement,
        rank: int,
        rank_link: Link,
        inboxes: Mapping[int, Inbox],
        baton: Baton,
        state: ClientState | None = None,
    ) -> None:
        if placement.rank_of(client) != rank or set(inboxes) != set(placement.clients_of(rank)):
            raise ValueError(f"client {client} is not one of rank {rank}'s clients")
        self.client = client
        self.placement = placement
        self.rank = rank
        self.rank_link = rank_link
        self.inboxes = inboxes
        self.baton = baton
        self.state = state if state is not None else NoClientState()

    def send(self, peer: int, tag: str, payload: bytes) -> None:
        if peer in self.inboxes:
            self.inboxes[peer].deliver(self.client, tag, payload)
        else:
            host = self.placement.rank_of(peer)
            self.rank_link.send(host, routed_tag(self.client, peer, tag), payload)

    def receive(self, peer: int, tag: str) -> bytes:
        self.state.keep()
        try:
            with self.baton.released():
                if peer in self.inboxes:
                    return self.inboxes[self.client].take(peer, tag)
                host = self.placement.rank_of(peer)
                return self.rank_link.receive(host, routed_tag(peer, self.client, tag))
        finally:
            self.state.put_back()

    def abort(self, status: int) -> NoReturn:
        self.rank_link.abort(status)


class ClientWorld(MessageWorld):
    """The world of ``link``'s client: a :class:`~proxyfl.comm.world.MessageWorld` of the
    placement's clients, knowing which rank hosts each (named in errors and records).
    ``local_rank`` and ``local_size``: the client's place among its node's clients."""

    link: ClientLink

    def __init__(self, link: ClientLink, local_rank: int, local_size: int) -> None:
        super().__init__(link, link.client, link.placement.clients, local_rank, local_size)
        self.placement = link.placement
        self.host_rank = link.rank

    def hold_on_device(self, residency: DeviceResidency) -> None:
        """The client's models and optimisers leave the device while the others of its
        rank compute (:meth:`ClientState.hold`)."""
        self.link.state.hold(residency)
