"""Whether an audit file is up to date: what decided its bytes, recorded beside it.

The audit (``results/audit.json``) is computed again only when one of the inputs that
decide its bytes has changed since it was written (:class:`AuditInputs`):

- its settings (:class:`~analysis.audit.options.AuditOptions`) and the runs it covers, in
  order (the training runs, then the canary runs);
- every file of those runs (kept models, records, canary plans) by its content
  (:func:`plumbing.fingerprints.file_digest`), and every store by
  :func:`wsi.store.digest.store_digest` (milliseconds whatever its size): DVC copies its
  outputs into its cache and back, which keeps their bytes, not their times;
- the source of the packages that compute it (``analysis``, ``proxyfl`` and ``wsi``, whose
  reader feeds it patches), the versions of the libraries behind its numbers and the CPU
  kernels' pin it was computed with (:func:`plumbing.kernels.in_effect`).

Every audit written records them, with the SHA-256 of the file it wrote, in
``AUDIT.inputs.json`` beside it (:func:`record_inputs`); :func:`stale_reason` compares that
record with the inputs now: ``None`` when nothing changed and the audit file is the one
recorded, else the first reason to compute it again. The comparison errs one way only, as
the stores' (:mod:`wsi.freshness`): a run trained again to the same bytes, or any edit to
``analysis``, ``proxyfl`` or ``wsi``, recomputes an audit that would have come out the
same; an audit is never kept when an input it depends on changed. It serves the Prefect path
(``flows.pipeline``, ``flows.audit``); under ``dvc repro`` DVC deletes the audit file
before its stage runs, so the audit is always computed there and this record only written.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import analysis
import proxyfl
import wsi
from analysis.audit.options import AuditOptions
from analysis.audit.record import inputs_path
from plumbing.fingerprints import (
    file_digests,
    packages_digest,
    read_inputs_record,
    write_inputs_record,
)
from plumbing.kernels import in_effect as kernels_in_effect
from plumbing.versions import runtime_versions
from proxyfl.results import TRAINING_LIBRARIES
from wsi.store.digest import store_digest

STORE_GLOB = "*.h5"
# beside the training libraries (whose versions decide the kept models' outputs), those
# of the audit's own statistics; not MPI's (its import would initialise MPI here)
AUDIT_LIBRARIES = ("scipy",)


@functools.cache
def audit_code_digest() -> str:
    """SHA-256 of the source of ``analysis``, ``proxyfl`` and ``wsi``, as this process
    imported them."""
    return packages_digest(
        Path(analysis.__file__).parent, Path(proxyfl.__file__).parent, Path(wsi.__file__).parent
    )


@dataclass(frozen=True)
class AuditInputs:
    """What decides an audit's bytes (the module's docstring)."""

    options: dict[str, Any]
    runs: list[str]
    files: dict[str, dict[str, str]]  # run directory -> its files' digests
    stores: dict[str, str]  # store -> its digest
    code: str
    libraries: dict[str, str | None]
    kernels: dict[str, str]  # the CPU kernels' pin in effect ({}: native)

    @classmethod
    def now(
        cls,
        options: AuditOptions,
        runs: Sequence[Path],
        canary_runs: Sequence[Path],
        data: Path,
    ) -> AuditInputs:
        """The inputs of an audit of ``runs`` and ``canary_runs`` on the stores in ``data``
        with ``options``, as they are now."""
        directories = [*runs, *canary_runs]
        return cls(
            options=options.model_dump(mode="json"),
            runs=[str(run) for run in directories],
            files={str(run): file_digests(run, [run]) for run in directories},
            stores={str(path): store_digest(path) for path in sorted(data.glob(STORE_GLOB))},
            code=audit_code_digest(),
            libraries=runtime_versions((*TRAINING_LIBRARIES, *AUDIT_LIBRARIES)),
            kernels=kernels_in_effect(),
        )

    def as_json(self) -> dict[str, Any]:
        return json.loads(json.dumps(asdict(self)))


def record_inputs(out: str | os.PathLike[str], inputs: AuditInputs) -> Path:
    """Record ``inputs`` as those of the audit file ``out`` just written."""
    record = inputs_path(out)
    write_inputs_record(record, inputs.as_json(), {"audit": Path(out)})
    return record


def forget_inputs(out: str | os.PathLike[str]) -> None:
    """Remove ``out``'s record (before it is written again: no record outlives its file)."""
    inputs_path(out).unlink(missing_ok=True)


def stale_reason(out: str | os.PathLike[str], inputs: AuditInputs) -> str | None:
    """``None`` when the audit file ``out`` was computed from exactly ``inputs`` and is
    untouched since; otherwise why it must be computed again."""
    recorded, why = read_inputs_record(inputs_path(out), {"audit": Path(out)})
    if recorded is None:
        return why
    current = inputs.as_json()
    for key in ("options", "runs", "stores", "code", "libraries", "kernels"):
        if recorded.get(key) != current[key]:
            return f"its {key} changed"
    for directory, identities in current["files"].items():
        if recorded.get("files", {}).get(directory) != identities:
            return f"the files of {directory} changed"
    return None
