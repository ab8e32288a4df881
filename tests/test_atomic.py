from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from plumbing.atomic import (
    all_or_nothing,
    atomic_path,
    parse_temporary,
    process_alive,
    process_start_time,
    read_written,
    remove_stale_temporaries,
    temporary_path,
    write_bytes,
    write_text,
    written_together,
)


@pytest.fixture
def dead_pid() -> int:
    """The PID of a child that has exited and been reaped: no process has it now."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.fixture
def live_pid() -> Iterator[int]:
    """The PID of a child that runs for the length of the test."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield child.pid
    finally:
        child.kill()
        child.wait()


def _temporary(directory: Path, target: str, pid: int, age_s: float = 0.0) -> Path:
    path = temporary_path(directory / target, pid)
    path.write_bytes(b"partial")
    if age_s:
        then = time.time() - age_s
        os.utime(path, (then, then))
    return path


def test_naming_round_trip(tmp_path: Path) -> None:
    path = temporary_path(tmp_path / "center_0.h5", 4321)
    assert path == tmp_path / ".center_0.h5.4321.tmp"
    assert parse_temporary(path) == ("center_0.h5", 4321)
    assert temporary_path("a/report.json") == Path(f"a/.report.json.{os.getpid()}.tmp")
    for other in ("center_0.h5", ".center_0.h5.tmp", ".x.12a.tmp", "x.1.tmp", ".x.1.partial"):
        assert parse_temporary(other) is None


def test_processes(live_pid: int, dead_pid: int) -> None:
    assert process_alive(os.getpid()) and process_alive(live_pid)
    assert not process_alive(dead_pid)
    assert not process_alive(0) and not process_alive(-1)
    started = process_start_time(live_pid)
    if started is None:
        pytest.skip("no /proc here to read a process's start time from")
    assert time.time() - 60 < started <= time.time() + 1
    assert process_start_time(dead_pid) is None


def test_removes_only_the_temporaries_of_dead_writers(
    tmp_path: Path, dead_pid: int, live_pid: int
) -> None:
    dead = _temporary(tmp_path, "center_0.h5", dead_pid)
    dead_report = _temporary(tmp_path, "report_0.json", dead_pid)
    live = _temporary(tmp_path, "center_1.h5", live_pid)
    ours = _temporary(tmp_path, "center_2.h5", os.getpid())
    store = tmp_path / "center_0.h5"
    store.write_bytes(b"store")
    (tmp_path / "sub").mkdir()
    nested = _temporary(tmp_path / "sub", "center_3.h5", dead_pid)

    assert remove_stale_temporaries(tmp_path, targets={"center_0.h5"}) == [dead]
    assert remove_stale_temporaries(tmp_path) == [dead_report]
    assert not dead.exists() and not dead_report.exists()
    assert live.exists() and ours.exists() and store.exists() and nested.exists()
    assert remove_stale_temporaries(tmp_path) == []
    assert remove_stale_temporaries(tmp_path / "missing") == []


def test_a_reused_pid_does_not_keep_a_file(tmp_path: Path, live_pid: int) -> None:
    if process_start_time(live_pid) is None:
        pytest.skip("no /proc here to tell a reused PID from its first owner")
    # Last written an hour ago, so not by this child, started seconds ago under that PID.
    old = _temporary(tmp_path, "center_0.h5", live_pid, age_s=3600)
    fresh = _temporary(tmp_path, "center_1.h5", live_pid)
    mine = _temporary(tmp_path, "center_2.h5", os.getpid(), age_s=1)  # we started earlier
    assert remove_stale_temporaries(tmp_path) == [old]
    assert fresh.exists() and mine.exists()


def test_a_set_written_all_or_nothing_appears_at_once(tmp_path: Path) -> None:
    """Inside the block the old files stay (read_written sees the new bytes); at its end
    every new file is in place, and no temporary is left."""
    (tmp_path / "table.md").write_text("old table")
    with all_or_nothing():
        write_text(tmp_path / "table.md", "new table")
        write_bytes(tmp_path / "figure.png", b"new figure")
        assert (tmp_path / "table.md").read_text() == "old table"
        assert not (tmp_path / "figure.png").exists()
        assert read_written(tmp_path / "figure.png") == b"new figure"
    assert (tmp_path / "table.md").read_text() == "new table"
    assert (tmp_path / "figure.png").read_bytes() == b"new figure"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["figure.png", "table.md"]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_a_full_disk_half_way_leaves_the_previous_set_as_it_was(tmp_path: Path) -> None:
    """The second file of the set meets a real ENOSPC: the first, written whole, is not
    committed either; the previous files are untouched and nothing half-written stays."""
    (tmp_path / "table.md").write_text("old table")
    (tmp_path / "report.html").write_text("old page")

    @written_together
    def write_the_set() -> None:
        write_text(tmp_path / "table.md", "new table")
        with atomic_path(tmp_path / "report.html"):
            os.write(os.open("/dev/full", os.O_WRONLY), b"new page")

    with pytest.raises(OSError, match="No space left") as raised:
        write_the_set()
    assert raised.value.filename == str(tmp_path / "report.html")  # says which file
    assert (tmp_path / "table.md").read_text() == "old table"
    assert (tmp_path / "report.html").read_text() == "old page"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html", "table.md"]
