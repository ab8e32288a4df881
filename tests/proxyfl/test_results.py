"""proxyfl.results: the one metric-row schema, metrics.jsonl and run.json written atomically."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from proxyfl.results import (
    METRIC_FIELDS,
    MetricRow,
    atomic_write_json,
    json_safe,
    read_metrics,
    write_metrics,
)

# The keys of a metrics line, in the order the trainer writes them (rows written before
# 2026-11-24 also had comm_seconds after train_loss: read as an extra key).
KEYS = (
    "algorithm", "seed", "client", "round", "accuracy", "macro_accuracy", "epsilon", "delta",
    "train_loss", "evaluated_model", "center", "primary", "active", "n_train",
    "privacy_notion", "epsilon_per_round",
)  # fmt: skip


def values(**changes: Any) -> dict[str, Any]:
    row = {
        "algorithm": "ProxyFL",
        "seed": 0,
        "client": 1,
        "round": 2,
        "accuracy": 0.8240917782026769,
        "macro_accuracy": 0.8290376482418005,
        "epsilon": 1.3989672054699682,
        "delta": 1e-05,
        "train_loss": 0.42589749296506246,
        "evaluated_model": "private",
        "center": 1,
        "primary": True,
        "active": True,
        "n_train": 476,
        "privacy_notion": "sample_dp",
        "epsilon_per_round": None,
    }
    row.update(changes)
    return row


def test_fields_are_the_files_keys_in_order() -> None:
    assert METRIC_FIELDS == KEYS
    assert all(MetricRow.model_fields[name].description for name in METRIC_FIELDS)


def test_a_row_is_written_as_the_plain_dict_was() -> None:
    """Byte for byte what ``json.dumps(json_safe(dict))`` wrote before the schema."""
    for row in (
        values(),
        values(accuracy=math.nan, epsilon=None, train_loss=None),
        values(algorithm="Joint", center=-1, primary=False, active=False),
    ):
        assert MetricRow(**row).as_json() == json.dumps(json_safe(row))


def test_metrics_file_round_trip_is_byte_identical(tmp_path: Path) -> None:
    rows = [
        MetricRow(**values(round=r, client=c, evaluated_model=m, primary=m == "private"))
        for r in (2, 1)
        for c in (1, 0)
        for m in ("proxy", "private")
    ]
    path = tmp_path / "run" / "metrics.jsonl"
    write_metrics(path, rows)
    text = path.read_text()
    lines = [json.loads(line) for line in text.splitlines()]
    assert [tuple(line) for line in lines] == [KEYS] * 8
    keys = [(line["round"], line["client"], line["evaluated_model"]) for line in lines]
    assert keys == sorted(keys)
    assert read_metrics(path) == sorted(rows, key=lambda r: (r.round, r.client, r.evaluated_model))
    write_metrics(path, read_metrics(path))
    assert path.read_text() == text
    assert [p.name for p in path.parent.iterdir()] == ["metrics.jsonl"]  # no temporaries
    assert read_metrics(tmp_path / "nowhere.jsonl") == []


def test_unknown_keys_are_kept_after_the_known_ones(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    line = json.dumps({**values(), "gpu": "H100"})
    path.write_text(line + "\n")
    (row,) = read_metrics(path)
    assert row.model_extra == {"gpu": "H100"}
    write_metrics(path, [row])
    assert path.read_text() == line + "\n"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"round": 0}, "round"),
        ({"round": 1.0}, "round"),
        ({"client": True}, "client"),
        ({"seed": "0"}, "seed"),
        ({"accuracy": "0.5"}, "accuracy"),
        ({"primary": 1}, "primary"),
        ({"n_train": None}, "n_train"),
    ],
)
def test_types_are_strict(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        MetricRow.model_validate(values(**changes))
    assert [error["loc"] for error in info.value.errors()] == [(field,)]


def test_a_row_lacking_a_field_is_refused() -> None:
    row = values()
    del row["evaluated_model"]
    with pytest.raises(ValidationError, match="evaluated_model"):
        MetricRow.model_validate(row)


def test_atomic_write_json_is_strict_json(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "run.json"
    atomic_write_json(path, {"status": "finished", "epsilon": math.inf, "list": [math.nan, 1]})
    assert path.read_text() == (
        '{\n  "status": "finished",\n  "epsilon": null,\n  "list": [\n    null,\n    1\n  ]\n}\n'
    )
    assert [p.name for p in path.parent.iterdir()] == ["run.json"]
