"""Run outputs, shared by the library (the rank writes them) and what reads finished runs
(:mod:`analysis`): ``metrics.jsonl`` (one :class:`MetricRow` per client, round and
evaluated model) and ``run.json`` (configuration, world, devices, versions, timings),
written atomically through :mod:`plumbing.atomic`.

:class:`MetricRow` is the one schema of a metrics line (docs/files.md §3.4): the trainer
builds rows with it, :func:`write_metrics` serialises them, and the report
(:mod:`analysis.report.load`) validates every line it reads with it. Rounds count from 1.
A row holds no time (rows written before 2026-11-24 had ``comm_seconds``, read as an
extra key): the same run writes the same rows on any machine, and its seconds are in
``machine.json``.
"""

from __future__ import annotations

import csv
import json
import math
import platform
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from plumbing import atomic
from plumbing.versions import runtime_versions

SAMPLE_DP = "sample_dp"  # proxyfl.privacy.ledger's notions (kept import-free here for the report)
LABEL_LDP = "label_ldp"
PRIVACY_NOTIONS: dict[str, str] = {
    SAMPLE_DP: "sample-level (ε, δ)-DP",
    LABEL_LDP: "label-level ε-LDP",
}

METRICS_FILE = "metrics.jsonl"
RUN_FILE = "run.json"
MACHINE_FILE = "machine.json"  # where and how the run ran (proxyfl.records); not hashed by DVC

TRAINING_LIBRARIES = ("torch", "torchvision", "opacus", "mpi4py", "mpich", "numpy", "h5py")


class MetricRow(BaseModel):
    """One line of ``metrics.jsonl``: one evaluated model of one client after one round.

    The JSON keys are the field names, in this order. Types are strict (no ``"1"`` for 1,
    no ``true`` for 1, no ``1.5`` for an integer): a row is either what the trainer wrote
    or malformed. A non-finite float is written as ``null`` (:func:`json_safe`), hence the
    optional metrics. Keys beyond these fields are kept (``extra="allow"``), so a file
    with more keys than this version knows stays readable and is rewritten unchanged.
    """

    model_config = ConfigDict(strict=True, frozen=True, extra="allow")

    algorithm: str = Field(description="the method that trained the run (ProxyFL, FedAvg, ...)")
    seed: int = Field(description="the run's --seed")
    client: int = Field(description="the client (MPI rank) whose model was evaluated")
    round: int = Field(ge=1, description="the round just finished, counted from 1")
    accuracy: float | None = Field(
        description="Σ_c M[c,c] / Σ M on the merged test splits; null for no test examples"
    )
    macro_accuracy: float | None = Field(
        description="mean recall over the classes present in the test splits; null for none"
    )
    epsilon: float | None = Field(
        description="the client's cumulative ε after this round, in the notion of "
        "privacy_notion: DP-SGD's (ε, δ) at δ, null when infinite (σ=0); PrivateKT's "
        "rounds released · ε-LDP per round (basic sequential composition)"
    )
    delta: float = Field(description="δ of the (ε, δ)-DP guarantee (0 for pure ε-LDP)")
    train_loss: float | None = Field(
        description="mean training loss of the evaluated model this round; null: no step taken"
    )
    evaluated_model: str = Field(description="which model: private, proxy, central, local")
    center: int = Field(description="the client's centre; -1 for Joint's pooled data")
    primary: bool = Field(
        description="the model the paper reports: ProxyFL's and FML's private model, "
        "FedAvg's central model, the local model otherwise"
    )
    active: bool = Field(description="false once the client has stopped at its privacy budget")
    n_train: int = Field(description="the client's number of training examples")
    # Added with PrivateKT; the defaults are what every earlier row meant.
    privacy_notion: Literal["sample_dp", "label_ldp"] = Field(
        SAMPLE_DP,
        description="which guarantee epsilon is: sample_dp (sample-level (ε, δ)-DP of "
        "DP-SGD on one training patch) or label_ldp (label-level ε-LDP of PrivateKT's "
        "randomized response on what the client sends)",
    )
    epsilon_per_round: float | None = Field(
        None,
        description="ε of one round's release (PrivateKT's ε-LDP per round); null for "
        "DP-SGD, whose ε composes through RDP rather than per round",
    )

    def as_json(self) -> str:
        """The row as one line of strict JSON (non-finite floats as null), no newline."""
        return json.dumps(json_safe(self.model_dump()))


# The declared keys of a metrics line, in file order (extra keys may follow).
METRIC_FIELDS: tuple[str, ...] = tuple(MetricRow.model_fields)


def json_safe(value: Any) -> Any:
    """Non-finite floats become ``None`` so the output is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    return value


def atomic_write_json(path: Path, payload: Any) -> None:
    """:func:`plumbing.atomic.write_json` of ``payload`` made strict JSON by :func:`json_safe`."""
    atomic.write_json(path, json_safe(payload))


def write_metrics(path: Path, rows: Iterable[MetricRow]) -> None:
    """Rewrite ``metrics.jsonl`` with ``rows`` (sorted by round, client, model), atomically."""
    ordered = sorted(rows, key=lambda r: (r.round, r.client, r.evaluated_model))
    atomic.write_text(path, "".join(row.as_json() + "\n" for row in ordered))


def read_metrics(path: Path) -> list[MetricRow]:
    """The rows of a ``metrics.jsonl`` (empty if it does not exist); raises pydantic's
    ``ValidationError`` for a malformed row (the report reads with line-level messages)."""
    path = Path(path)
    if not path.is_file():
        return []
    return [
        MetricRow.model_validate(json.loads(line))
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]


def training_library_versions() -> dict[str, str | None]:
    """Versions of the interpreter, the MPI library and the packages training depends on
    (``None`` for one that is not installed): what decides a run's numbers."""
    versions = runtime_versions(TRAINING_LIBRARIES)
    try:
        from mpi4py import MPI

        versions["mpi_library"] = MPI.Get_library_version().strip().splitlines()[0]
    except Exception:  # pragma: no cover - MPI missing
        versions["mpi_library"] = None
    return versions


def machine_versions() -> dict[str, str]:
    """The operating system and kernel (machine.json: they differ between machines that
    give the same numbers)."""
    return {"platform": platform.platform()}


# --------------------------------------------------------------------------------------
# Per-patch predictions of the final round
# --------------------------------------------------------------------------------------

PREDICTIONS_DIR = "predictions"
PREDICTION_FIELDS: tuple[str, ...] = (
    "evaluated_model", "center", "row", "patient", "label", "p_tumor",
)  # fmt: skip
"""The columns of ``predictions/client_{c}.csv``: which model of the client, the test
patch's centre, its row in that centre's test split, its patient, its label (0 healthy,
1 tumour) and the model's softmax probability of tumour (the predicted class is tumour iff
``p_tumor > 0.5``: argmax, which keeps the first class on a tie)."""


@dataclass(frozen=True)
class Predictions:
    """One client's final-round predictions on the merged test splits, one entry per
    (evaluated model, test patch), as columns."""

    evaluated_model: np.ndarray  # str
    center: np.ndarray  # int64
    row: np.ndarray  # int64
    patient: np.ndarray  # str
    label: np.ndarray  # int64
    p_tumor: np.ndarray  # float64

    def of_model(self, evaluated_model: str) -> Predictions:
        """The entries of one evaluated model (``private``, ``proxy``, ``central``, ``local``)."""
        keep = self.evaluated_model == evaluated_model
        return Predictions(*(getattr(self, name)[keep] for name in PREDICTION_FIELDS))

    def __len__(self) -> int:
        return len(self.label)


def predictions_path(run_dir: Path, client: int) -> Path:
    return Path(run_dir) / PREDICTIONS_DIR / f"client_{client}.csv"


def write_predictions(path: Path, predictions: Predictions) -> None:
    """``predictions`` as CSV sorted by model, centre and row, probabilities to 6 decimals
    (the same bytes for the same run on any machine), written atomically."""
    order = np.lexsort((predictions.row, predictions.center, predictions.evaluated_model))
    lines = [",".join(PREDICTION_FIELDS)]
    for i in order:
        lines.append(
            f"{predictions.evaluated_model[i]},{int(predictions.center[i])},"
            f"{int(predictions.row[i])},{predictions.patient[i]},{int(predictions.label[i])},"
            f"{float(predictions.p_tumor[i]):.6f}"
        )
    atomic.write_text(path, "\n".join(lines) + "\n")


def read_predictions(path: Path) -> Predictions:
    """A ``predictions/client_{c}.csv``; ``ValueError`` naming the file for another."""
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if tuple(header or ()) != PREDICTION_FIELDS:
            raise ValueError(f"{path}: expected the columns {','.join(PREDICTION_FIELDS)}")
        records = list(reader)
    try:
        columns = list(zip(*records, strict=True)) if records else [()] * len(PREDICTION_FIELDS)
        return Predictions(
            evaluated_model=np.array(columns[0], dtype=str),
            center=np.array(columns[1], dtype=np.int64),
            row=np.array(columns[2], dtype=np.int64),
            patient=np.array(columns[3], dtype=str),
            label=np.array(columns[4], dtype=np.int64),
            p_tumor=np.array(columns[5], dtype=np.float64),
        )
    except ValueError as error:
        raise ValueError(f"{path}: malformed predictions ({error})") from error
