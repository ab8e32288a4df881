"""What has arrived at a participant and not yet been taken: the buffer behind every
:class:`~proxyfl.comm.world.Link` whose messages arrive on a thread of their own (FLARE's
aux handlers, :class:`~proxyfl.comm.mpi_link.MpiLink`'s receiver, a co-located client's
send in :mod:`proxyfl.comm.clients`).

Messages are kept per (sender, tag) in arrival order, so a receive names both and a send
never waits for its receiver (a link's contract, :mod:`proxyfl.comm.world`).
"""

from __future__ import annotations

import threading
from collections import defaultdict, deque
from collections.abc import Collection, Hashable
from typing import Any


class JobStopped(BaseException):
    """The job is ending (a rank aborted, or FLARE aborted the job): ``status`` is its
    exit status.

    Not an ``Exception``, as ``KeyboardInterrupt`` is not: it is to a rank at a site what
    the launcher's SIGINT is to an MPI rank whose peer failed — the rank stops, and leaves
    no failure record of its own (the rank, or the site, that failed is the cause; a
    stopped rank's record, written first, was taken for it)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class LostMessage(ValueError):
    """A sender's message arrived with an earlier one missing: the transport lost it (or
    whoever relays it dropped it) though its sender was told it had arrived."""


class Inbox:
    """What has arrived, per (sender, tag), in arrival order; and whether the job is being
    stopped. Safe to fill and take from any thread."""

    def __init__(self) -> None:
        self._messages: defaultdict[tuple[Hashable, str], deque[bytes]] = defaultdict(deque)
        self._last_sequence: dict[Hashable, int] = {}
        self._arrived = threading.Condition()
        self.stopped: JobStopped | None = None

    def deliver(
        self, sender: Hashable, tag: str, payload: bytes, sequence: int | None = None
    ) -> bool:
        """File ``payload``; with ``sequence`` (``sender``'s count of the messages it has
        sent to this participant, for a transport that may deliver one twice), False where
        it was filed before. A sender's messages come in order, one at a time, each once
        the one before it has arrived: a number not above the last one filed is a message
        asked again, and one beyond the next raises :class:`LostMessage`."""
        with self._arrived:
            if sequence is not None:
                last = self._last_sequence.get(sender, 0)
                if sequence <= last:
                    return False
                if sequence != last + 1:
                    raise LostMessage(f"message {last + 1} from {sender} never arrived "
                                      f"(message {sequence} did)")  # fmt: skip
                self._last_sequence[sender] = sequence
            self._messages[(sender, tag)].append(payload)
            self._arrived.notify_all()
            return True

    def keep_from(self, senders: Collection[Hashable]) -> int:
        """Drop what arrived from anyone not in ``senders``; how many messages that was."""
        with self._arrived:
            others = [key for key in self._messages if key[0] not in senders]
            dropped = sum(len(self._messages.pop(key)) for key in others)
            for sender in [s for s in self._last_sequence if s not in senders]:
                del self._last_sequence[sender]
            return dropped

    def stop(self, stopped: JobStopped) -> None:
        """Every wait, now and later, raises ``stopped``."""
        with self._arrived:
            if self.stopped is None:
                self.stopped = stopped
            self._arrived.notify_all()

    def take(self, sender: Hashable, tag: str, aborted: Any = None, poll_s: float = 0.5) -> bytes:
        """The next payload from ``sender`` under ``tag``; raises :class:`JobStopped` once
        the job is being stopped or ``aborted`` (FLARE's abort signal) is triggered."""
        key = (sender, tag)
        with self._arrived:
            while not self._messages[key]:
                if self.stopped is not None:
                    raise self.stopped
                if aborted is not None and aborted.triggered:
                    raise JobStopped(1, "FLARE aborted the job")
                self._arrived.wait(poll_s)
            return self._messages[key].popleft()
