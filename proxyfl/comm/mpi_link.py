"""Bytes between the ranks of an MPI job as a :class:`~proxyfl.comm.world.Link`: what the
clients of :mod:`proxyfl.comm.clients` send to clients of other ranks.

A message is one ``MPI_BYTE`` message under :data:`LINK_TAG` on a duplicate of the job's
communicator (so nothing else of the job can match it): a 4-byte length, the tag's UTF-8
bytes, the payload. A thread of its own receives every message for this rank and files it
in an :class:`~proxyfl.comm.inbox.Inbox` under (sender rank, tag); MPI keeps a pair of
ranks' messages in order, so the inbox does too. Sends are blocking ``MPI_Send``s, which
complete because the peer's receiving thread is always posted.

The receiving thread probes without blocking and sleeps :data:`POLL_S` between empty
probes: a blocking probe spins a core in MPICH's progress loop, the core a rank's clients
train on. This needs MPI initialised with ``MPI_THREAD_MULTIPLE`` (mpi4py's default), which
:class:`MpiLink` checks.
"""

from __future__ import annotations

import struct
import threading
import time
from typing import Any, NoReturn

from proxyfl.comm.inbox import Inbox

LINK_TAG = 201
POLL_S = 0.001  # an empty probe's pause: at most a millisecond added to a message
_LENGTH = struct.Struct("<I")


def frame(tag: str, payload: bytes) -> bytes:
    """A message's bytes on the wire: the tag's length, the tag, the payload."""
    header = tag.encode("utf-8")
    return _LENGTH.pack(len(header)) + header + payload


def unframe(message: bytes | bytearray) -> tuple[str, bytes]:
    """``(tag, payload)`` of :func:`frame`'s bytes."""
    (length,) = _LENGTH.unpack_from(message)
    start = _LENGTH.size
    return bytes(message[start : start + length]).decode("utf-8"), bytes(message[start + length :])


class MpiLink:
    """This rank's end of the job's links over ``comm`` (module doc); :meth:`close` ends
    its receiving thread. Collective to make: every rank duplicates ``comm``."""

    def __init__(self, comm: Any) -> None:
        from mpi4py import MPI

        if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
            raise RuntimeError(
                "several clients on one rank need MPI initialised with MPI_THREAD_MULTIPLE "
                f"(mpi4py's default; this process has level {MPI.Query_thread()})"
            )
        self._mpi = MPI
        self.comm = comm.Dup()
        self.rank = self.comm.Get_rank()
        self.inbox = Inbox()
        self._closing = threading.Event()
        self._receiver = threading.Thread(target=self._receive, name="mpi-link", daemon=True)
        self._receiver.start()

    def send(self, peer: int, tag: str, payload: bytes) -> None:
        message = frame(tag, payload)
        self.comm.Send([message, self._mpi.BYTE], dest=peer, tag=LINK_TAG)

    def receive(self, peer: int, tag: str) -> bytes:
        return self.inbox.take(peer, tag)

    def abort(self, status: int) -> NoReturn:
        self.comm.Abort(status)
        raise SystemExit(status)  # where MPI_Abort returns (the job is already ending)

    def close(self) -> None:
        """Stop receiving (every message this rank's clients wait for has been taken, or
        the rank is being stopped). The duplicate communicator is left to MPI_Finalize:
        freeing it is collective in principle, and a stopped rank's peers may be gone."""
        self._closing.set()
        self._receiver.join()

    def _receive(self) -> None:
        status = self._mpi.Status()
        while not self._closing.is_set():
            if not self.comm.Iprobe(source=self._mpi.ANY_SOURCE, tag=LINK_TAG, status=status):
                time.sleep(POLL_S)
                continue
            sender = status.Get_source()
            message = bytearray(status.Get_count(self._mpi.BYTE))
            self.comm.Recv([message, self._mpi.BYTE], source=sender, tag=LINK_TAG)
            tag, payload = unframe(message)
            self.inbox.deliver(sender, tag, payload)
