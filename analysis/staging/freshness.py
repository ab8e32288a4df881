"""Whether a centre's staging is up to date: what decided its bytes, recorded beside it.

A centre's staging (``STAGING/center_{c}/``: its maps, pictures and ``calls.json``) is
computed again only when one of the inputs that decide its bytes has changed since it was
written (:class:`CentreInputs`), the ones ``dvc.yaml``'s ``stage@{c}`` depends on:

- its settings: the patch geometry and tissue rule (``preprocess``), the slide reader, the
  centres the runs trained on, the batch and device, the threshold candidates and the node
  rule's extents (``stage``);
- the model that stages the centre in each listed run, by its recorded SHA-256 (the one
  ``calls.json`` names);
- the centre's slides, annotations and stage labels by size and modification time, as the
  stores' record has them (:func:`wsi.catalogue.source_identities`), and its store by
  :func:`wsi.store.digest.store_digest` (its splits decide who is tested);
- the source of ``analysis``, ``proxyfl`` and ``wsi``, the versions of the libraries
  behind the maps and the CPU kernels' pin they were computed with
  (:func:`plumbing.kernels.in_effect`: ``machine.cpu_kernels`` under ``dvc repro``).

Every centre staged records them, with the SHA-256 of the ``calls.json`` it wrote and of
its whole folder (a map or picture deleted since is a reason to stage again), in
``STAGING/center_{c}.inputs.json``, beside the centre's folder and not in it: the slides'
times differ in every clone, and the folder is what DVC hashes (``.dvcignore`` leaves
``center_*.inputs.json`` out of the summary stage's hash of ``STAGING``).
:func:`stale_reason` compares the record with the inputs now: ``None`` when nothing
changed and the folder's calls are the ones recorded, else the first reason to stage the
centre again. Like the stores' and the audit's, the comparison errs one way only. It
serves the Prefect path (``flows.pipeline``, ``flows.stage``); under ``dvc repro`` DVC
deletes the centre's folder before its stage runs, so the centre is always staged there
and this record only written.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import analysis
import proxyfl
import wsi
from analysis.staging.centre import CALLS_FILE, centre_dir
from plumbing.fingerprints import packages_digest, read_inputs_record, write_inputs_record
from plumbing.kernels import in_effect as kernels_in_effect
from plumbing.versions import runtime_versions
from proxyfl.results import TRAINING_LIBRARIES
from wsi.catalogue import source_identities
from wsi.store.digest import store_digest
from wsi.store.provenance import pixel_library_versions


@functools.cache
def staging_code_digest() -> str:
    """SHA-256 of the source of ``analysis``, ``proxyfl`` and ``wsi``, as this process
    imported them."""
    return packages_digest(
        Path(analysis.__file__).parent, Path(proxyfl.__file__).parent, Path(wsi.__file__).parent
    )


def _written(staging_dir: str | os.PathLike[str], center: int) -> dict[str, Path]:
    """What a centre's staging writes, as its record names it: ``calls.json`` (checked
    first), then the whole folder (the maps and pictures the calls name)."""
    folder = centre_dir(staging_dir, center)
    return {"calls": folder / CALLS_FILE, "folder": folder}


def inputs_path(staging_dir: str | os.PathLike[str], center: int) -> Path:
    """Where the record of ``center``'s staging inputs lives: beside its folder."""
    return Path(staging_dir) / f"center_{center}.inputs.json"


@dataclass(frozen=True)
class CentreInputs:
    """What decides a centre's staging (the module's docstring)."""

    center: int
    settings: dict[str, Any]
    models: dict[str, str]  # ALGORITHM/seed_S -> the recorded digest of its model
    slides: dict[str, list[int]]  # relative path -> [size, mtime_ns]
    store: str
    code: str
    libraries: dict[str, str | None]
    kernels: dict[str, str]  # the CPU kernels' pin in effect ({}: native)

    @classmethod
    def now(
        cls,
        center: int,
        settings: Mapping[str, Any],
        models: Mapping[str, str],
        data_root: str | os.PathLike[str],
        store: str | os.PathLike[str],
    ) -> CentreInputs:
        """The inputs of ``center``'s staging with ``settings`` and ``models``, from the
        slides under ``data_root`` and the store at ``store``, as they are now."""
        return cls(
            center=center,
            settings=json.loads(json.dumps(dict(settings), default=str)),
            models=dict(sorted(models.items())),
            slides=source_identities(data_root, center),
            store=store_digest(Path(store)),
            code=staging_code_digest(),
            libraries={**runtime_versions(TRAINING_LIBRARIES), **pixel_library_versions()},
            kernels=kernels_in_effect(),
        )

    def as_json(self) -> dict[str, Any]:
        return json.loads(json.dumps(asdict(self)))


def record_inputs(staging_dir: str | os.PathLike[str], inputs: CentreInputs) -> Path:
    """Record ``inputs`` as those of the centre's staging just written."""
    record = inputs_path(staging_dir, inputs.center)
    write_inputs_record(record, inputs.as_json(), _written(staging_dir, inputs.center))
    return record


def forget_inputs(staging_dir: str | os.PathLike[str], center: int) -> None:
    """Remove the centre's record (before it is staged again: no record outlives its
    calls)."""
    inputs_path(staging_dir, center).unlink(missing_ok=True)


def stale_reason(staging_dir: str | os.PathLike[str], inputs: CentreInputs) -> str | None:
    """``None`` when the centre's staging was computed from exactly ``inputs`` and its
    folder (``calls.json``, maps, pictures) is untouched since; otherwise why it must be
    staged again."""
    record = inputs_path(staging_dir, inputs.center)
    recorded, why = read_inputs_record(record, _written(staging_dir, inputs.center))
    if recorded is None:
        return why
    current = inputs.as_json()
    for key in ("settings", "models", "store", "code", "libraries", "kernels", "slides"):
        if recorded.get(key) != current[key]:
            return f"its {key} changed"
    return None
