"""The cyclic garbage collector kept out of a command's imports.

A command imports its heavy modules once, as it starts: torch, ``torch._dynamo`` and Opacus
(~400,000 objects: a training rank, a warm server), Prefect (~130,000: every flow command).
They live as long as the process, and importing them makes next to no cyclic garbage, yet
the collector walks them as they arrive: the newest objects every 700 allocations, the
whole heap each time it has grown by a quarter (CPython 3.12). Counted with
``gc.callbacks`` (AMD EPYC Zen 4, the machine loaded): 1.40 s of a rank's 6.80 s of
imports and 0.28 s of a flow command's 2.31 s were collections that freed nothing, and the
collection the interpreter runs at its exit walks the heap once more (0.1-0.3 s). Paused
and frozen, a warm server's imports take 5.35 s of CPU instead of 6.41 s, and
``python -m flows.report --help`` 1.95 s instead of 2.43 s (``python -m bench startup``,
(g): medians of 7, the same machine quiet).

:func:`pause` turns the collector off where a command starts; :func:`imports_done`, once
the command has imported what it runs, moves every object it holds to the permanent
generation (``gc.freeze``: no collection walks them again, the one at exit included) and
turns the collector back on. That is what Python's documentation advises for a process
that forks after its imports (:mod:`plumbing.warm`'s server): off early, frozen before the
fork. The pause is the command's alone: only a process's entry point pauses, and
:func:`imports_done` does nothing where nothing was paused (a library call, a test), so a
process whose collector its own code turned off keeps it off. What is frozen and later
becomes cyclic garbage stays (a module's replaced cache); objects freed by their reference
counts, nearly all, are freed as before.

``python -m flows.X`` imports Prefect and the flow's code at the top of its module, before
any of its code runs; the package's ``__init__`` runs first, and pauses there
(:func:`pause_while_a_command_imports`) when ``python -m`` is running one of its modules.
Every such module's ``__main__`` ends the pause (``plumbing.processes.start_command``, or
:func:`imports_done`): ``tests/test_collector.py`` checks each.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_paused = False  # the collector is off because pause() turned it off


def pause() -> None:
    """Turn the cyclic collector off until :func:`imports_done` (nothing where it is off
    already: it stays as its owner left it)."""
    global _paused
    with _lock:
        if gc.isenabled():
            gc.disable()
            _paused = True


def imports_done() -> None:
    """Where :func:`pause` turned the collector off: freeze what the process holds now
    (``gc.freeze``) and turn the collector back on. Elsewhere nothing."""
    global _paused
    with _lock:
        if _paused:
            gc.freeze()
            gc.enable()
            _paused = False


def paused() -> bool:
    """Whether :func:`pause` has turned the collector off and nothing has ended it."""
    return _paused


@contextlib.contextmanager
def imports_uncollected() -> Iterator[None]:
    """A command's block of imports with the collector off, frozen when it ends
    (:func:`pause`, then :func:`imports_done`)."""
    pause()
    try:
        yield
    finally:
        imports_done()


def pause_while_a_command_imports() -> None:
    """For a package's ``__init__``: :func:`pause` when the package is being imported by
    ``python -m PACKAGE.MODULE`` (``sys.argv[0]`` is ``-m`` until the module runs), whose
    ``__main__`` then calls :func:`imports_done`; a plain import changes nothing."""
    if sys.argv[:1] == ["-m"]:
        pause()
