"""Bytes between sites as FLARE aux messages: :class:`AuxLink`, a
:class:`~proxyfl.comm.world.Link` for :class:`~proxyfl.comm.world.MessageWorld`.

A message is a :class:`~nvflare.apis.shareable.Shareable` holding its tag (a header) and
its payload as ``bytes``, which FLARE's serialiser (FOBS, msgpack) carries natively: no
pickled object is ever sent or accepted. The receiving site's handler files the payload
under (sender, tag) in its :class:`Inbox` and replies at once, so a send completes as soon
as the receiver holds the bytes, whether or not it has asked for them yet.

A request can be lost without an answer: one relayed to a site whose job process has not
yet connected to it is dropped there ("no path"), and its sender waited out its whole
timeout (10 minutes, a test's job hung so under load). Each attempt is therefore bounded
(:func:`attempt_timeout_s`) and a send asks again until the receiver has it; each message
carries its sender's sequence number, so one that arrives twice (its answer lost, not the
request) is filed once.

Ending a job: a rank that aborts (:meth:`AuxLink.abort`, MPI_Abort's part) tells the
server, which tells every site (:data:`STOP_TOPIC`); a rank waiting for a message then
raises :class:`JobStopped` instead of waiting for a peer that will never send.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict, deque
from typing import Any, NoReturn

MESSAGE_TOPIC = "proxyfl.message"
ABORT_TOPIC = "proxyfl.abort"  # a site to the server: end the job with a status
STOP_TOPIC = "proxyfl.stop"  # the server to every site: the job is ending
TAG_HEADER = "proxyfl_tag"
SEQUENCE_HEADER = "proxyfl_sequence"  # the sender's count of the messages it has sent
PAYLOAD = "payload"
STATUS = "status"
RANK = "rank"
SERVER = "server"


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


def attempt_timeout_s(payload_bytes: int) -> float:
    """How long one attempt at delivering a message waits for its answer: 10 s, and a
    second a megabyte beyond 10 MB (a ResNet-18 proxy, 45 MB, over a link of 1 MB/s)."""
    return max(10.0, payload_bytes / 1e6)


class Inbox:
    """What has arrived at this site, per (sender site, tag), in arrival order; and
    whether the job is being stopped."""

    def __init__(self) -> None:
        self._messages: defaultdict[tuple[str, str], deque[bytes]] = defaultdict(deque)
        self._last_sequence: dict[str, int] = {}
        self._arrived = threading.Condition()
        self.stopped: JobStopped | None = None

    def deliver(self, sender: str, tag: str, payload: bytes, sequence: int) -> bool:
        """File ``payload``, ``sender``'s message number ``sequence``; False where it was
        filed before (a sender's messages come in order, one at a time: a number not above
        the last one filed is a message asked again)."""
        with self._arrived:
            if sequence <= self._last_sequence.get(sender, 0):
                return False
            self._last_sequence[sender] = sequence
            self._messages[(sender, tag)].append(payload)
            self._arrived.notify_all()
            return True

    def stop(self, stopped: JobStopped) -> None:
        with self._arrived:
            if self.stopped is None:
                self.stopped = stopped
            self._arrived.notify_all()

    def take(self, sender: str, tag: str, aborted: Any, poll_s: float = 0.5) -> bytes:
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


class AuxLink:
    """Rank ``rank`` of the job whose ranks are the sites ``sites`` (in rank order)."""

    def __init__(
        self, engine: Any, fl_ctx: Any, sites: list[str], rank: int, inbox: Inbox,
        aborted: Any = None, send_timeout_s: float = 600.0,
    ) -> None:  # fmt: skip
        self.engine, self.fl_ctx = engine, fl_ctx
        self.sites, self.rank, self.inbox = sites, rank, inbox
        self.aborted = aborted
        self.send_timeout_s = send_timeout_s
        self.sent = 0  # messages sent: the last one's sequence number

    def send(self, peer: int, tag: str, payload: bytes) -> None:
        """Deliver ``payload``; a site whose job has not started yet (the sites start theirs
        one by one), or an attempt that had no answer in time, is asked again until it has
        taken it, for at most ``send_timeout_s``, or until the job is being stopped."""
        from nvflare.apis.fl_constant import ReturnCode
        from nvflare.apis.shareable import Shareable

        self.sent += 1
        request = Shareable()
        request.set_header(TAG_HEADER, tag)
        request.set_header(SEQUENCE_HEADER, self.sent)
        request[PAYLOAD] = payload
        site = self.sites[peer]
        started = time.perf_counter()
        while True:
            replies = self.engine.send_aux_request(
                targets=[site], topic=MESSAGE_TOPIC, request=request,
                timeout=attempt_timeout_s(len(payload)), fl_ctx=self.fl_ctx,
            )  # fmt: skip
            reply = replies.get(site)
            code = reply.get_return_code() if reply is not None else "no reply"
            if code == ReturnCode.OK:
                break
            if self.inbox.stopped is not None:
                raise self.inbox.stopped
            if self.aborted is not None and self.aborted.triggered:
                raise JobStopped(1, "FLARE aborted the job")
            if code == ReturnCode.BAD_REQUEST_DATA or (
                time.perf_counter() - started > self.send_timeout_s
            ):
                raise JobStopped(1, f"site {site} (rank {peer}) did not take a message: {code}")
            time.sleep(0.2)

    def receive(self, peer: int, tag: str) -> bytes:
        return self.inbox.take(self.sites[peer], tag, self.aborted)

    def abort(self, status: int) -> NoReturn:
        from nvflare.apis.shareable import Shareable

        request = Shareable()
        request[STATUS] = int(status)
        request[RANK] = self.rank
        self.engine.send_aux_request(targets=[SERVER], topic=ABORT_TOPIC, request=request,
                                     timeout=30.0, fl_ctx=self.fl_ctx)  # fmt: skip
        raise JobStopped(status, f"rank {self.rank} ended the job with status {status}")
