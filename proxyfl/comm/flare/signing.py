"""Who sent a message: every message of a job between FLARE's participants is signed by its
sender and checked by its receiver against the project's root certificate.

FLARE authenticates each *connection* (mutual TLS, a certificate per participant issued by
the project's root certificate authority) but not the sender a message names: the name a
receiving handler reads (its peer context's identity) is whatever the sending process put
there, and an aux message is relayed by the server and streamed past the cell's own checks.
A site could thus file a proxy under another hospital's name, or end the job in another
site's name or in the server's. So each message carries, beside its payload, its sender's
name and certificate (PEM) and a signature of its *statement*

    s = "proxyfl/1" ‖ job ‖ topic ‖ sender ‖ receiver ‖ field₁ ‖ … ‖ fieldₖ ‖ SHA-256(payload)

where ‖ joins parts each prefixed with its length (4 bytes, big-endian), so that no two
different statements are the same bytes. The signature is RSA-PSS with SHA-256 (MGF1 with
SHA-256, the largest salt), as FLARE signs, for an RSA key (FLARE's kits have RSA-2048), or
ECDSA with SHA-256 for an elliptic-curve key, or Ed25519.

A receiver accepts the message as sent by ``sender`` only when

1. the certificate is issued by the root certificate of the receiver's own kit (the
   root's signature over it) and is valid now;
2. the certificate's common name is ``sender``;
3. the signature verifies with the certificate's public key over the statement the
   receiver rebuilds from what arrived and what it knows itself: the job it runs and its
   own name as the receiver.

So a message cannot be sent in another participant's name, changed on its way (by the
server that relays it too), or taken to another receiver or job; its sequence number, signed
too, lets the receiver drop one that arrives again and notice one that never arrived
(:class:`~proxyfl.comm.inbox.Inbox`).
Not checked: revocation. A site whose key was stolen is believed until the project is
provisioned again with a new root.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.x509.oid import NameOID

DOMAIN = b"proxyfl/1"  # what a statement is, and its version
SENDER_HEADER = "proxyfl_sender"
CERTIFICATE_HEADER = "proxyfl_certificate"
SIGNATURE_HEADER = "proxyfl_signature"
EVERY_SITE = "*"  # the receiver of the server's word to every site of the job
MAX_CERTIFICATE_BYTES = 16_384  # a kit's certificate (PEM) is about 1.3 kB
KEPT_CERTIFICATES = 1_024  # how many certificates a verifier remembers as the root's
_PSS = padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=padding.PSS.MAX_LENGTH)


class CredentialsError(RuntimeError):
    """A startup kit that cannot sign or check messages: a file missing, unreadable or not
    what it should be."""


class UnverifiedSender(ValueError):
    """A message whose sender is not proven: the reason is the message."""


@dataclass(frozen=True)
class Statement:
    """What a signature vouches for (module doc): the message's job, topic, sender and
    receiver, its fields (a tag and sequence number, a status) and its payload."""

    job: str
    topic: str
    sender: str
    receiver: str
    fields: tuple[str | int, ...] = ()
    payload: bytes = b""

    def encoded(self) -> bytes:
        parts = [DOMAIN, *(str(part).encode() for part in
                           (self.job, self.topic, self.sender, self.receiver, *self.fields)),
                 hashlib.sha256(self.payload).digest()]  # fmt: skip
        return b"".join(struct.pack(">I", len(part)) + part for part in parts)


def common_name(certificate: x509.Certificate) -> str:
    names = certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not names:
        raise UnverifiedSender("its certificate names no one (no common name)")
    return str(names[0].value)


class Signer:
    """Signs statements with a participant's private key; ``name`` is its certificate's
    common name, ``certificate`` its certificate as PEM, sent with every message."""

    def __init__(self, key_pem: bytes, certificate_pem: bytes) -> None:
        self.key = serialization.load_pem_private_key(key_pem, password=None)
        self.certificate = certificate_pem
        certificate = x509.load_pem_x509_certificate(certificate_pem)
        public = serialization.PublicFormat.SubjectPublicKeyInfo
        if self.key.public_key().public_bytes(serialization.Encoding.DER, public) != (
            certificate.public_key().public_bytes(serialization.Encoding.DER, public)
        ):
            raise CredentialsError("the private key is not the certificate's")
        self.name = common_name(certificate)

    def sign(self, statement: Statement) -> bytes:
        data = statement.encoded()
        if isinstance(self.key, rsa.RSAPrivateKey):
            return self.key.sign(data, _PSS, hashes.SHA256())
        if isinstance(self.key, ec.EllipticCurvePrivateKey):
            return self.key.sign(data, ec.ECDSA(hashes.SHA256()))
        if isinstance(self.key, ed25519.Ed25519PrivateKey):
            return self.key.sign(data)
        raise CredentialsError(f"a {type(self.key).__name__} cannot sign here "
                               "(RSA, elliptic-curve or Ed25519 keys can)")  # fmt: skip


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@dataclass
class Verifier:
    """Checks a message's sender against the project's root certificate (module doc,
    steps 1-3); ``clock``: now, in UTC."""

    root_pem: bytes
    clock: Callable[[], datetime.datetime] = _utc_now
    # the SHA-256 fingerprints of certificates whose issuance is checked (at most
    # KEPT_CERTIFICATES: a sender cannot fill a receiver's memory with certificates)
    _issued: set[bytes] = field(default_factory=set, repr=False)

    def __post_init__(self) -> None:
        self.root = x509.load_pem_x509_certificate(self.root_pem)

    def check(self, statement: Statement, certificate_pem: Any, signature: Any) -> None:
        """Return if ``statement`` is signed by its sender, else raise
        :class:`UnverifiedSender` saying why."""
        if not isinstance(certificate_pem, bytes) or not isinstance(signature, bytes):
            raise UnverifiedSender("it carries no certificate and signature")
        certificate = self._issued_certificate(certificate_pem)
        now = self.clock()
        if not certificate.not_valid_before_utc <= now <= certificate.not_valid_after_utc:
            raise UnverifiedSender(
                f"its certificate is valid from {certificate.not_valid_before_utc:%Y-%m-%d} "
                f"to {certificate.not_valid_after_utc:%Y-%m-%d}, not now"
            )
        if common_name(certificate) != statement.sender:
            raise UnverifiedSender(f"its certificate is {common_name(certificate)!r}'s")
        key, data = certificate.public_key(), statement.encoded()
        try:
            if isinstance(key, rsa.RSAPublicKey):
                key.verify(signature, data, _PSS, hashes.SHA256())
            elif isinstance(key, ec.EllipticCurvePublicKey):
                key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
            elif isinstance(key, ed25519.Ed25519PublicKey):
                key.verify(signature, data)
            else:
                raise UnverifiedSender(f"its certificate's {type(key).__name__} signs nothing")
        except InvalidSignature:
            raise UnverifiedSender(
                "its signature is not its sender's over this job, topic, receiver and content"
            ) from None

    def _issued_certificate(self, certificate_pem: bytes) -> x509.Certificate:
        """The certificate, once the root's signature over it is checked (remembered by
        its fingerprint: a sender sends the same one with each message)."""
        if len(certificate_pem) > MAX_CERTIFICATE_BYTES:
            raise UnverifiedSender(f"its certificate is over {MAX_CERTIFICATE_BYTES} bytes")
        try:
            certificate = x509.load_pem_x509_certificate(certificate_pem)
        except ValueError:
            raise UnverifiedSender("its certificate is not a PEM certificate") from None
        fingerprint = certificate.fingerprint(hashes.SHA256())
        if fingerprint not in self._issued:
            try:
                certificate.verify_directly_issued_by(self.root)
            except (ValueError, TypeError, InvalidSignature):
                raise UnverifiedSender(
                    "its certificate is not issued by this project's root certificate"
                ) from None
            if len(self._issued) >= KEPT_CERTIFICATES:
                self._issued.clear()
            self._issued.add(fingerprint)
        return certificate


@dataclass(frozen=True)
class Credentials:
    """What a participant's startup kit gives it for its messages: its :class:`Signer`, a
    :class:`Verifier` of the project's root, and the server's name (in its certificate)."""

    signer: Signer
    verifier: Verifier
    server: str

    @classmethod
    def of_kit(cls, startup: Path) -> Credentials:
        """Read from a kit's ``startup`` folder, as FLARE's own configuration there names
        the files (``fed_client.json``'s ``client``, ``fed_server.json``'s first server)."""
        client, server = startup / "fed_client.json", startup / "fed_server.json"
        try:
            if client.is_file():
                configuration = json.loads(client.read_text())
                files = configuration["client"]
                server_name = configuration["servers"][0]["identity"]
            else:
                files, server_name = json.loads(server.read_text())["servers"][0], None
            key, certificate, root = (
                (startup / files[name]).read_bytes()
                for name in ("ssl_private_key", "ssl_cert", "ssl_root_cert")
            )
            signer = Signer(key, certificate)
            verifier = Verifier(root)
        except OSError as error:
            raise CredentialsError(f"{error.filename or startup}: cannot be read "
                                   f"({error.strerror or error})") from error  # fmt: skip
        except (KeyError, IndexError, TypeError, json.JSONDecodeError) as error:
            raise CredentialsError(
                f"{startup}: not a FLARE startup folder naming a key, a certificate and a "
                f"root certificate ({error!r})"
            ) from error
        except (ValueError, UnverifiedSender, CredentialsError) as error:
            raise CredentialsError(f"{startup}: its key or certificates cannot be "
                                   f"loaded ({error})") from error  # fmt: skip
        return cls(signer, verifier, server_name if server_name is not None else signer.name)

    def sign(self, request: Any, job: str, topic: str, receiver: str,
             fields: Sequence[str | int] = (), payload: bytes = b"") -> None:  # fmt: skip
        """Put this participant's name, certificate and signature in ``request``'s headers
        (a :class:`~nvflare.apis.shareable.Shareable`)."""
        statement = Statement(job, topic, self.signer.name, receiver, tuple(fields), payload)
        request.set_header(SENDER_HEADER, self.signer.name)
        request.set_header(CERTIFICATE_HEADER, self.signer.certificate)
        request.set_header(SIGNATURE_HEADER, self.signer.sign(statement))

    def sender(self, request: Any, job: str, topic: str, receiver: str,
               fields: Sequence[str | int] = (), payload: bytes = b"") -> str:  # fmt: skip
        """The proven sender of ``request``, received as ``receiver`` in ``job``; else an
        :class:`UnverifiedSender` saying why."""
        sender = request.get_header(SENDER_HEADER)
        if not isinstance(sender, str):
            raise UnverifiedSender("it names no sender")
        statement = Statement(job, topic, sender, receiver, tuple(fields), payload)
        self.verifier.check(statement, request.get_header(CERTIFICATE_HEADER),
                            request.get_header(SIGNATURE_HEADER))  # fmt: skip
        return sender


def kit_credentials(startup: Path) -> Credentials | CredentialsError:
    """:meth:`Credentials.of_kit`, or the error saying why a kit gives none, for a
    participant that goes on without them: it refuses every message and signs none, and
    says why where it would have signed."""
    try:
        return Credentials.of_kit(startup)
    except CredentialsError as error:
        return error


def proven_sender(credentials: Credentials | CredentialsError, request: Any, job: str,
                  topic: str, receiver: str, fields: Sequence[str | int] = (),
                  payload: bytes = b"") -> str:  # fmt: skip
    """:meth:`Credentials.sender`; a receiver without credentials proves no sender (why is
    in its own log, from :func:`kit_credentials`'s caller, not told to the sender)."""
    if isinstance(credentials, CredentialsError):
        raise UnverifiedSender(f"{receiver} cannot check signatures (its kit)")
    return credentials.sender(request, job, topic, receiver, fields, payload)
