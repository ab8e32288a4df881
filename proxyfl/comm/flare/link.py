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

Each message is signed by its sender and checked by its receiver
(:mod:`proxyfl.comm.flare.signing`): the sender a handler files a message under is the one
whose certificate signed it, never the name FLARE's peer context carries. One refused
(:data:`UNVERIFIED`) is not asked again: its sender's kit is not of this project.

Ending a job: a rank that aborts (:meth:`AuxLink.abort`, MPI_Abort's part) tells the
server, which tells every site (:data:`STOP_TOPIC`); a rank waiting for a message then
raises :class:`JobStopped` instead of waiting for a peer that will never send.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, NoReturn

from proxyfl.comm.flare.signing import SENDER_HEADER, Credentials, UnverifiedSender
from proxyfl.comm.inbox import Inbox, JobStopped

MESSAGE_TOPIC = "proxyfl.message"
ABORT_TOPIC = "proxyfl.abort"  # a site to the server: end the job with a status
STOP_TOPIC = "proxyfl.stop"  # the server to every site: the job is ending
TAG_HEADER = "proxyfl_tag"
SEQUENCE_HEADER = "proxyfl_sequence"  # the sender's count of its messages to the receiver
PAYLOAD = "payload"
STATUS = "status"
RANK = "rank"
SERVER = "server"
# a handler's answer to a message whose sender is not proven (signing's module doc)
UNVERIFIED = "PROXYFL_UNVERIFIED_SENDER"
REASON = "reason"  # in such an answer: why
REASON_CHARS = 300  # of a refusal's reason, the most a sender repeats


class Refusals:
    """What a receiver (``receiver``: its name, in the answer) answers a message whose sender
    is not proven, and says of it in its log: the first ``in_full`` refusals, then every
    ``every``-th with their count, the name the message claimed cut to 100 characters (a
    flood of forgeries fills no disk)."""

    def __init__(self, receiver: str, log: logging.Logger, in_full: int = 10,
                 every: int = 1000) -> None:  # fmt: skip
        self.receiver, self.log = receiver, log
        self.in_full, self.every = in_full, every
        self.count = 0
        self._lock = threading.Lock()  # FLARE may run handlers on several threads

    def answer(self, request: Any, topic: str, reason: UnverifiedSender) -> Any:
        from nvflare.apis.shareable import make_reply

        with self._lock:
            self.count += 1
            count = self.count
        if count <= self.in_full or count % self.every == 0:
            claimed = repr(request.get_header(SENDER_HEADER))[:100]
            self.log.error("%s refused a %s request in the name of %s: %s (%d refused so far)",
                           self.receiver, topic, claimed, reason, count)  # fmt: skip
        reply = make_reply(UNVERIFIED)
        reply[REASON] = f"{self.receiver}: {reason}"
        return reply


def attempt_timeout_s(payload_bytes: int) -> float:
    """How long one attempt at delivering a message waits for its answer: 10 s, and a
    second a megabyte beyond 10 MB (a ResNet-18 proxy, 45 MB, over a link of 1 MB/s)."""
    return max(10.0, payload_bytes / 1e6)


class AuxLink:
    """Rank ``rank`` of the job ``job`` whose ranks are the sites ``sites`` (in rank order),
    signing as ``credentials`` say."""

    def __init__(
        self, engine: Any, fl_ctx: Any, sites: list[str], rank: int, inbox: Inbox,
        credentials: Credentials, job: str, aborted: Any = None, send_timeout_s: float = 600.0,
    ) -> None:  # fmt: skip
        self.engine, self.fl_ctx = engine, fl_ctx
        self.sites, self.rank, self.inbox = sites, rank, inbox
        self.credentials, self.job = credentials, job
        self.aborted = aborted
        self.send_timeout_s = send_timeout_s
        self.sent: dict[int, int] = {}  # per peer, messages sent: the last one's number

    def send(self, peer: int, tag: str, payload: bytes) -> None:
        """Deliver ``payload``; a site whose job has not started yet (the sites start theirs
        one by one), or an attempt that had no answer in time, is asked again until it has
        taken it, for at most ``send_timeout_s``, or until the job is being stopped."""
        from nvflare.apis.fl_constant import ReturnCode
        from nvflare.apis.shareable import Shareable

        sequence = self.sent[peer] = self.sent.get(peer, 0) + 1
        request = Shareable()
        request.set_header(TAG_HEADER, tag)
        request.set_header(SEQUENCE_HEADER, sequence)
        request[PAYLOAD] = payload
        site = self.sites[peer]
        self.credentials.sign(request, self.job, MESSAGE_TOPIC, site, (tag, sequence), payload)
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
            if code == UNVERIFIED:  # its reason is the peer's word: one line, bounded
                reason = " ".join(str(reply.get(REASON)).split())[:REASON_CHARS]
                raise JobStopped(1, f"site {site} (rank {peer}) refused this site's message, "
                                 f"saying: {reason}")  # fmt: skip
            if code == ReturnCode.BAD_REQUEST_DATA or (
                time.perf_counter() - started > self.send_timeout_s
            ):
                raise JobStopped(1, f"site {site} (rank {peer}) did not take a message: {code}")
            time.sleep(0.2)

    def receive(self, peer: int, tag: str) -> bytes:
        return self.inbox.take(self.sites[peer], tag, self.aborted)

    def abort(self, status: int) -> NoReturn:
        """Tell the server this rank ends the job with ``status`` (signed), again until it has the
        message (it then tells every site: the others would otherwise wait for this
        rank's next message for ever), for at most ``send_timeout_s``, or until the job is
        being stopped anyway; then raise :class:`JobStopped`."""
        from nvflare.apis.fl_constant import ReturnCode
        from nvflare.apis.shareable import Shareable

        request = Shareable()
        request[STATUS] = int(status)
        request[RANK] = self.rank
        self.credentials.sign(request, self.job, ABORT_TOPIC, SERVER, (int(status), self.rank))
        started = time.perf_counter()
        while True:
            replies = self.engine.send_aux_request(targets=[SERVER], topic=ABORT_TOPIC,
                                                   request=request, timeout=30.0,
                                                   fl_ctx=self.fl_ctx)  # fmt: skip
            reply = replies.get(SERVER)
            # refused: told again it would be refused again (the server ends the job on
            # this rank's failed answer all the same)
            if reply is not None and reply.get_return_code() in (ReturnCode.OK, UNVERIFIED):
                break
            if self.inbox.stopped is not None or (
                self.aborted is not None and self.aborted.triggered
            ) or time.perf_counter() - started > self.send_timeout_s:  # fmt: skip
                break
            time.sleep(0.2)
        raise JobStopped(status, f"rank {self.rank} ended the job with status {status}")
