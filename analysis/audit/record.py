"""An audit's record of its inputs (``AUDIT.inputs.json`` beside the audit file), as a
reader of the audit sees it: whether the runs it read are still the ones it describes.

:mod:`analysis.audit.freshness` writes the record and decides from it whether to compute
the audit again; this module holds what the report needs of it, without the audit's own
code (models, stores, statistics).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from plumbing.fingerprints import file_digest
from proxyfl.kept import MODELS_DIR
from proxyfl.results import RUN_FILE


def inputs_path(out: str | os.PathLike[str]) -> Path:
    """Where the record of ``out``'s inputs lives, beside it: ``audit.inputs.json``."""
    out = Path(out)
    return out.with_name(f"{out.stem}.inputs.json")


def changed_since_audit(out: str | os.PathLike[str]) -> str | None:
    """Why the audit file ``out`` no longer describes the runs it read, for a reader of
    it (the report): the file is not the one its record describes, or a run record or
    kept model it read has changed or gone since. ``None`` when they match, or when no
    record was written (an audit made before records were). Only the files that decide
    its rows are compared: a run's log and machine record change with every launch."""
    out, record_file = Path(out), inputs_path(out)
    if not record_file.is_file():
        return None
    try:
        record = json.loads(record_file.read_text())
        files, written = record["inputs"]["files"], record["audit"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"no readable record of its inputs ({record_file})"
    if written != file_digest(out):
        return f"{out} is not the file its record ({record_file}) describes"
    for directory, digests in files.items():
        for name, digest in digests.items():
            if name != RUN_FILE and not name.startswith(f"{MODELS_DIR}/"):
                continue
            path = Path(directory) / name
            if not path.is_file():
                return f"{path} is gone since the audit"
            if file_digest(path) != digest:
                return f"{path} changed since the audit"
    return None
