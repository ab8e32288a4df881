"""FLARE's aux messages between sites, when a request or its answer is lost: the sender
asks again within a bounded wait, and the receiver files each message once.

The relay below stands in for FLARE's engine on a link that loses what a loaded FLARE lost
(a request relayed to a site whose job process had not yet connected: dropped, no answer);
each request that arrives is handled by the real :class:`RankExecutor`'s handler, and the
sending side is the real :class:`AuxLink`. ``test_flare.py`` runs the whole of it over
FLARE itself.
"""

from __future__ import annotations

from typing import Any

import pytest
from nvflare.apis.fl_constant import ReservedKey
from nvflare.apis.shareable import Shareable, make_reply

from proxyfl.comm.flare.link import (
    ABORT_TOPIC,
    MESSAGE_TOPIC,
    SERVER,
    STATUS,
    AuxLink,
    Inbox,
    JobStopped,
    attempt_timeout_s,
)
from proxyfl.sites.executor import RankExecutor


class _LossyRelay:
    """Delivers each request to ``receiver``'s handler as coming from ``sender``, but for
    the faults planned in turn: ``"request"`` (lost before it arrives), ``"answer"`` (it
    arrives and is filed, its answer is lost); an empty plan delivers."""

    def __init__(self, receiver: RankExecutor, sender: str, plan: list[str]) -> None:
        self.receiver, self.sender, self.plan = receiver, sender, plan
        self.timeouts: list[float] = []

    def send_aux_request(self, targets: list[str], topic: str, request: Shareable,
                         timeout: float, fl_ctx: Any) -> dict[str, Shareable]:  # fmt: skip
        self.timeouts.append(timeout)
        fault = self.plan.pop(0) if self.plan else None
        if fault == "request":
            return {}  # no answer within the timeout
        arrived = Shareable()  # what the receiving site's engine hands its handler
        arrived.set_header("proxyfl_tag", request.get_header("proxyfl_tag"))
        arrived.set_header("proxyfl_sequence", request.get_header("proxyfl_sequence"))
        arrived.update(request)
        arrived.set_peer_props({ReservedKey.IDENTITY_NAME: self.sender})
        answer = self.receiver._on_message(MESSAGE_TOPIC, arrived, None)
        return {} if fault == "answer" else {targets[0]: answer}


def test_a_lost_request_or_answer_is_asked_again_and_filed_once() -> None:
    receiver = RankExecutor()
    relay = _LossyRelay(receiver, "centre-0", ["request", "answer", "request"])
    link = AuxLink(relay, None, ["centre-0", "centre-1"], 0, Inbox())
    link.send(1, "p7", b"first")  # lost, then filed with its answer lost, then answered
    link.send(1, "p7", b"second")  # lost once
    link.send(1, "p9", b"third")
    assert len(relay.timeouts) == 6
    # each attempt waits a bounded time, not the send's whole budget (600 s)
    assert set(relay.timeouts) == {attempt_timeout_s(5), attempt_timeout_s(6)} == {10.0}
    taken = [receiver.inbox.take("centre-0", tag, None) for tag in ("p7", "p7", "p9")]
    assert taken == [b"first", b"second", b"third"]
    # nothing more: "first", filed twice on the wire, is in the inbox once
    assert not any(receiver.inbox._messages.values())


def test_a_large_message_waits_longer_than_a_small_one() -> None:
    assert attempt_timeout_s(1_000) == 10.0
    assert attempt_timeout_s(45_000_000) == 45.0  # a ResNet-18 proxy at 1 MB/s


def test_a_message_without_its_sequence_number_is_refused() -> None:
    receiver = RankExecutor()
    request = Shareable()
    request.set_header("proxyfl_tag", "p1")
    request["payload"] = b"x"
    request.set_peer_props({ReservedKey.IDENTITY_NAME: "centre-0"})
    answer = receiver._on_message(MESSAGE_TOPIC, request, None)
    assert answer.get_return_code() == "BAD_REQUEST_DATA"


class _LossyServer:
    """Stands in for FLARE's engine between a rank and the server's controller: the
    aborts it is given are lost (no answer) ``lost`` times, then answered."""

    def __init__(self, lost: int) -> None:
        self.lost, self.aborts = lost, []

    def send_aux_request(self, targets: list[str], topic: str, request: Shareable,
                         timeout: float, fl_ctx: Any) -> dict[str, Shareable]:  # fmt: skip
        assert (targets, topic) == ([SERVER], ABORT_TOPIC)
        self.aborts.append(request[STATUS])
        if len(self.aborts) <= self.lost:
            return {}
        return {SERVER: make_reply("OK")}


def test_a_lost_abort_is_told_again_until_the_server_has_it() -> None:
    """A rank that ends the job (exit 2) and whose abort got no answer tells the server
    again: else no site hears the job is ending, and the others wait for this rank's next
    message for ever. Once the server has it, the rank stops, with its status."""
    server = _LossyServer(lost=2)
    link = AuxLink(server, None, ["centre-0", "centre-1"], 1, Inbox())
    with pytest.raises(JobStopped) as stopped:
        link.abort(2)
    assert server.aborts == [2, 2, 2] and stopped.value.status == 2
