"""When the machine says no: a full disk, a folder that cannot be written, a server that
does not answer. Not the project's bug and not a bad input, but the machine refusing:
one line that names the path or the address, the cause and what to do, and exit status
:data:`EXIT_REFUSED` (docs/troubleshooting.md lists the exit codes).

:func:`machine_refusal` finds such a cause anywhere in an exception's chain (a library
that wraps the ``OSError`` it met, an atomic write's clean-up that failed in turn).
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator

EXIT_REFUSED = 3
"""A command's exit status when the machine refused (0 done, 1 failed, 2 bad input)."""

_WHAT_TO_DO = {
    errno.ENOSPC: ("no space left on its device", "free space there, or write elsewhere"),
    errno.EDQUOT: ("disk quota exceeded", "free space within your quota, or write elsewhere"),
    errno.EROFS: ("on a read-only file system", "write elsewhere (an output option or params)"),
    errno.EACCES: ("permission denied", "make it writable for this user, or write elsewhere"),
    errno.EPERM: ("operation not permitted", "make it writable for this user, or write elsewhere"),
    errno.ENOTDIR: ("a path in it is a file, not a folder", "remove that file, or write elsewhere"),
    errno.EISDIR: ("is a folder where a file is written", "remove that folder, or write elsewhere"),
}
# what a client of an HTTP server raises when none answers (httpx's names; Prefect's client)
_UNREACHABLE = {"ConnectError", "ConnectTimeout", "RemoteProtocolError"}


def _chain(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    todo: list[BaseException] = [error]
    while todo:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        todo += [e for e in (current.__cause__, current.__context__) if e is not None]
        if isinstance(current, BaseExceptionGroup):
            todo += list(current.exceptions)


def _address(error: BaseException) -> str:
    request = getattr(error, "_request", None)  # httpx keeps the request it failed on
    url = getattr(request, "url", None)
    return f"the server at {url}" if url is not None else "the server"


def machine_refusal(error: BaseException, server_hint: str = "") -> str | None:
    """One line for the machine's refusal behind ``error`` (``PATH: cause: what to do``),
    or ``None`` when it is something else. ``server_hint``: what to do when a server
    does not answer."""
    for cause in _chain(error):
        if type(cause).__name__ in _UNREACHABLE:
            detail = " ".join(str(cause).split()) or type(cause).__name__
            return (f"{_address(cause)} does not answer ({detail})"
                    + (f": {server_hint}" if server_hint else ""))  # fmt: skip
        if isinstance(cause, OSError) and cause.errno in _WHAT_TO_DO:
            what, to_do = _WHAT_TO_DO[cause.errno]
            where = cause.filename if cause.filename is not None else "writing"
            return f"{where}: {what} ({errno.errorcode[cause.errno]}): {to_do}"
    return None


@contextlib.contextmanager
def naming(path: str | os.PathLike[str]) -> Iterator[None]:
    """A refusal raised inside (an ``OSError`` of :func:`machine_refusal`'s), or found in
    the chain of what was raised (torch's writer raises its own ``RuntimeError`` on the
    ``OSError`` of the write that failed), that names no file names ``path``: a buffered
    write's ENOSPC or EROFS, met at a write or at the flush of a close, says no file, and
    its one line must say which. Other errors are left as they are (a fork's EAGAIN in the
    block is not about ``path``)."""
    try:
        yield
    except BaseException as error:
        for cause in _chain(error):
            if isinstance(cause, OSError) and cause.filename is None and cause.errno in _WHAT_TO_DO:
                cause.filename = str(path)
        raise
