"""A store's test split alone: what a centre gives the other sites of a federation.

Every client is evaluated on the merged test splits of all the job's centres (the paper's
evaluation), so each site of a federation needs every other centre's *test* patches beside
its own store. A hospital hands them over as a copy of its store that holds its test split
and nothing of its training split: the ``train`` group is there, as the schema wants, with
no patch; the source slides listed in its provenance are those of the test patients only
(a training slide's name, size and digest would say who was in the training split).

A rank reads another centre's test split only (:mod:`proxyfl.rank_inputs`), so a job on
such copies writes the bytes of a job on the full stores; a rank given a copy as its *own*
store finds no training patch and says so.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from wsi.store.reader import PatchSplitReader, read_store_info
from wsi.store.schema import SCHEMA_VERSION, PatchBatch, StoreError
from wsi.store.writer import PatchStoreWriter

COPY_BATCH = 256  # patches read and written at a time (256 × 512² × 3 bytes: 200 MB)


def write_test_split(
    source: str | os.PathLike[str], target: str | os.PathLike[str], batch: int = COPY_BATCH
) -> int:
    """Write ``source``'s test split, with its attributes, as a store at ``target`` whose
    training split is empty (module doc), atomically; return the number of test patches.

    Raises :class:`StoreError` naming the file: ``source`` is not a readable store or has
    no test patch, or ``target`` is a store that holds training patches (a centre's own
    store is never replaced by a copy of another's test split, nor of its own)."""
    source, target = Path(source), Path(target)
    info = read_store_info(source, splits=("test",))
    test = info.splits["test"]
    if len(test) == 0:
        raise StoreError(source, "its test split is empty: nothing to share")
    if target.exists():
        try:
            held = read_store_info(target, splits=("train",))
        except StoreError:
            held = None  # not a store: replaced like any other file
        if held is not None and len(held.splits["train"]):
            raise StoreError(target, f"holds centre {held.attrs.center}'s training split "
                                     f"({len(held.splits['train'])} patches): not replaced "
                                     "by a test split")  # fmt: skip
    tested = set(test.slides)
    sources = tuple(s for s in info.attrs.sources if Path(s.name).stem in tested)
    attrs = replace(info.attrs, sources=sources, schema_version=SCHEMA_VERSION)
    reader = PatchSplitReader(source, "test")
    try:
        with PatchStoreWriter(target, attrs, {"train": 0, "test": len(test)}) as writer:
            for start in range(0, len(test), batch):
                stop = min(start + batch, len(test))
                writer.write("test", start, PatchBatch(
                    images=reader.images(slice(start, stop)), labels=test.labels[start:stop],
                    patients=test.patients[start:stop], slides=test.slides[start:stop],
                    coords=test.coords[start:stop],
                ))  # fmt: skip
    finally:
        reader.close()
    return len(test)
