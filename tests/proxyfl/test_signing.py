"""Who sent a message (proxyfl.comm.flare.signing), on the keys and certificates of two
projects provisioned by ``nvflare provision``: a message is believed exactly when its
named sender's certificate is the project's and signed this job, topic, receiver, fields
and payload; each part changed alone, or another's certificate or key, is refused."""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import json
import shutil
from pathlib import Path

import pytest
from nvflare.apis.shareable import Shareable

from proxyfl.comm.flare.signing import (
    CERTIFICATE_HEADER,
    KEPT_CERTIFICATES,
    MAX_CERTIFICATE_BYTES,
    SENDER_HEADER,
    SIGNATURE_HEADER,
    Credentials,
    CredentialsError,
    Statement,
    UnverifiedSender,
    Verifier,
)
from proxyfl.launch.kits import Kits

STATEMENT = Statement("job-7", "proxyfl.message", "centre-0", "centre-1", ("p3", 12), b"proxy")


def _credentials(kits: Kits, participant: str) -> Credentials:
    return Credentials.of_kit(kits.root / participant / "startup")


def _signed(credentials: Credentials, statement: Statement = STATEMENT) -> Shareable:
    request = Shareable()
    credentials.sign(request, statement.job, statement.topic, statement.receiver,
                     statement.fields, statement.payload)  # fmt: skip
    return request


def _sender(receiver: Credentials, request: Shareable, statement: Statement = STATEMENT) -> str:
    return receiver.sender(request, statement.job, statement.topic, statement.receiver,
                           statement.fields, statement.payload)  # fmt: skip


def test_a_statement_is_its_parts_and_no_other_parts() -> None:
    """Parts are length-prefixed: moving a boundary between two parts changes the bytes
    (without it, sender "centre-0" and receiver "centre-1" would read as "centre-0c" and
    "entre-1")."""
    moved = dataclasses.replace(STATEMENT, sender="centre-0c", receiver="entre-1")
    assert STATEMENT.encoded() != moved.encoded()
    fields_moved = dataclasses.replace(STATEMENT, fields=("p31", 2))
    assert STATEMENT.encoded() != fields_moved.encoded()
    assert STATEMENT.encoded() == dataclasses.replace(STATEMENT).encoded()


def test_a_message_signed_by_its_sender_is_believed(two_projects: tuple[Kits, Kits]) -> None:
    ours, _ = two_projects
    sender, receiver = _credentials(ours, "centre-0"), _credentials(ours, "centre-1")
    assert sender.signer.name == "centre-0"
    assert _sender(receiver, _signed(sender)) == "centre-0"
    # the server's kit checks the same way; each knows the server by its certificate's name
    assert _sender(_credentials(ours, "localhost"), _signed(sender)) == "centre-0"
    assert sender.server == receiver.server == _credentials(ours, "localhost").signer.name


@pytest.mark.parametrize(
    "changed",
    [
        {"job": "job-8"},  # another job's message, played again
        {"topic": "proxyfl.abort"},
        {"receiver": "centre-2"},  # a message to one site, taken to another
        {"fields": ("p4", 12)},  # the tag
        {"fields": ("p3", 13)},  # the sequence number
        {"payload": b"proxz"},  # changed on its way (the server relays it)
    ],
)
def test_a_message_with_any_part_changed_is_refused(
    two_projects: tuple[Kits, Kits], changed: dict
) -> None:
    ours, _ = two_projects
    request = _signed(_credentials(ours, "centre-0"))
    with pytest.raises(UnverifiedSender, match="signature is not its sender's"):
        _sender(_credentials(ours, "centre-1"), request, dataclasses.replace(STATEMENT, **changed))


def test_a_message_in_another_sites_name_is_refused(two_projects: tuple[Kits, Kits]) -> None:
    """A site that names another as the sender: with its own certificate (the name is not
    the certificate's), with the other's certificate (the signature is not the other's), or
    with the other's name in a certificate of another project's root."""
    ours, theirs = two_projects
    receiver = _credentials(ours, "centre-1")
    impostor = _credentials(ours, "centre-2")
    request = _signed(impostor, dataclasses.replace(STATEMENT, sender="centre-2"))
    request.set_header(SENDER_HEADER, "centre-0")
    with pytest.raises(UnverifiedSender, match="its certificate is 'centre-2''s"):
        _sender(receiver, request)
    request.set_header(CERTIFICATE_HEADER, _credentials(ours, "centre-0").signer.certificate)
    with pytest.raises(UnverifiedSender, match="signature is not its sender's"):
        _sender(receiver, request)
    foreign = _signed(_credentials(theirs, "centre-0"))  # the same name, another root
    with pytest.raises(UnverifiedSender, match="not issued by this project's root"):
        _sender(receiver, foreign)


def test_a_message_without_a_certificate_or_signature_is_refused(
    two_projects: tuple[Kits, Kits],
) -> None:
    ours, _ = two_projects
    receiver = _credentials(ours, "centre-1")
    for header in (SENDER_HEADER, CERTIFICATE_HEADER, SIGNATURE_HEADER):
        request = _signed(_credentials(ours, "centre-0"))
        del request["__headers__"][header]
        with pytest.raises(UnverifiedSender):
            _sender(receiver, request)
    request = _signed(_credentials(ours, "centre-0"))
    request.set_header(CERTIFICATE_HEADER, b"-----BEGIN CERTIFICATE-----\nnot one\n")
    with pytest.raises(UnverifiedSender, match="not a PEM certificate"):
        _sender(receiver, request)


def test_a_certificate_is_believed_within_its_validity_only(
    two_projects: tuple[Kits, Kits],
) -> None:
    ours, _ = two_projects
    sender, receiver = _credentials(ours, "centre-0"), _credentials(ours, "centre-1")
    request = _signed(sender)
    valid_from = receiver.verifier._issued_certificate(sender.signer.certificate)
    for moment, believed in (
        (valid_from.not_valid_before_utc, True),
        (valid_from.not_valid_after_utc, True),
        (valid_from.not_valid_before_utc - datetime.timedelta(seconds=1), False),
        (valid_from.not_valid_after_utc + datetime.timedelta(seconds=1), False),
    ):
        verifier = Verifier(receiver.verifier.root_pem, clock=lambda moment=moment: moment)
        at_that_moment = dataclasses.replace(receiver, verifier=verifier)
        if believed:
            assert _sender(at_that_moment, request) == "centre-0"
        else:
            with pytest.raises(UnverifiedSender, match="not now"):
                _sender(at_that_moment, request)


def test_every_site_signs_and_is_told_apart(two_projects: tuple[Kits, Kits]) -> None:
    """Every ordered pair of the project's participants: each believes the other, under
    the other's name only."""
    ours, _ = two_projects
    names = ["localhost", "centre-0", "centre-1", "centre-2"]
    credentials = {name: _credentials(ours, name) for name in names}
    for sender, receiver in itertools.permutations(names, 2):
        statement = dataclasses.replace(STATEMENT, sender=sender, receiver=receiver)
        request = _signed(credentials[sender], statement)
        assert _sender(credentials[receiver], request, statement) == sender


def test_a_kit_that_cannot_sign_says_which_file(
    two_projects: tuple[Kits, Kits], tmp_path: Path
) -> None:
    ours, theirs = two_projects
    startup = tmp_path / "startup"
    shutil.copytree(ours.root / "centre-0" / "startup", startup)
    (startup / "client.key").unlink()
    with pytest.raises(CredentialsError, match=r"client\.key: cannot be read"):
        Credentials.of_kit(startup)
    # a key of another kit than its certificate
    shutil.copy(theirs.root / "centre-0" / "startup" / "client.key", startup / "client.key")
    with pytest.raises(CredentialsError, match="the private key is not the certificate's"):
        Credentials.of_kit(startup)
    configuration = json.loads((startup / "fed_client.json").read_text())
    del configuration["client"]["ssl_root_cert"]
    (startup / "fed_client.json").write_text(json.dumps(configuration))
    with pytest.raises(CredentialsError, match="not a FLARE startup folder naming a key"):
        Credentials.of_kit(startup)
    with pytest.raises(CredentialsError, match="cannot be read"):
        Credentials.of_kit(tmp_path / "nothing")


def test_a_receiver_remembers_a_bounded_number_of_certificates(
    two_projects: tuple[Kits, Kits],
) -> None:
    """The same certificate sent with a different prefix each time (the PEM reader skips
    text before its block) is remembered once, by its fingerprint; an oversized one is
    refused unread; and however many are sent, the memory stays bounded."""
    ours, _ = two_projects
    sender, receiver = _credentials(ours, "centre-0"), _credentials(ours, "centre-1")
    for count in range(50):
        request = _signed(sender)
        request.set_header(CERTIFICATE_HEADER, b"x" * count + b"\n" + sender.signer.certificate)
        assert _sender(receiver, request) == "centre-0"
    assert len(receiver.verifier._issued) == 1
    request = _signed(sender)
    request.set_header(CERTIFICATE_HEADER, b"x" * MAX_CERTIFICATE_BYTES + sender.signer.certificate)
    with pytest.raises(UnverifiedSender, match="certificate is over"):
        _sender(receiver, request)
    verifier = receiver.verifier  # full: the next certificate starts it again
    verifier._issued |= {n.to_bytes(32) for n in range(KEPT_CERTIFICATES - 1)}
    assert len(verifier._issued) == KEPT_CERTIFICATES
    assert _sender(receiver, _signed(_credentials(ours, "centre-2"),
                                     dataclasses.replace(STATEMENT, sender="centre-2"))
                   ) == "centre-2"  # fmt: skip
    assert len(verifier._issued) == 1
