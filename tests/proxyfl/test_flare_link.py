"""FLARE's aux messages between sites and the server: a lost request or answer is asked
again within a bounded wait and filed once; a message is filed under the sender its
signature proves, never the name its peer context carries; only the server stops a job,
and an abort counts only from the site of the rank it names.

The relay below stands in for FLARE's engine: a request is serialised as FLARE sends it
(FOBS), arrives with whatever peer context the sending process wrote (a forging site's
process writes another site's name there) and is handled by the receiver's real handler
(:class:`RankExecutor`'s, :class:`RunController`'s); the sending side is the real
:class:`AuxLink`, signing with the keys of kits made by ``nvflare provision``.
``test_flare.py`` runs the whole of it over FLARE itself.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import pytest
from nvflare.apis.client import Client
from nvflare.apis.controller_spec import ClientTask, Task
from nvflare.apis.fl_constant import ReservedKey
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import Shareable, make_reply
from nvflare.apis.utils.decomposers import flare_decomposers
from nvflare.fuel.utils import fobs

from proxyfl.comm.flare.link import (
    ABORT_TOPIC,
    MESSAGE_TOPIC,
    SERVER,
    STATUS,
    STOP_TOPIC,
    UNVERIFIED,
    AuxLink,
    Inbox,
    JobStopped,
    attempt_timeout_s,
)
from proxyfl.comm.flare.signing import EVERY_SITE, SENDER_HEADER, Credentials
from proxyfl.engine.validation import EXIT_BAD_INPUT
from proxyfl.launch.kits import Kits
from proxyfl.sites.controller import RunController
from proxyfl.sites.executor import ERROR, PLACEMENT, RANK_TASK, SITES, RankExecutor

JOB = "job-7"
SITE_NAMES = ["centre-0", "centre-1", "centre-2"]
Handler = Callable[[str, Shareable, Any], Shareable]


def _wire(shareable: Shareable) -> Shareable:
    flare_decomposers.register()
    return fobs.loads(fobs.dumps(shareable))


class _Relay:
    """FLARE's engine, as the module doc says. ``claimed``: the name the sending process
    wrote in its peer context; ``forge``: what a forging process changes in a request
    before it goes; ``plan``: faults in turn, ``"request"`` (lost before it arrives) or
    ``"answer"`` (it arrives and is handled, its answer is lost) or ``"dropped"`` (the
    relay answers OK for the receiver, which never sees it)."""

    def __init__(self, handlers: dict[str, dict[str, Handler]], claimed: str = "",
                 forge: Callable[[Shareable], None] | None = None,
                 plan: list[str] | None = None) -> None:  # fmt: skip
        self.handlers, self.claimed, self.forge = handlers, claimed, forge
        self.plan = plan or []
        self.timeouts: list[float] = []
        self.fl_ctx = FLContext()
        self.fl_ctx.set_prop(ReservedKey.ENGINE, self, private=True, sticky=False)

    def send_aux_request(self, targets: list[str], topic: str, request: Shareable,
                         timeout: float, fl_ctx: Any) -> dict[str, Shareable]:  # fmt: skip
        self.timeouts.append(timeout)
        replies = {}
        for target in targets:
            fault = self.plan.pop(0) if self.plan else None
            if fault == "request":
                continue  # no answer within the timeout
            if fault == "dropped":
                replies[target] = make_reply("OK")
                continue
            sent = _wire(request)
            if self.forge is not None:
                self.forge(sent)
            sent.set_peer_props({ReservedKey.IDENTITY_NAME: self.claimed})
            answer = self.handlers[target][topic](topic, _wire(sent), self.fl_ctx)
            if fault != "answer":
                replies[target] = _wire(answer)
        return replies

    def fire_event(self, event_type: str, fl_ctx: FLContext) -> None:
        pass  # the log events of the server's controller


def _credentials(kits: Kits, name: str) -> Credentials:
    return Credentials.of_kit(kits.root / name / "startup")


def _site(kits: Kits, name: str) -> RankExecutor:
    site = RankExecutor()
    site.begin(name, JOB, _credentials(kits, name))
    return site


def _site_handlers(site: RankExecutor) -> dict[str, Handler]:
    return {MESSAGE_TOPIC: site._on_message, STOP_TOPIC: site._on_stop}


def _link(relay: Any, kits: Kits, signer: str, rank: int, **options: Any) -> AuxLink:
    return AuxLink(relay, None, SITE_NAMES, rank, Inbox(), _credentials(kits, signer), JOB,
                   **options)  # fmt: skip


def test_a_lost_request_or_answer_is_asked_again_and_filed_once(
    two_projects: tuple[Kits, Kits],
) -> None:
    ours, _ = two_projects
    receiver = _site(ours, "centre-1")
    relay = _Relay({"centre-1": _site_handlers(receiver)}, "centre-0",
                   plan=["request", "answer", "request"])  # fmt: skip
    link = _link(relay, ours, "centre-0", 0)
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


def test_a_message_without_its_sequence_number_is_refused(two_projects: tuple[Kits, Kits]) -> None:
    receiver = _site(two_projects[0], "centre-1")
    request = Shareable()
    request.set_header("proxyfl_tag", "p1")
    request["payload"] = b"x"
    request.set_peer_props({ReservedKey.IDENTITY_NAME: "centre-0"})
    answer = receiver._on_message(MESSAGE_TOPIC, request, None)
    assert answer.get_return_code() == "BAD_REQUEST_DATA"


def test_a_message_is_filed_under_its_proven_sender_not_the_name_it_claims(
    two_projects: tuple[Kits, Kits],
) -> None:
    """centre-2's process writes centre-0's name in its peer context, then also as the
    message's sender: the first is filed under centre-2 (whose key signed it), the second
    refused, and centre-2 is told why at once (not asked again for 10 minutes)."""
    ours, _ = two_projects
    receiver = _site(ours, "centre-1")
    relay = _Relay({"centre-1": _site_handlers(receiver)}, claimed="centre-0")
    _link(relay, ours, "centre-2", 2).send(1, "p1", b"from centre-2")
    assert receiver.inbox._messages.get(("centre-0", "p1")) is None
    assert receiver.inbox.take("centre-2", "p1", None) == b"from centre-2"

    relay.forge = lambda request: request.set_header(SENDER_HEADER, "centre-0")
    said = (
        "site centre-1 (rank 1) refused this site's message, saying: centre-1: its certificate is "
    )
    with pytest.raises(JobStopped, match=re.escape(said + "'centre-2''s")):
        _link(relay, ours, "centre-2", 2).send(1, "p2", b"forged")
    assert len(relay.timeouts) == 2
    assert not any(receiver.inbox._messages.values())


def test_a_message_signed_under_another_projects_root_is_refused(
    two_projects: tuple[Kits, Kits],
) -> None:
    """A site of the same name but of another project (another root certificate)."""
    ours, theirs = two_projects
    receiver = _site(ours, "centre-1")
    relay = _Relay({"centre-1": _site_handlers(receiver)}, claimed="centre-0")
    with pytest.raises(JobStopped, match="not issued by this project's root"):
        _link(relay, theirs, "centre-0", 0).send(1, "p1", b"foreign")
    assert not any(receiver.inbox._messages.values())


def test_only_the_server_stops_a_job(two_projects: tuple[Kits, Kits]) -> None:
    ours, _ = two_projects
    receiver = _site(ours, "centre-1")
    relay = _Relay({"centre-1": _site_handlers(receiver)}, claimed="localhost")
    for signer in ("centre-0", "centre-2"):  # a site signs a stop in the server's place
        stop = Shareable()
        stop[STATUS] = 2
        _credentials(ours, signer).sign(stop, JOB, STOP_TOPIC, EVERY_SITE, (2,))
        reply = relay.send_aux_request(["centre-1"], STOP_TOPIC, stop, 5.0, None)
        assert reply["centre-1"].get_return_code() == UNVERIFIED
        assert receiver.inbox.stopped is None
    stop = Shareable()
    stop[STATUS] = 2
    _credentials(ours, "localhost").sign(stop, JOB, STOP_TOPIC, EVERY_SITE, (2,))
    assert relay.send_aux_request(["centre-1"], STOP_TOPIC, stop, 5.0, None)[
        "centre-1"
    ].get_return_code() == "OK"  # fmt: skip
    assert receiver.inbox.stopped is not None and receiver.inbox.stopped.status == 2


def _controller(kits: Kits) -> RunController:
    controller = RunController(SITE_NAMES, [[0, 1]] * 3, arguments=[], working_directory=".")
    controller.begin(JOB, _credentials(kits, "localhost"))
    return controller


def _stopped(sites: dict[str, RankExecutor], within_s: float = 30.0) -> dict[str, int | None]:
    """Each site's stop status, once every site told to stop has heard it."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        told = {name: site.inbox.stopped for name, site in sites.items()}
        if all(stopped is not None for stopped in told.values()):
            break
        time.sleep(0.05)
    return {name: None if s.inbox.stopped is None else s.inbox.stopped.status
            for name, s in sites.items()}  # fmt: skip


def test_an_abort_counts_only_from_the_site_of_the_rank_it_names(
    two_projects: tuple[Kits, Kits],
) -> None:
    """centre-2 aborts as rank 1 (centre-1's): refused, nothing ends; centre-1 aborts:
    the job ends with its status, and the server's signed stop reaches the other two."""
    ours, _ = two_projects
    controller = _controller(ours)
    sites = {name: _site(ours, name) for name in ("centre-0", "centre-2")}
    handlers = {SERVER: {ABORT_TOPIC: controller._on_abort}}
    handlers |= {name: _site_handlers(site) for name, site in sites.items()}
    with pytest.raises(JobStopped):
        _link(_Relay(handlers, claimed="centre-1"), ours, "centre-2", 1).abort(2)
    assert controller.aborted_by is None

    relay = _Relay(handlers, claimed="centre-1")
    with pytest.raises(JobStopped):
        _link(relay, ours, "centre-1", 1).abort(3)
    assert controller.aborted_by == (1, 3)
    assert _stopped(sites) == {"centre-0": 3, "centre-2": 3}


def test_a_rank_that_fails_without_aborting_ends_the_job(two_projects: tuple[Kits, Kits]) -> None:
    """Its abort lost or never sent (it could not sign): its failed answer to the task
    ends the job all the same; a rank that succeeds ends nothing."""
    ours, _ = two_projects
    controller = _controller(ours)
    sites = {name: _site(ours, name) for name in ("centre-1", "centre-2")}
    relay = _Relay({name: _site_handlers(site) for name, site in sites.items()}, "localhost")
    task = Task(name=RANK_TASK, data=Shareable())
    for name, status in (("centre-1", 0), ("centre-0", EXIT_BAD_INPUT)):
        client_task = ClientTask(Client(name, None), task)
        client_task.result = Shareable()
        client_task.result[STATUS] = status
        controller._on_result(client_task, relay.fl_ctx)
        if status == 0:
            assert controller.aborted_by is None
    assert controller.aborted_by == (0, EXIT_BAD_INPUT)
    assert _stopped(sites) == {"centre-1": EXIT_BAD_INPUT, "centre-2": EXIT_BAD_INPUT}


def test_a_site_that_cannot_sign_answers_its_task_with_an_error(
    two_projects: tuple[Kits, Kits], tmp_path: Any
) -> None:
    """Its kit has no key: START_RUN's error, the task answered at once with it (exit 2),
    and no message of another site taken."""
    from proxyfl.comm.flare.signing import CredentialsError

    site = RankExecutor()
    site.begin("centre-1", JOB, CredentialsError(f"{tmp_path}/client.key: cannot be read"))
    fl_ctx = FLContext()
    fl_ctx.set_prop(ReservedKey.IDENTITY_NAME, "centre-1", private=False, sticky=False)
    task = Shareable()
    task[SITES], task[PLACEMENT] = SITE_NAMES, [[0, 1]] * 3
    answer = site.execute(RANK_TASK, task, fl_ctx, None)
    assert answer[STATUS] == EXIT_BAD_INPUT
    assert "rank 1 (centre-1): this site cannot sign its messages" in answer[ERROR]
    assert "client.key: cannot be read" in answer[ERROR]
    relay = _Relay({"centre-1": _site_handlers(site)}, claimed="centre-0")
    with pytest.raises(JobStopped, match="centre-1 cannot check signatures"):
        _link(relay, two_projects[0], "centre-0", 0).send(1, "p1", b"x")


def _forged(change: str) -> Callable[[Shareable], None]:
    """What a forging relay (the server) or site changes in a signed message on its way."""

    def forge(request: Shareable) -> None:
        if change == "payload":
            request["payload"] = b"another proxy"
        elif change in ("tag", "sequence"):
            header = f"proxyfl_{change}"
            value = request.get_header(header)
            request.set_header(header, value + "9" if change == "tag" else value + 1)

    return forge


@pytest.mark.parametrize("change", ["payload", "tag", "sequence"])
def test_a_message_changed_on_its_way_is_refused(
    two_projects: tuple[Kits, Kits], change: str
) -> None:
    ours, _ = two_projects
    receiver = _site(ours, "centre-1")
    relay = _Relay({"centre-1": _site_handlers(receiver)}, "centre-0", forge=_forged(change))
    with pytest.raises(JobStopped, match="signature is not its sender's"):
        _link(relay, ours, "centre-0", 0).send(1, "p1", b"proxy")
    assert not any(receiver.inbox._messages.values()) and receiver.inbox.stopped is None


def test_a_message_taken_to_another_site_or_job_is_refused(
    two_projects: tuple[Kits, Kits],
) -> None:
    """centre-0 signs for centre-2; the relay hands it to centre-1. And a message of job 7
    handed to the same site in job 8."""
    ours, _ = two_projects
    receiver = _site(ours, "centre-1")
    redirect = _Relay({"centre-2": _site_handlers(receiver)}, "centre-0")
    with pytest.raises(JobStopped, match="signature is not its sender's"):
        _link(redirect, ours, "centre-0", 0).send(2, "p1", b"for centre-2")
    later = RankExecutor()
    later.begin("centre-1", "job-8", _credentials(ours, "centre-1"))
    replayed = _Relay({"centre-1": _site_handlers(later)}, "centre-0")
    with pytest.raises(JobStopped, match="signature is not its sender's"):
        _link(replayed, ours, "centre-0", 0).send(1, "p1", b"of job 7")
    assert not any(receiver.inbox._messages.values())
    assert not any(later.inbox._messages.values())


def test_a_message_the_relay_dropped_ends_the_job_at_the_next(
    two_projects: tuple[Kits, Kits],
) -> None:
    """The server answers OK for round 1's proxy and drops it: round 2's is not taken in
    its place; its receiver stops, saying which message never arrived."""
    ours, _ = two_projects
    receiver = _site(ours, "centre-1")
    relay = _Relay({"centre-1": _site_handlers(receiver)}, "centre-0", plan=["dropped"])
    link = _link(relay, ours, "centre-0", 0, send_timeout_s=1.0)
    link.send(1, "p", b"round 1 proxy")
    with pytest.raises(JobStopped, match="did not take a message: BAD_REQUEST_DATA"):
        link.send(1, "p", b"round 2 proxy")
    assert receiver.inbox.stopped is not None
    assert "message 1 from centre-0 never arrived (message 2 did)" in str(receiver.inbox.stopped)
    with pytest.raises(JobStopped):
        receiver.inbox.take("centre-0", "p", None)


def test_an_abort_or_stop_with_its_status_changed_is_refused(
    two_projects: tuple[Kits, Kits],
) -> None:
    ours, _ = two_projects
    controller = _controller(ours)
    site = _site(ours, "centre-0")

    def change_status(request: Shareable) -> None:
        request[STATUS] = 0

    relay = _Relay({SERVER: {ABORT_TOPIC: controller._on_abort}, "centre-0": _site_handlers(site)},
                   "centre-1", forge=change_status)  # fmt: skip
    with pytest.raises(JobStopped):
        _link(relay, ours, "centre-1", 1).abort(3)
    assert controller.aborted_by is None
    stop = Shareable()
    stop[STATUS] = 2
    _credentials(ours, "localhost").sign(stop, JOB, STOP_TOPIC, EVERY_SITE, (2,))
    reply = relay.send_aux_request(["centre-0"], STOP_TOPIC, stop, 5.0, None)
    assert reply["centre-0"].get_return_code() == UNVERIFIED and site.inbox.stopped is None


@pytest.mark.parametrize("code", ["EXECUTION_EXCEPTION", "EXECUTION_RESULT_ERROR", "UNSAFE_JOB"])
def test_a_rank_whose_task_flare_answered_for_ends_the_job(
    two_projects: tuple[Kits, Kits], code: str
) -> None:
    """Its task raised, or FLARE refused it: no status of the rank's, and the job ends with
    1 all the same (else the others wait a week, the task's timeout)."""
    ours, _ = two_projects
    controller = _controller(ours)
    sites = {name: _site(ours, name) for name in ("centre-0", "centre-2")}
    relay = _Relay({name: _site_handlers(site) for name, site in sites.items()}, "localhost")
    client_task = ClientTask(Client("centre-1", None), Task(name=RANK_TASK, data=Shareable()))
    client_task.result = make_reply(code)
    controller._on_result(client_task, relay.fl_ctx)
    assert controller.aborted_by == (1, 1)
    assert _stopped(sites) == {"centre-0": 1, "centre-2": 1}


def test_a_flood_of_forgeries_is_logged_in_few_lines(
    two_projects: tuple[Kits, Kits], caplog: pytest.LogCaptureFixture
) -> None:
    """A thousand refused messages, each naming a sender of a megabyte: ten lines in full,
    then one at the thousandth, each name cut short."""
    ours, _ = two_projects
    receiver = _site(ours, "centre-1")
    request = Shareable()
    request["payload"] = b"x"
    request.set_header("proxyfl_tag", "p1")
    request.set_header("proxyfl_sequence", 1)
    request.set_header(SENDER_HEADER, "c" * 1_000_000)
    with caplog.at_level("ERROR", logger="proxyfl.sites.executor"):
        for _ in range(1000):
            reply = receiver._on_message(MESSAGE_TOPIC, request, None)
            assert reply.get_return_code() == UNVERIFIED
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 11 and "(1000 refused so far)" in lines[-1]
    assert max(len(line) for line in lines) < 400


def test_a_participant_outside_the_job_is_heard_no_more_once_the_task_names_its_sites(
    two_projects: tuple[Kits, Kits],
) -> None:
    """centre-2 is of the project but not of a job of centre-0 and centre-1: what it sent
    before the task arrived is dropped, and what it sends after is refused."""
    ours, _ = two_projects
    receiver = _site(ours, "centre-1")
    relay = _Relay({"centre-1": _site_handlers(receiver)}, "centre-2")
    _link(relay, ours, "centre-2", 2).send(1, "p1", b"early")
    _link(relay, ours, "centre-0", 0).send(1, "p1", b"from a site of the job")
    receiver.join(["centre-0", "centre-1"])
    assert receiver.inbox._messages.get(("centre-2", "p1")) is None
    assert receiver.inbox.take("centre-0", "p1", None) == b"from a site of the job"
    with pytest.raises(JobStopped, match="'centre-2' is not a site of this job"):
        _link(relay, ours, "centre-2", 2).send(1, "p2", b"late")
    assert not any(receiver.inbox._messages.values())
