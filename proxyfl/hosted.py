"""A rank that hosts several clients (:mod:`proxyfl.comm.clients`): one thread per client,
each running the rank program (:func:`proxyfl.run.run_rank`) as a rank of the clients'
world, passing one :class:`~proxyfl.comm.clients.Baton`.

What is the process's stays once per rank, here or in :func:`proxyfl.run.main`: the
launcher's signals (a ``KeyboardInterrupt`` reaches this, the main thread, which ends the
rank as :func:`proxyfl.run.stopped` does), the fault record (one per rank, named by the
rank and listing its clients), the log's prefix (``[rank R client C]``), torch's
threads, torch's global generators (each client has its own, swapped at the baton:
:class:`TorchGenerators`), the device (the clients take turns on it: :class:`DeviceTurns`,
a waiting client's models and optimisers on the host). Threads are the node's cores
shared by the node's *clients* (:func:`~proxyfl.engine.runtime.threads_by_placement` over
them), the same count whatever their placement, because a CPU's result depends on it.

How the rank ends: once every client has ended, with 0, or with the ``SystemExit`` the
clients raised together (bad input: 2; the test hook's stop: 3). A client that fails
otherwise ends the rank at once with its exception, as a rank's own failure does (its
clients that wait for it would wait for ever); a client that aborts the job ends it there.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from proxyfl.comm.clients import Baton, ClientLink, ClientPlacement, ClientWorld
from proxyfl.comm.inbox import Inbox
from proxyfl.comm.world import Link
from proxyfl.engine.access import ACCESS_LOG
from proxyfl.engine.residency import DeviceResidency
from proxyfl.launch.progress import rank_line_format

logger = logging.getLogger(__name__)

RunClient = Callable[[Any, Sequence[str] | None], int]


class TorchGenerators:
    """A client's own torch global generators (the CPU's, and the CUDA devices' once CUDA is
    initialised): :class:`~proxyfl.comm.clients.ClientState`. Each client starts from the
    state the process started with, as it would in a process of its own."""

    def __init__(self, start: torch.Tensor) -> None:
        self._cpu = start.clone()
        self._cuda: list[torch.Tensor] | None = None

    def keep(self) -> None:
        self._cpu = torch.get_rng_state()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            self._cuda = torch.cuda.get_rng_state_all()

    def put_back(self) -> None:
        torch.set_rng_state(self._cpu)
        if self._cuda is not None:
            torch.cuda.set_rng_state_all(self._cuda)


class DeviceTurns:
    """A rank's clients take turns on its device (:mod:`proxyfl.engine.residency`): the
    client that computes has its state there, and the one there before it moves its state
    to the host when another takes its turn, not each time it waits: a client that has the
    baton back before any other had it moves nothing."""

    def __init__(self) -> None:
        self._resident: DeviceResidency | None = None

    def take(self, residency: DeviceResidency | None) -> None:
        """``residency``'s client computes now (``None``: one whose models do not exist yet,
        or never will)."""
        if self._resident is not None and self._resident is not residency:
            self._resident.to_host()
        if residency is not None:
            residency.to_device()
        self._resident = residency

    def leave(self, residency: DeviceResidency | None) -> None:
        """``residency``'s client has ended: it is nobody's to move again, and its state
        leaves the device now (to the host, freed there with the client's objects), not
        when the cyclic collector frees them."""
        if self._resident is residency:
            self._resident = None
        if residency is not None:
            residency.to_host()


class HostedClientState:
    """A hosted client's :class:`~proxyfl.comm.clients.ClientState`: its torch generators,
    and its turn on the device once it holds models there."""

    def __init__(self, start: torch.Tensor, turns: DeviceTurns) -> None:
        self.generators = TorchGenerators(start)
        self.turns = turns
        self.residency: DeviceResidency | None = None

    def keep(self) -> None:
        self.generators.keep()

    def put_back(self) -> None:
        self.turns.take(self.residency)
        self.generators.put_back()

    def hold(self, residency: DeviceResidency) -> None:
        self.residency = residency
        self.turns.take(residency)

    def end(self) -> None:
        """The client has ended: its state leaves the device (:meth:`DeviceTurns.leave`).
        That move only frees the device early, so it decides nothing: where it fails (a
        CUDA error), the client's own outcome stands and the failure is logged."""
        residency, self.residency = self.residency, None
        try:
            self.turns.leave(residency)
        except Exception as error:  # the device's error, which the next client meets too
            logger.warning("the ended client's state could not leave the device: %s", error)


def node_clients(world: Any, placement: ClientPlacement) -> list[int]:
    """The clients hosted on this rank's node (the ranks of MPI's shared-memory split of
    ``world``), in client order."""
    from mpi4py import MPI

    node = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.Get_rank())
    try:
        ranks = np.empty(node.Get_size(), dtype=np.int64)
        node.Allgather(np.array([world.Get_rank()], dtype=np.int64), ranks)
    finally:
        node.Free()
    return [client for rank in sorted(ranks.tolist()) for client in placement.clients_of(rank)]


class _ClientPrefix(logging.Filter):
    """Adds ``place`` to every record: ``rank R client C`` on client C's own thread,
    ``rank R`` on any other (the link's receiver, a loader's or a checkpoint writer's)."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank
        self.clients: dict[int, int] = {}  # thread ident -> client

    def filter(self, record: logging.LogRecord) -> bool:
        client = self.clients.get(record.thread or 0)
        record.place = f"rank {self.rank}" + (f" client {client}" if client is not None else "")
        return True


def _prefix_logs(rank: int) -> _ClientPrefix:
    prefix = _ClientPrefix(rank)
    for handler in logging.getLogger().handlers:
        handler.addFilter(prefix)
        if handler.formatter is not None:
            handler.setFormatter(logging.Formatter(rank_line_format("%(place)s")))
    return prefix


def host_clients(
    rank_link: Link,
    rank: int,
    placement: ClientPlacement,
    on_node: Sequence[int],
    argv: Sequence[str] | None,
    run_client: RunClient,
) -> int:
    """Run rank ``rank``'s clients of ``placement`` in turn (module doc); ``on_node``: the
    clients of this rank's node. Returns the rank's exit status."""
    mine = placement.clients_of(rank)
    baton = Baton()
    inboxes = {client: Inbox() for client in mine}
    outcomes: queue.Queue[tuple[int, int | BaseException]] = queue.Queue()
    prefix = _prefix_logs(rank)
    start = torch.get_rng_state()  # every client's, as a process of its own starts with
    turns = DeviceTurns()

    def client_thread(client: int) -> None:
        prefix.clients[threading.get_ident()] = client
        ACCESS_LOG.on_behalf_of(client)
        state = HostedClientState(start, turns)
        link = ClientLink(client, placement, rank, rank_link, inboxes, baton, state)
        world = ClientWorld(link, on_node.index(client), len(on_node))
        try:
            with baton:
                state.put_back()
                try:
                    outcome: int | BaseException = run_client(world, argv)
                finally:
                    state.end()
        except BaseException as ended:  # the main thread decides what ends the rank
            outcome = ended
        outcomes.put((client, outcome))

    logger.info("rank %d hosts clients %d-%d of %d (%d rank(s))",
                rank, mine[0], mine[-1], placement.clients, placement.ranks)  # fmt: skip
    for client in mine:
        threading.Thread(target=client_thread, args=(client,), name=f"client-{client}",
                         daemon=True).start()  # fmt: skip
    ended: dict[int, int | BaseException] = {}
    while len(ended) < len(mine):
        client, outcome = outcomes.get()
        if isinstance(outcome, BaseException) and not isinstance(outcome, SystemExit):
            raise outcome
        ended[client] = outcome
    exits = [outcome for _, outcome in sorted(ended.items()) if isinstance(outcome, SystemExit)]
    if exits:
        raise exits[0]
    return max(int(status) for status in ended.values())  # type: ignore[arg-type]
