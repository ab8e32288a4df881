"""Disk space for a store: how much one needs, checked before writing, and a disk that
fills up anyway recognised from h5py's and HDF5's errors."""

from __future__ import annotations

import errno
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path

from wsi.store.schema import StoreSpaceError

STORE_FIXED_OVERHEAD = 256 * 1024
"""Bytes a store needs besides its patches, whatever their number: superblock, groups,
object headers, attributes, provenance (measured: about 20 KB with no source listed)."""

STORE_PER_PATCH_OVERHEAD = 512
"""Bytes per patch besides its pixels: label (8), coordinates (16), the chunk index entry
and two variable-length strings in the global heap (measured: 195-325 bytes with
Camelyon-style patient and slide names, ``patient_004`` and ``patient_004_node_4``)."""

DISK_FULL_ERRNOS: frozenset[int] = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})

# HDF5's POSIX drivers describe a failed write as "..., errno = 28, error message = ...".
_HDF5_ERRNO = re.compile(r"\berrno = (\d+)")


def store_bytes_needed(split_sizes: Mapping[str, int], patch_size: int) -> int:
    """Upper bound of the size of a store of ``split_sizes`` patches of ``patch_size``:
    the pixels (N x S x S x 3) plus :data:`STORE_PER_PATCH_OVERHEAD` per patch and
    :data:`STORE_FIXED_OVERHEAD`."""
    n = sum(int(count) for count in split_sizes.values())
    return n * (patch_size * patch_size * 3 + STORE_PER_PATCH_OVERHEAD) + STORE_FIXED_OVERHEAD


def free_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes free to this user on the filesystem that holds ``path`` (or would)."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def check_free_space(path: str | os.PathLike[str], needed: int) -> None:
    """Raise :class:`StoreSpaceError` naming ``path``, the bytes needed and the bytes free when
    the filesystem that would hold ``path`` has fewer than ``needed`` bytes free."""
    free = free_bytes(path)
    if free < needed:
        raise StoreSpaceError(
            path, f"needs {needed:,} bytes but only {free:,} are free on its filesystem"
        )


def disk_full_errno(error: BaseException) -> int | None:
    """The errno of ``error`` if it says the disk (or quota, or file size limit) is full.

    Python's own I/O raises ``OSError`` with ``errno`` set. h5py raises ``OSError`` with
    ``errno`` parsed from HDF5's message for a failed write or flush ("Can't synchronously
    write data", "Driver write request failed"), but a ``RuntimeError`` (no errno, the
    HDF5 message inside) when the failure surfaces elsewhere, e.g. "Can't decrement id
    ref count": both are recognised, nothing else is.
    """
    if isinstance(error, OSError) and error.errno in DISK_FULL_ERRNOS:
        return error.errno
    if isinstance(error, OSError | RuntimeError):
        for match in _HDF5_ERRNO.finditer(str(error)):
            if int(match[1]) in DISK_FULL_ERRNOS:
                return int(match[1])
    return None
