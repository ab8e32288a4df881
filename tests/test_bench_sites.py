"""``python -m bench sites``' figures from a run's records: the rounds' seconds are rank 0's
phases, the start and stop the rest of the job, and a site's bytes its send log's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.bench_sites import _figures, report


def _run(folder: Path, sent: list[list[tuple[int, str]]]) -> Path:
    phases = {"train_seconds": 3.0, "eval_seconds": 1.0, "comm_seconds": 0.5,
              "checkpoint_seconds": 0.25, "records_seconds": 0.25, "wait_seconds": 1.0,
              "setup_seconds": 9.0, "startup_seconds": 2.0}  # fmt: skip
    (folder / "ranks").mkdir(parents=True)
    (folder / "machine.json").write_text(json.dumps({"timings": {"per_rank": [phases]}}))
    for rank, messages in enumerate(sent):
        entries = [{"round": 1, "kind": "model", "peer": 0, "values": values, "dtype": dtype}
                   for values, dtype in messages]  # fmt: skip
        (folder / "ranks" / f"rank_{rank}.json").write_text(json.dumps({"sent": entries}))
        (folder / "ranks" / f"rank_{rank}.machine.json").write_text("{}")  # not a record
    return folder


def test_the_figures_are_the_records(tmp_path: Path) -> None:
    run = _run(tmp_path, [[(1000, "float32"), (1, "float64")], [(1000, "float32")],
                          [(2000, "float32")]])  # fmt: skip
    figures = _figures(run, rounds=2, wall=20.0)
    assert figures["round_s"] == pytest.approx(6.0 / 2)  # train..wait, not setup or start-up
    assert figures["comm_s_per_round"] == pytest.approx(0.25)
    assert figures["start_stop_s"] == pytest.approx(20.0 - 6.0)
    # per site per round, median over the sites: (4008, 4000, 8000) bytes over 2 rounds
    assert figures["sent_kb_per_site_round"] == pytest.approx(4008 / 2 / 1e3)
    table = report(
        [
            {
                "algorithm": "FedAvg",
                "medians": {"mpiexec": figures, "flare": {**figures, "job_s": 25.0}},
            }
        ]
    )
    assert "| FedAvg | flare − mpiexec | +5.00 | +0.00 |" in table
