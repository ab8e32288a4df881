"""An on-disk cache of per-slide patch candidates, keyed on the inputs that decide them.

The key covers the slide file's identity (name, size, modification time), the
annotation file's, the slide's label and every :class:`~wsi.patches.PatchParams` field,
so a rerun after a crash, or after adding slides, recomputes only what changed. Entries
are written to a temporary file and renamed, so a killed run never leaves a torn entry.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path

import numpy as np

from wsi.catalogue import SlideRecord
from wsi.patches import PatchParams
from wsi.sampling import SlidePatches


def file_identity(path: Path | None) -> list[object] | None:
    """(name, size, mtime in ns) of a file; ``None`` for no file."""
    if path is None:
        return None
    stat = path.stat()
    return [path.name, stat.st_size, stat.st_mtime_ns]


def cache_key(record: SlideRecord, params: PatchParams) -> str:
    """Digest of everything that decides a slide's candidates."""
    content = {
        "slide": file_identity(record.path),
        "annotation": file_identity(record.annotation),
        "node_label": record.node_label,
        "params": asdict(params),
    }
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:20]


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
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with tmp.open("wb") as handle:
            np.savez(handle, coords=patches.coords, labels=patches.labels)
        os.replace(tmp, path)
        return path
