"""A store's identity by its content, read in milliseconds whatever its size: what a run
records of the stores it trained on (:mod:`proxyfl.launch.rundir`) and what a store's
build record holds of it (:mod:`wsi.freshness`)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import h5py

from wsi.store.reader import read_store_info
from wsi.store.schema import SPLITS


def store_digest(path: Path, labels: bool = True) -> str:
    """A store's identity by content: its attributes and provenance, and every split's
    patients, slides, coordinates (which patches it holds) and, with ``labels``, labels,
    hashed. The pixels are not read, so it costs milliseconds on a 50 GB store; neither are
    the labels without ``labels`` (PrivateKT's public pool: they are never read)."""
    info = read_store_info(path, splits=SPLITS if labels else ())
    digest = hashlib.sha256()
    digest.update(json.dumps(info.attrs.scalars(), sort_keys=True).encode())
    if info.provenance is not None:
        digest.update(info.provenance.to_json().encode())
    for name in SPLITS:
        digest.update(name.encode())
        if labels:
            split = info.splits[name]
            digest.update(split.labels.astype("<i8").tobytes())
            digest.update("\0".join(split.patients).encode())
            digest.update("\0".join(split.slides).encode())
            digest.update(split.coords.astype("<i8").tobytes())
        else:
            digest.update(_unlabelled_identity(path, name))
    return "sha256:" + digest.hexdigest()


def _unlabelled_identity(path: Path, split: str) -> bytes:
    """A split's patients, slides and coordinates, read without its labels."""
    with h5py.File(path, "r") as h5:
        group = h5[split]
        return b"\0".join(
            [*(bytes(v) if isinstance(v, bytes) else str(v).encode()
               for name in ("patients", "slides") for v in group[name][()]),
             group["coords"][()].astype("<i8").tobytes()]
        )  # fmt: skip
