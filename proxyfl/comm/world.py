"""A world of ranks over point-to-point messages: what the rank program asks of MPI, for
transports that only carry a message from one participant to another (:mod:`proxyfl.comm.flare`).

The rank program (:mod:`proxyfl.run`, :mod:`proxyfl.loop`, :mod:`proxyfl.comm.exchange`,
:mod:`proxyfl.comm.control`) calls a small part of an mpi4py intracommunicator: its rank
and size, buffer point-to-point calls (``Send``, ``Recv``, ``Isend``, ``Irecv``,
``Sendrecv``, ``Waitall``), ``Bcast``, ``Allgather(v)``, ``Gather(v)``, ``Barrier`` and
``Abort``. :class:`MessageWorld` is that part, built on a :class:`Link` that sends bytes to
a peer and receives the next bytes a peer sent under a tag, so that the same program, its
arithmetic included, runs over another transport and writes the same bytes.

- Messages carry raw bytes of C-contiguous numpy buffers; the receiver copies them into
  the buffer it posted, whose size must match. Nothing is pickled.
- A link buffers what arrives (per sender and tag, in order), so a send completes without
  its receiver: ``Isend`` sends at once, and no exchange pattern can deadlock on sends.
- Collectives are point-to-point in a fixed order, rooted where MPI's are: a gather is
  every rank's bytes to the root, in rank order; a broadcast is the root's bytes to every
  other rank, in rank order; a barrier is a gather then a broadcast of nothing. None of
  them does arithmetic (the server's average sums in :mod:`proxyfl.comm.exchange`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NoReturn, Protocol

import numpy as np


class Link(Protocol):
    """Bytes between the ranks of one job, in order per sender and tag."""

    def send(self, peer: int, tag: str, payload: bytes) -> None:
        """Deliver ``payload`` to ``peer`` (buffered there until it is received)."""

    def receive(self, peer: int, tag: str) -> bytes:
        """The next payload ``peer`` sent under ``tag``; blocks until it is here (a link
        raises if the job is being stopped or the peer is lost)."""

    def abort(self, status: int) -> NoReturn:
        """End the job with ``status``: every rank is told, and this call raises."""


def _bytes_of(buffer: Any) -> bytes:
    array = np.asarray(buffer)
    if not array.flags.c_contiguous:
        raise ValueError("a message buffer must be C-contiguous")
    return array.tobytes()


def _fill(buffer: Any, payload: bytes) -> None:
    array = np.asarray(buffer)
    if len(payload) != array.nbytes:
        raise ValueError(f"a message of {len(payload)} bytes for a buffer of {array.nbytes}")
    array.reshape(-1).view(np.uint8)[:] = np.frombuffer(payload, dtype=np.uint8)


class Request:
    """A posted operation; :meth:`Wait` completes it (a send is complete when posted)."""

    def __init__(self, finish: Any = None) -> None:
        self._finish = finish

    def Wait(self) -> None:
        if self._finish is not None:
            finish, self._finish = self._finish, None
            finish()

    @staticmethod
    def Waitall(requests: Sequence[Request]) -> None:
        for request in requests:
            request.Wait()


class MessageWorld:
    """Ranks ``0..size-1`` of one job over a :class:`Link` (module doc).

    ``local_rank`` and ``local_size`` say how many ranks share this one's machine (a site
    alone on its machine: 0 and 1), for the threads and the GPU it takes."""

    def __init__(
        self, link: Link, rank: int, size: int, local_rank: int = 0, local_size: int = 1
    ) -> None:
        if not 0 <= rank < size or not 0 <= local_rank < local_size:
            raise ValueError(f"rank {rank} of {size}, local {local_rank} of {local_size}")
        self.link = link
        self.rank = rank
        self.size = size
        self.local_rank = local_rank
        self.local_size = local_size

    def Get_rank(self) -> int:
        return self.rank

    def Get_size(self) -> int:
        return self.size

    def local_placement(self) -> tuple[int, int]:
        """``(local rank, local size)``: what ``Split_type(COMM_TYPE_SHARED)`` gives MPI."""
        return self.local_rank, self.local_size

    # -- point to point --------------------------------------------------------------
    def Send(self, buffer: Any, dest: int, tag: int = 0) -> None:
        self.link.send(dest, f"p{tag}", _bytes_of(buffer))

    def Recv(self, buffer: Any, source: int, tag: int = 0) -> None:
        _fill(buffer, self.link.receive(source, f"p{tag}"))

    def Isend(self, buffer: Any, dest: int, tag: int = 0) -> Request:
        self.Send(buffer, dest, tag)
        return Request()

    def Irecv(self, buffer: Any, source: int, tag: int = 0) -> Request:
        return Request(lambda: self.Recv(buffer, source, tag))

    def Sendrecv(
        self, sendbuf: Any, dest: int, sendtag: int = 0, recvbuf: Any = None,
        source: int = 0, recvtag: int = 0,
    ) -> None:  # fmt: skip
        self.Send(sendbuf, dest, sendtag)
        self.Recv(recvbuf, source, recvtag)

    # -- collectives (point to point, in rank order) -------------------------------------
    def _gather(self, payload: bytes, root: int, tag: str) -> list[bytes] | None:
        if self.rank != root:
            self.link.send(root, tag, payload)
            return None
        return [payload if rank == root else self.link.receive(rank, tag)
                for rank in range(self.size)]  # fmt: skip

    def _broadcast(self, payload: bytes | None, root: int, tag: str) -> bytes:
        if self.rank != root:
            return self.link.receive(root, tag)
        assert payload is not None
        for rank in range(self.size):
            if rank != root:
                self.link.send(rank, tag, payload)
        return payload

    def Barrier(self) -> None:
        self._gather(b"", 0, "barrier")
        self._broadcast(b"", 0, "barrier")

    def Bcast(self, buffer: Any, root: int = 0) -> None:
        payload = _bytes_of(buffer) if self.rank == root else None
        received = self._broadcast(payload, root, "bcast")
        if self.rank != root:
            _fill(buffer, received)

    def Gather(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:
        parts = self._gather(_bytes_of(sendbuf), root, "gather")
        if parts is not None:
            _fill(recvbuf, b"".join(parts))

    def Gatherv(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:
        parts = self._gather(_bytes_of(sendbuf), root, "gatherv")
        if parts is not None:
            _fill(_v_buffer(recvbuf, parts), b"".join(parts))

    def Allgather(self, sendbuf: Any, recvbuf: Any) -> None:
        parts = self._gather(_bytes_of(sendbuf), 0, "allgather")
        joined = self._broadcast(b"".join(parts) if parts is not None else None, 0, "allgather")
        _fill(recvbuf, joined)

    def Allgatherv(self, sendbuf: Any, recvbuf: Any) -> None:
        parts = self._gather(_bytes_of(sendbuf), 0, "allgatherv")
        joined = self._broadcast(b"".join(parts) if parts is not None else None, 0, "allgatherv")
        _fill(recvbuf[0], joined)

    def Abort(self, errorcode: int = 1) -> NoReturn:
        self.link.abort(errorcode)


def _v_buffer(recvbuf: Any, parts: list[bytes]) -> Any:
    """The array of a ``[array, counts]`` receive buffer, its counts checked."""
    array, counts = recvbuf[0], np.asarray(recvbuf[1])
    itemsize = np.asarray(array).itemsize
    if [len(part) for part in parts] != [int(count) * itemsize for count in counts]:
        raise ValueError("the gathered messages do not have the counts posted for them")
    return array
