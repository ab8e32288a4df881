"""Run outputs: ``metrics.jsonl`` (one object per client, round and evaluated model) and
``run.json`` (configuration, world, devices, versions, timings), written atomically.

Each metrics object carries the fields of DESIGN.md §3.4 — ``algorithm, seed, client,
round, accuracy, macro_accuracy, epsilon, delta, train_loss, comm_seconds,
evaluated_model`` — plus ``center`` (the client's centre; -1 for Joint's pooled data),
``primary`` (true for the model the paper reports for this algorithm: the private model
of ProxyFL and FML, the central model of FedAvg, the local model otherwise), ``active``
(false once a client has stopped at its privacy budget) and ``n_train``. Rounds count
from 1; ``comm_seconds`` is the time this client spent in MPI exchange calls that round.
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"
RUN_FILE = "run.json"
METRIC_FIELDS: tuple[str, ...] = (
    "algorithm",
    "seed",
    "client",
    "round",
    "accuracy",
    "macro_accuracy",
    "epsilon",
    "delta",
    "train_loss",
    "comm_seconds",
    "evaluated_model",
)


def json_safe(value: Any) -> Any:
    """Non-finite floats become ``None`` so the output is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    return value


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file and ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: Path, payload: Any) -> None:
    atomic_write_text(path, json.dumps(json_safe(payload), indent=2, sort_keys=False) + "\n")


def write_metrics(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    """Rewrite ``metrics.jsonl`` with ``rows`` (sorted by round, client, model)."""
    ordered = sorted(rows, key=lambda r: (r["round"], r["client"], r["evaluated_model"]))
    atomic_write_text(path, "".join(json.dumps(json_safe(row)) + "\n" for row in ordered))


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl`` (empty if it does not exist)."""
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def library_versions() -> dict[str, str]:
    """Versions of the interpreter, the MPI library and the packages training depends on."""
    versions = {"python": sys.version.split()[0], "platform": platform.platform()}
    for package in ("torch", "torchvision", "opacus", "mpi4py", "mpich", "numpy", "h5py"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    try:
        from mpi4py import MPI

        versions["mpi_library"] = MPI.Get_library_version().strip().splitlines()[0]
    except Exception:  # pragma: no cover - MPI missing
        versions["mpi_library"] = "unknown"
    return versions
