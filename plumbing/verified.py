"""Files verified when read: a SHA-256 written beside a file once it is whole, checked
before it is read, and one error that names a file that fails.

:func:`record_digest` writes ``NAME.sha256`` (``sha256:HEX``, atomically) after ``NAME`` is
in place, or, for a file written once under its name, the digest of its temporary just
before the rename; :func:`verify` reads ``NAME`` back against it. A file whose record is missing
(written before records existed, or a crash between the two writes), whose bytes no longer
match, or that cannot be read raises :class:`DamagedFileError`, whose message names the
file, what is wrong with it and the command that repairs it. Every command turns it into
one ``error:`` line and exit status 2.
"""

from __future__ import annotations

import os
from pathlib import Path

from plumbing.atomic import write_text
from plumbing.errors import PipelineError
from plumbing.fingerprints import file_digest

SUFFIX = ".sha256"


class DamagedFileError(PipelineError):
    """A file that does not verify: ``path: what is wrong; repair``."""

    def __init__(self, path: str | os.PathLike[str], problem: str, repair: str) -> None:
        super().__init__(Path(path), f"{problem}; {repair}")
        self.problem, self.repair = problem, repair


def digest_path(path: str | os.PathLike[str]) -> Path:
    """Where ``path``'s digest is recorded: ``NAME.sha256`` beside it."""
    path = Path(path)
    return path.with_name(path.name + SUFFIX)


def record_digest(
    path: str | os.PathLike[str], contents: str | os.PathLike[str] | None = None
) -> str:
    """Write the SHA-256 of ``contents`` (``path`` itself by default) as ``path``'s record,
    atomically; returns it (``sha256:HEX``). Recording a temporary's digest before it is
    renamed onto ``path`` leaves no moment in which ``path`` is in place without one."""
    digest = file_digest(path if contents is None else contents)
    write_text(digest_path(path), digest + "\n")
    return digest


def recorded_digest(path: str | os.PathLike[str]) -> str | None:
    """The digest recorded for ``path`` (``None``: no record, or not one)."""
    try:
        text = digest_path(path).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if text.startswith("sha256:") and len(text) == 7 + 64 else None


def check_digest(path: str | os.PathLike[str], expected: str | None, repair: str) -> None:
    """:class:`DamagedFileError` unless ``path``'s bytes have the digest ``expected``."""
    if expected is None:
        raise DamagedFileError(path, "no digest of it was recorded", repair)
    try:
        actual = file_digest(path)
    except OSError as error:
        raise DamagedFileError(
            path, f"cannot be read ({error.strerror or error})", repair
        ) from None
    if actual != expected:
        size = Path(path).stat().st_size
        raise DamagedFileError(
            path, f"its bytes are not those written ({size} bytes, SHA-256 differs)", repair
        )


def verify(path: str | os.PathLike[str], repair: str) -> None:
    """:class:`DamagedFileError` unless ``path`` matches the digest recorded beside it."""
    check_digest(path, recorded_digest(path), repair)


def remove_with_digest(path: str | os.PathLike[str]) -> None:
    """Delete ``path`` and its digest record (either may be missing)."""
    Path(path).unlink(missing_ok=True)
    digest_path(path).unlink(missing_ok=True)
