"""Whether a centre's store is up to date: what decided its bytes, recorded beside it.

A store is rebuilt only when one of the inputs that decide its bytes has changed since it
was written. Those inputs (:class:`StoreInputs`) are the ones ``dvc.yaml``'s
``preprocess@{c}`` stage depends on, read the way the candidate cache reads its slides
(:func:`wsi.cache.file_identity`: name, size and modification time, no full read):

- every file under ``DATA_ROOT/center_{c}``, ``DATA_ROOT/lesion_annotations`` and
  ``DATA_ROOT/stage_labels.csv``, by relative path, size and modification time;
- the store's parameters (:func:`wsi.center.params_hash`);
- the source of the package that computes and writes stores (``wsi``, less the synthetic
  slide generator), and the versions of the pixel and file libraries
  (:func:`wsi.store.provenance.pixel_library_versions`).

Every successful build writes them, with the identity of the store and report it wrote (by
content: :func:`wsi.store.digest.store_digest`, the report's SHA-256; DVC copies its
outputs into its cache and back, which leaves the bytes as they were but not the files'
times), to ``center_{c}.inputs.json`` (:func:`record_inputs`). :func:`stale_reason` compares that
record with the inputs now: ``None`` when nothing changed and the store and report are the
files recorded, else the first reason to rebuild. The comparison errs one way only: a copy
of the slides (new modification times) or an edit to any ``wsi`` module rebuilds a store
that would have come out the same; a store is never kept when an input it depends on
changed. It serves the Prefect path (``flows.pipeline``); under ``dvc repro`` DVC's own
lock decides, and this record is only written (one system decides each artefact's reuse).
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from plumbing.atomic import write_json
from plumbing.fingerprints import file_digest, source_digest
from wsi.catalogue import source_identities
from wsi.center import params_hash
from wsi.params import PatchParams, SamplingParams
from wsi.store.digest import store_digest
from wsi.store.provenance import pixel_library_versions, project_version
from wsi.store.schema import StoreError, store_path
from wsi.summary import report_path

# the synthetic slide generator writes slides, not stores: its edits change the slides
_NOT_STORE_CODE = ("synth",)


def inputs_path(out_dir: str | os.PathLike[str], center: int) -> Path:
    """Where the record of ``center``'s store inputs lives, beside the store."""
    return Path(out_dir) / f"center_{center}.inputs.json"


@functools.cache
def store_code_digest() -> str:
    """SHA-256 of the source of the ``wsi`` package (less :data:`_NOT_STORE_CODE`), as
    this process imported it: every module a store's bytes can depend on."""
    return source_digest(Path(__file__).parent, skip=_NOT_STORE_CODE)


@dataclass(frozen=True)
class StoreInputs:
    """What decides one centre's store's bytes (the module docstring)."""

    center: int
    params: str
    code: str
    libraries: dict[str, str | None]
    sources: dict[str, list[int]]

    @classmethod
    def current(
        cls,
        data_root: str | os.PathLike[str],
        center: int,
        patch: PatchParams,
        sampling: SamplingParams,
    ) -> StoreInputs:
        """The inputs of ``center``'s store as they are now."""
        return cls(
            center=center,
            params=params_hash(patch, sampling),
            code=store_code_digest(),
            libraries={"camelyon-proxyfl": project_version(), **pixel_library_versions()},
            sources=source_identities(data_root, center),
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def changes(self, recorded: dict[str, Any]) -> str | None:
        """What differs between these inputs and ``recorded`` (their :meth:`to_json`), in
        words; ``None`` when nothing does."""
        current = json.loads(json.dumps(self.to_json()))
        if recorded.get("params") != current["params"]:
            return "its parameters changed"
        if recorded.get("sources") != current["sources"]:
            old, new = recorded.get("sources") or {}, current["sources"]
            changed = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
            more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
            return f"its source files changed ({', '.join(changed[:3])}{more})"
        if recorded.get("code") != current["code"]:
            return "the preprocessing code (wsi/) changed"
        if recorded.get("libraries") != current["libraries"]:
            old, new = recorded.get("libraries") or {}, current["libraries"]
            changed = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
            return f"library versions changed ({', '.join(changed)})"
        if recorded != current:
            return "its record differs"
        return None


def record_inputs(out_dir: str | os.PathLike[str], inputs: StoreInputs) -> Path:
    """``center_{c}.inputs.json``: ``inputs``, read before the build, with the identity of
    the store and report just written; call it once both are in place."""
    center = inputs.center
    record = {
        "inputs": inputs.to_json(),
        "store": store_digest(store_path(out_dir, center)),
        "report": file_digest(report_path(out_dir, center)),
    }
    path = inputs_path(out_dir, center)
    write_json(path, record, sort_keys=True)
    return path


def forget_inputs(out_dir: str | os.PathLike[str], center: int) -> None:
    """Remove ``center``'s record: its store is gone or failed."""
    inputs_path(out_dir, center).unlink(missing_ok=True)


def stale_reason(out_dir: str | os.PathLike[str], inputs: StoreInputs) -> str | None:
    """Why ``inputs.center``'s store in ``out_dir`` must be built (``None``: it is up to
    date: a store and report recorded with exactly these inputs, untouched since)."""
    center = inputs.center
    store, report = store_path(out_dir, center), report_path(out_dir, center)
    if not store.is_file():
        return f"no store {store}"
    path = inputs_path(out_dir, center)
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return f"no record of the inputs it was built from ({path.name})"
    except (OSError, ValueError) as error:
        return f"its record {path.name} does not read ({error})"
    if not isinstance(record, dict) or not isinstance(record.get("inputs"), dict):
        return f"its record {path.name} is not one"
    try:
        held = store_digest(store)
    except StoreError as error:
        return f"{store.name} does not read ({error.reason})"
    if record.get("store") != held:
        return f"{store.name} changed since it was built"
    if not report.is_file() or record.get("report") != file_digest(report):
        return f"{report.name} changed since it was built"
    return inputs.changes(record["inputs"])
