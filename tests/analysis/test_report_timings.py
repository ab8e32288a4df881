"""The report's time accounting: one row per run from its machine.json, "—" without one,
written beside the report and never into its DVC-tracked or git-tracked outputs."""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

import yaml

from analysis.report import load_runs
from analysis.report.timings import MISSING, timing_rows, timings_markdown, write_timings
from proxyfl.results import MACHINE_FILE
from tests.analysis.test_report import runs_dir  # noqa: F401 - the fixture

REPO = Path(__file__).resolve().parents[2]


def _phases(**seconds: float) -> dict[str, float]:
    names = ("setup", "train", "eval", "comm", "checkpoint", "records", "wait",
             "server_finetune", "server_self_train", "server_sampling", "startup",
             "compile")  # fmt: skip
    return {f"{name}_seconds": float(seconds.get(name, 0.0)) for name in names}


def _write_machine(run: Path, timings: dict, ranks: list | None = None) -> None:
    (run / MACHINE_FILE).write_text(json.dumps({"ranks": ranks or [], "timings": timings}))


def test_rows_show_the_busiest_rank_and_the_wall_it_does_not_work(
    runs_dir: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    quiet = _phases(startup=2, setup=3, train=1, eval=1, records=1, wait=9)
    busy = _phases(startup=2.5, setup=3, compile=1.5, train=6, eval=2, comm=0.5,
                   checkpoint=0.5, records=0.5, wait=1)  # fmt: skip
    # the ranks' memory: a GPU's reserved memory where there is one, else the resident set
    ranks = [{"memory": {"peak_rss_gb": 3.2, "peak_gpu_allocated_gb": 4.1,
                         "peak_gpu_reserved_gb": 5.25}},
             {"memory": {"peak_rss_gb": 2.0}}]  # fmt: skip
    _write_machine(runs_dir / "FedAvg" / "seed_0", {
        "per_rank": [quiet, busy],
        "process_seconds_per_rank": [18.0, 19.0],
        "launcher": {"wall_seconds": 21.0},
    }, ranks)  # fmt: skip
    # a run made before start-up and the launcher were recorded: its ranks' clocks
    _write_machine(runs_dir / "FedAvg" / "seed_1", {
        "per_rank": [{k: v for k, v in busy.items() if k != "startup_seconds"}],
        "wall_seconds": 17.0,
    })  # fmt: skip
    (runs_dir / "ProxyFL" / "seed_0" / MACHINE_FILE).write_text("{not json")
    runs = load_runs(runs_dir)
    rows = {(row.method, row.seed): row for row in timing_rows(runs)}
    full = rows[("FedAvg", 0)]
    assert full.busiest_rank == 1 and full.wall == 21.0 and full.startup == 2.5
    assert full.work == 9.0 and full.not_work == 12.0  # train + eval + comm + checkpoint
    assert full.compile == 1.5 and full.peak_gb == 5.25
    older = rows[("FedAvg", 1)]
    assert older.wall == 17.0 and older.startup is None and older.not_work == 8.0
    for key in (("ProxyFL", 0), ("Joint", 0)):  # unreadable, absent: nothing known
        assert rows[key].wall is None and rows[key].busiest_rank is None

    markdown, table = write_timings(runs, tmp_path / "results")
    lines = markdown.read_text().splitlines()
    assert lines[0].startswith("| Method | Seed | Busiest rank | Wall s | Start-up s |")
    fedavg = "| FedAvg | 0 | 1 | 21.0 | 2.5 | 3.0 | 1.5 | 6.0 | 2.0 | 0.5 | 0.5 | 0.5 | 0.0 |"
    assert fedavg + " 1.0 | 9.0 | 12.0 | 5.25 |" in lines
    proxyfl = next(line for line in lines if line.startswith("| ProxyFL | 0 |"))
    assert proxyfl.count(MISSING) == 15
    records = list(csv.DictReader(table.open()))
    assert len(records) == len(runs)
    fedavg = next(r for r in records if (r["method"], r["seed"]) == ("FedAvg", "0"))
    assert fedavg["wall_seconds"] == "21.000" and fedavg["not_work_seconds"] == "12.000"
    assert fedavg["compile_seconds"] == "1.500" and fedavg["peak_gb"] == "5.250"
    assert next(r for r in records if r["method"] == "Joint")["wall_seconds"] == ""


def test_a_run_without_any_machine_json_is_a_row_of_dashes(runs_dir: Path) -> None:  # noqa: F811
    text = timings_markdown(timing_rows(load_runs(runs_dir, algorithms=["Joint"])))
    assert f"| Joint | 0 | {MISSING} | {MISSING} |" in text


def test_the_timings_are_outside_every_tracked_output() -> None:
    """Written to report.out/timings.*: not under a DVC output of the report stage, and
    ignored by git (they change with every launch)."""
    stage = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["report"]
    outs = [next(iter(o)) if isinstance(o, dict) else o
            for key in ("outs", "metrics", "plots") for o in stage.get(key, [])]  # fmt: skip
    out = yaml.safe_load((REPO / "params.yaml").read_text())["report"]["out"]
    tracked = [o.replace("${report.out}", out) for o in outs]
    for name in ("timings.md", "timings.csv"):
        path = f"{out}/{name}"
        assert not any(path == t or path.startswith(t + "/") for t in tracked), tracked
        ignored = subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO, check=False)
        assert ignored.returncode == 0, f"{path} is not git-ignored"
