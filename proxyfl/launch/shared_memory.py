"""Shared-memory segments a killed job leaves in ``/dev/shm``, and their removal.

Ranks on one machine talk through POSIX shared memory
(:data:`~proxyfl.launch.placement.SHARED_MEMORY_ONLY`): MPICH maps one ``mpich_shm_*`` segment
per job, and libfabric's shm provider one ``PID:N:N`` region per rank, each unlinked at
``MPI_Finalize``. A rank killed by a signal
never finalizes, so its segments stay, a few MB each, until the machine reboots. In a
container ``/dev/shm`` is often 64 MB: after some twenty killed jobs the next job's ranks
die of SIGBUS when they touch their new segments, and a fork launcher still exits 0.

A segment is *orphaned* when it is this user's, no living process of this user maps it,
and it is older than a grace period (a job starting beside this one creates its segments
a moment before it maps them). Mapped segments are never touched, so jobs running beside
ours, even other users', keep theirs. Linux only; elsewhere nothing is found.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil

logger = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")
# MPICH's per-job segment, and libfabric's shm provider region of one endpoint (PID:N:N)
SEGMENT_NAME = re.compile(r"mpich_shm_[0-9a-f]+_\d+|\d+:\d+:\d+")
GRACE_SECONDS = 10.0
# what one rank maps: libfabric's region (13.4 MB with MPICH 4's defaults) and its share of
# MPICH's segment
RANK_SEGMENT_BYTES = 16 * 2**20


@dataclass(frozen=True)
class Cleared:
    """What :func:`remove_orphaned_segments` removed: how many segments, and the bytes
    of memory they held (tmpfs blocks, not their sparse sizes)."""

    segments: int = 0
    bytes: int = 0


def mapped_paths(
    shm_dir: Path = SHM_DIR, processes: Iterable[psutil.Process] | None = None
) -> set[str]:
    """The files in ``shm_dir`` that this user's living processes map (``/proc/PID/maps``);
    a process that ends or cannot be read while we look maps nothing."""
    uid, inside = os.getuid(), f"{shm_dir}/"
    mapped: set[str] = set()
    for process in processes if processes is not None else psutil.process_iter(["uids"]):
        try:
            if process.uids().real != uid:
                continue
            maps = Path(f"/proc/{process.pid}/maps").read_text(errors="replace")
        except (psutil.Error, OSError):
            continue
        mapped.update(line.split(None, 5)[5] for line in maps.splitlines()
                      if inside in line and len(line.split(None, 5)) == 6)  # fmt: skip
    return mapped


def orphaned_segments(
    shm_dir: Path = SHM_DIR, grace_seconds: float = GRACE_SECONDS, now: float | None = None
) -> list[Path]:
    """This user's MPI segments in ``shm_dir`` that no living process maps and that are
    older than ``grace_seconds``."""
    if not shm_dir.is_dir():
        return []
    now = time.time() if now is None else now
    uid = os.getuid()
    candidates = []
    for entry in os.scandir(shm_dir):
        if not SEGMENT_NAME.fullmatch(entry.name):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if info.st_uid == uid and now - info.st_mtime >= grace_seconds:
            candidates.append(Path(entry.path))
    if not candidates:
        return []
    mapped = mapped_paths(shm_dir)
    return [path for path in candidates if str(path) not in mapped]


def segment_names(shm_dir: Path = SHM_DIR) -> set[str]:
    """The names of the MPI segments in ``shm_dir`` now (a job's launcher takes them
    before it starts: :func:`remove_segments_since`)."""
    if not shm_dir.is_dir():
        return set()
    return {entry.name for entry in os.scandir(shm_dir) if SEGMENT_NAME.fullmatch(entry.name)}


def remove_segments_since(
    before: Collection[str], shm_dir: Path = SHM_DIR, settle_seconds: float = 0.5
) -> Cleared:
    """Remove the segments made since ``before`` that no process maps, seen so twice
    ``settle_seconds`` apart: once a job has ended, those of its ranks a signal killed
    (Ctrl-C, SIGKILL) before they unlinked them, at once rather than after the grace
    period. A job starting beside maps each of its segments a moment after making it, so
    an unmapped new one that is still unmapped a moment later is no one's. Never raises."""

    def unmapped_new() -> set[Path]:
        new = [shm_dir / name for name in segment_names(shm_dir) - set(before)]
        mine = [path for path in new if _owned(path)]
        if not mine:
            return set()
        mapped = mapped_paths(shm_dir)
        return {path for path in mine if str(path) not in mapped}

    first = unmapped_new()
    if not first:
        return Cleared(0, 0)
    time.sleep(settle_seconds)
    return _remove(sorted(first & unmapped_new()), shm_dir)


def _owned(path: Path) -> bool:
    try:
        return path.stat(follow_symlinks=False).st_uid == os.getuid()
    except OSError:
        return False


def remove_orphaned_segments(
    shm_dir: Path = SHM_DIR, grace_seconds: float = GRACE_SECONDS
) -> Cleared:
    """Remove :func:`orphaned_segments`; never raises (a launch goes on without it)."""
    return _remove(orphaned_segments(shm_dir, grace_seconds), shm_dir)


def _remove(paths: Iterable[Path], shm_dir: Path) -> Cleared:
    segments, freed = 0, 0
    for path in paths:
        try:
            held = path.stat().st_blocks * 512
            path.unlink()
        except OSError:
            continue
        segments, freed = segments + 1, freed + held
    if segments:
        logger.info("removed %d shared-memory segment(s) that killed MPI ranks left in %s "
                    "(%.1f MB)", segments, shm_dir, freed / 1e6)  # fmt: skip
    return Cleared(segments, freed)


def warn_if_short(ranks: int, shm_dir: Path = SHM_DIR) -> bool:
    """Log a warning, and say so, when ``shm_dir`` has less room than ``ranks`` ranks may
    touch: they would die of SIGBUS part-way through."""
    try:
        free = shutil.disk_usage(shm_dir).free
    except OSError:
        return False
    if free >= ranks * RANK_SEGMENT_BYTES:
        return False
    logger.warning(
        "%s has %.0f MB free, less than the %d MB that %d MPI rank(s) on this machine may "
        "use: a rank that runs out dies of SIGBUS (a container's default is 64 MB: docker "
        "run --shm-size=1g)", shm_dir, free / 2**20, ranks * RANK_SEGMENT_BYTES // 2**20, ranks,
    )  # fmt: skip
    return True
