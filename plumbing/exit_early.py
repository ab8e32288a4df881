"""A process whose exit ends before the destructors of what it had loaded (glibc).

The C library's ``exit(status)`` runs, last registered first, every handler registered with
``atexit`` or ``on_exit`` and every C++ static's destructor (``__cxa_atexit``, registered as
its library loads), then flushes C's standard streams and ends the process. A training
rank forked from a warm server (:mod:`plumbing.warm`) inherits the destructors of all the
server imported: libtorch's alone cost 0.25-0.35 s of CPU at the end of each rank (0.04 s
for ``_exit``; four ranks on two cores: ~1 s of every job), and none of them has anything
to do when the process ends. ``_exit`` at once skips MPICH's handler too, which ``MPI_Init``
registers and which tells the launcher that the rank finalised: without it the fork
launcher takes the first rank to end for a failed one and stops the others.

:func:`exit_here` registers ``_exit`` itself as an ``on_exit`` handler, which glibc calls
with ``exit``'s status: an ``exit`` after it runs the handlers registered since (MPICH's,
when ``MPI_Init`` comes after), then ends the process with its status, before any
destructor registered earlier. C's standard streams, which ``exit`` flushes only after its
handlers, are the caller's to flush first (:func:`flush_c_streams`).
"""

from __future__ import annotations

import ctypes
import sys


def exit_here() -> bool:
    """Have the process's ``exit`` end with ``_exit`` once the exit handlers registered
    after this call have run. False, and nothing changed, where the C library has no
    ``on_exit`` (not glibc)."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None)
    on_exit = getattr(libc, "on_exit", None)  # glibc's; musl has none
    if on_exit is None:
        return False
    on_exit.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    # on_exit calls its function with (status, arg): _exit(status), arg left unread
    return on_exit(ctypes.cast(libc._exit, ctypes.c_void_p), None) == 0


def flush_c_streams() -> None:
    """Flush every C stdio stream (``fflush(NULL)``): what a C library printed and holds in
    a buffer, as ``exit`` would flush it after its handlers."""
    ctypes.CDLL(None).fflush(None)
