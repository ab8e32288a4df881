"""An on-disk cache of per-slide patch candidates, keyed on the inputs that decide them.

The key covers the slide file's identity (name, size, modification time), the
annotation file's, the slide's label, every :class:`~wsi.patches.PatchParams` field and
the source of the modules that compute candidates (:data:`CANDIDATE_MODULES`), so a
rerun after a crash, or after adding slides, recomputes only what changed, and a fix in
that code is applied to every slide. Entries
are written atomically (:func:`plumbing.atomic.atomic_write`), so a killed run never leaves a
torn entry.
:meth:`CandidateCache.forget` drops a slide's entries, to have it recomputed on demand.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import re
from pathlib import Path

import numpy as np

from plumbing.atomic import atomic_write
from wsi.catalogue import SlideRecord
from wsi.patches import PatchParams
from wsi.sampling import SlidePatches


def file_identity(path: Path | None) -> list[object] | None:
    """(name, size, mtime in ns) of a file; ``None`` for no file."""
    if path is None:
        return None
    stat = path.stat()
    return [path.name, stat.st_size, stat.st_mtime_ns]


_KEY_LENGTH = 20

CANDIDATE_MODULES: tuple[str, ...] = ("wsi.annotations", "wsi.masks", "wsi.patches", "wsi.slide")
"""The modules whose code decides a slide's candidates (reading, masks, grid, labels)."""


@functools.cache
def candidate_code_digest() -> str:
    """Digest of the source of :data:`CANDIDATE_MODULES`, as this process imported them."""
    digest = hashlib.sha256()
    for name in CANDIDATE_MODULES:
        source = importlib.util.find_spec(name)
        assert source is not None and source.origin is not None, name
        digest.update(name.encode() + b"\0" + Path(source.origin).read_bytes())
    return digest.hexdigest()[:16]


def cache_key(record: SlideRecord, params: PatchParams) -> str:
    """Digest of everything that decides a slide's candidates."""
    content = {
        "slide": file_identity(record.path),
        "annotation": file_identity(record.annotation),
        "node_label": record.node_label,
        "params": params.model_dump(),
        "code": candidate_code_digest(),
    }
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:_KEY_LENGTH]


class CandidateCache:
    """Usable candidates (:class:`SlidePatches`) per slide under ``directory``."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    def path_for(self, record: SlideRecord, params: PatchParams) -> Path:
        return self.directory / f"{record.slide_id}-{cache_key(record, params)}.npz"

    def load(self, record: SlideRecord, params: PatchParams) -> SlidePatches | None:
        path = self.path_for(record, params)
        if not path.is_file():
            return None
        try:
            with np.load(path) as entry:
                coords, labels = entry["coords"], entry["labels"]
        except (OSError, KeyError, ValueError):
            return None  # a damaged entry is recomputed
        return SlidePatches(record.slide_id, record.patient_id, record.path, coords, labels)

    def save(self, record: SlideRecord, params: PatchParams, patches: SlidePatches) -> Path:
        path = self.path_for(record, params)
        with atomic_write(path) as handle:
            np.savez(handle, coords=patches.coords, labels=patches.labels)
        return path

    def entries(self, slide_id: str) -> list[Path]:
        """Every entry of ``slide_id``, whatever parameters and file identity it was made for."""
        if not self.directory.is_dir():
            return []
        name = re.compile(rf"{re.escape(slide_id)}-[0-9a-f]{{{_KEY_LENGTH}}}\.npz")
        return sorted(p for p in self.directory.iterdir() if name.fullmatch(p.name))

    def forget(self, slide_id: str) -> list[Path]:
        """Delete every entry of ``slide_id``, so that its candidates are computed afresh;
        returns the files removed (none when the slide had no entry)."""
        removed = []
        for path in self.entries(slide_id):
            try:
                path.unlink()
            except FileNotFoundError:  # removed meanwhile, e.g. by another run
                continue
            removed.append(path)
        return removed
