"""The machine's refusals (plumbing.refusals) told apart from bugs and bad input, wherever
they sit in an exception's chain."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from plumbing.atomic import write_text
from plumbing.refusals import machine_refusal


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_a_real_full_device_deep_in_a_chain_is_found() -> None:
    try:
        try:
            os.write(os.open("/dev/full", os.O_WRONLY), b"x")
        except OSError as full:
            raise RuntimeError("the library's own words") from full
    except RuntimeError as wrapped:
        line = machine_refusal(wrapped)
    assert (
        line
        == "writing: no space left on its device (ENOSPC): free space there, or write elsewhere"
    )


@pytest.mark.parametrize(
    ("number", "words"),
    [(errno.EROFS, "read-only file system"), (errno.EACCES, "permission denied"),
     (errno.EDQUOT, "disk quota exceeded"), (errno.ENOTDIR, "is a file, not a folder")],
)  # fmt: skip
def test_each_refusal_names_the_path_and_what_to_do(number: int, words: str) -> None:
    error = OSError(number, os.strerror(number), "results/report.html")
    line = machine_refusal(ExceptionGroup("tasks", [ValueError("other"), error]))
    assert line is not None and line.startswith("results/report.html: ") and words in line
    assert f"({errno.errorcode[number]})" in line and "elsewhere" in line


def test_what_is_not_the_machine_is_not_a_refusal(tmp_path: Path) -> None:
    assert machine_refusal(ZeroDivisionError("a bug")) is None
    assert machine_refusal(FileNotFoundError(errno.ENOENT, "gone", "x")) is None  # bad input
    write_text(tmp_path / "ok.txt", "written")  # and a write with room is just a write
    assert (tmp_path / "ok.txt").read_text() == "written"
