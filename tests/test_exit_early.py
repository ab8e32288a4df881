"""plumbing.exit_early: an exit that runs the handlers registered since, then ends."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

EXITING = """\
import ctypes, os, sys
from plumbing.exit_early import exit_here, flush_c_streams
libc = ctypes.CDLL(None)
handlers = []  # kept alive: C holds only their addresses
def handler(name):
    @ctypes.CFUNCTYPE(None, ctypes.c_void_p)
    def said(_):
        os.write(1, f"{name} ran\\n".encode())
    handlers.append(said)
    libc.__cxa_atexit(said, None, None)  # as a C++ static's destructor is registered
handler("registered before")  # a library loaded before: its destructor
if sys.argv[1] == "early":
    assert exit_here()
handler("registered after")  # MPICH's, registered by MPI_Init
libc.printf(b"buffered in C\\n")  # stdout is a pipe: held in C's buffer
flush_c_streams()
ctypes.PyDLL(None).exit(7)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's on_exit")
@pytest.mark.parametrize("mode", ["early", "plain"])
def test_an_early_exit_runs_what_was_registered_since_and_keeps_its_status(mode: str) -> None:
    done = subprocess.run([sys.executable, "-c", EXITING, mode], cwd=REPO, text=True,
                          capture_output=True, timeout=60)  # fmt: skip
    assert done.returncode == 7, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "buffered in C", lines  # flushed before any handler wrote
    # the plain exit runs every handler, last registered first; the early one ends before
    # those registered ahead of it
    expected = ["registered after ran", "registered before ran"][: 1 if mode == "early" else 2]
    assert lines[1:] == expected
