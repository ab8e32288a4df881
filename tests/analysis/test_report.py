"""analysis.report on hand-written runs directories: statistics, ordering, errors, files."""

from __future__ import annotations

import csv
import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from analysis.report import (
    OKABE_ITO,
    PAPER_ORDER,
    AccuracyRow,
    PrivacyRow,
    ReportError,
    SampleSize,
    accuracy_table,
    curves,
    format_table,
    load_runs,
    method_style,
    plot_curves,
    plot_figure,
    privacy_table,
    sample_sizes,
    sample_title,
    write_report,
)
from analysis.report.clinical import majority_class
from analysis.report.context import data_source, majority_from_reports
from analysis.report.plots import method_groups
from analysis.report.predictions import (
    clinical_table,
    load_predictions,
    merged_majority,
    per_centre_table,
    without_predictions,
)
from analysis.report.render import summary_line
from proxyfl.names import ALGORITHMS
from proxyfl.results import MetricRow, Predictions, predictions_path, write_predictions
from wsi.summary import CenterReport

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MODEL = {"ProxyFL": "private", "FML": "private", "FedAvg": "central"}


def row(
    algorithm: str,
    seed: int,
    client: int,
    round_number: int,
    accuracy: float,
    macro: float | None = None,
    epsilon: float = 1.0,
    primary: bool = True,
) -> dict[str, Any]:
    return {
        "algorithm": algorithm,
        "seed": seed,
        "client": client,
        "round": round_number,
        "accuracy": accuracy,
        "macro_accuracy": accuracy if macro is None else macro,
        "epsilon": epsilon,
        "delta": 1e-5,
        "train_loss": 0.5,
        "evaluated_model": MODEL.get(algorithm, "local") if primary else "proxy",
        "center": -1 if algorithm == "Joint" else client,
        "primary": primary,
        "active": True,
        "n_train": 100 + client,
    }


def make_run(
    root: Path,
    algorithm: str,
    seed: int,
    rows: Sequence[dict[str, Any]],
    status: str = "finished",
    n_train: Sequence[int] | None = None,
    sigma: float = 1.4,
) -> Path:
    run_dir = root / algorithm / f"seed_{seed}"
    run_dir.mkdir(parents=True)
    clients = sorted({r["client"] for r in rows})
    sizes = list(n_train) if n_train is not None else [100 + c for c in clients]
    run = {
        "status": status,
        "algorithm": algorithm,
        "config": {
            "algorithm": algorithm,
            "seed": seed,
            "sigma": sigma,
            "delta": 1e-5,
            "rounds": max(r["round"] for r in rows),
            "batch_size": 8,
            "centers": clients,
        },
        "world_size": len(clients),
        "clients": [
            {
                "rank": i,
                "client": c,
                "center": -1 if algorithm == "Joint" else c,
                "n_train": sizes[i],
                "active": True,
            }
            for i, c in enumerate(clients)
        ],
    }
    (run_dir / "run.json").write_text(json.dumps(run))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir


def fedavg_rows(seed: int, final: Sequence[float], macro: Sequence[float]) -> list[dict]:
    """Two clients, two rounds; round 1 and non-primary rows carry decoy values."""
    rows = []
    for client in (0, 1):
        rows.append(row("FedAvg", seed, client, 1, 0.1, 0.1, epsilon=1.0))
        rows.append(row("FedAvg", seed, client, 2, final[client], macro[client], epsilon=2.0))
        rows.append(row("FedAvg", seed, client, 2, 0.0, 0.0, epsilon=2.0, primary=False))
    return rows


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    """FedAvg and ProxyFL (2 clients × 2 seeds), Joint (1 seed), Regular (1 seed)."""
    root = tmp_path / "runs"
    # FedAvg's central model: one model a seed, which both clients test on the same set
    make_run(root, "FedAvg", 0, fedavg_rows(0, [0.6, 0.6], [0.5, 0.5]))
    make_run(root, "FedAvg", 1, fedavg_rows(1, [0.9, 0.9], [1.0, 1.0]))
    for seed, eps in ((0, 2.0), (1, 2.2)):
        rows = []
        for client in (0, 1):
            acc = 0.5 + 0.1 * client + 0.2 * seed  # 0.5, 0.6, 0.7, 0.8
            rows.append(row("ProxyFL", seed, client, 1, 0.3, epsilon=1.0))
            rows.append(row("ProxyFL", seed, client, 2, acc, epsilon=eps))
            rows.append(row("ProxyFL", seed, client, 2, 0.99, epsilon=eps, primary=False))
        make_run(root, "ProxyFL", seed, rows, n_train=[38, 39])
    joint = [row("Joint", 0, 0, 1, 0.7, epsilon=0.5), row("Joint", 0, 0, 2, 0.9, epsilon=0.8)]
    make_run(root, "Joint", 0, joint, n_train=[77])
    make_run(root, "Regular", 0, [row("Regular", 0, c, 2, 0.55, epsilon=9.0) for c in (0, 1)])
    return root


def test_paper_order_names_every_algorithm() -> None:
    assert set(PAPER_ORDER) == set(ALGORITHMS)
    assert PAPER_ORDER[0] == "Regular" and PAPER_ORDER[6] == "Joint"
    assert PAPER_ORDER[-1] == "PrivateKT"  # after the paper's seven


def test_accuracy_table_final_round_primary_only_population_std(runs_dir: Path) -> None:
    table = {r.algorithm: r for r in accuracy_table(load_runs(runs_dir))}
    fedavg = table["FedAvg"]
    # one central model a seed, 0.6 and 0.9: mean 0.75, std 0.15 over n = 2 models (not
    # over 4 rows, two copies of each model)
    assert fedavg.accuracy_mean == pytest.approx(0.75)
    assert fedavg.accuracy_std == pytest.approx(0.15)
    assert fedavg.macro_accuracy_mean == pytest.approx(0.75)
    assert fedavg.macro_accuracy_std == pytest.approx(0.25)
    assert (fedavg.n, fedavg.n_seeds, fedavg.final_round) == (2, 2, 2)
    proxy = table["ProxyFL"]  # 0.5, 0.6, 0.7, 0.8: a private model a client and seed
    assert proxy.accuracy_mean == pytest.approx(0.65)
    assert proxy.accuracy_std == pytest.approx(math.sqrt(0.0125))
    assert proxy.n == 4
    assert (table["Joint"].accuracy_mean, table["Joint"].accuracy_std, table["Joint"].n) == (
        pytest.approx(0.9),
        0.0,
        1,
    )


def test_paper_order_then_unknown_methods(tmp_path: Path) -> None:
    for name in ("Zeta", "Joint", "ProxyFL", "Alpha", "Regular", "CWT"):
        make_run(tmp_path, name, 0, [row(name, 0, 0, 1, 0.5)])
    runs = load_runs(tmp_path)
    expected = ["Regular", "CWT", "ProxyFL", "Joint", "Alpha", "Zeta"]
    assert [r.algorithm for r in runs] == expected
    assert [r.algorithm for r in accuracy_table(runs)] == expected
    assert list(curves(runs)) == expected


def test_filters_select_runs_and_report_missing_pairs(runs_dir: Path) -> None:
    runs = load_runs(runs_dir, algorithms=["ProxyFL", "FedAvg"], seeds=[1])
    assert [(r.algorithm, r.seed) for r in runs] == [("FedAvg", 1), ("ProxyFL", 1)]
    with pytest.raises(ReportError, match=r"Joint/seed_1") as info:
        load_runs(runs_dir, algorithms=["Joint", "FedAvg"], seeds=[0, 1])
    assert "FedAvg/seed" not in str(info.value)
    with pytest.raises(ReportError, match=r"CWT \(any seed\)"):
        load_runs(runs_dir, algorithms=["CWT"])
    with pytest.raises(ReportError, match=r"Regular/seed_1"):
        load_runs(runs_dir, seeds=[1])
    # a replacement that was cut short before its swap: said, with what finishes it
    (runs_dir / "Joint" / ".seed_1.next").mkdir()
    with pytest.raises(
        ReportError,
        match=r"Joint/seed_1 \(Joint/seed_1: a replacement is "
        r"pending beside it, in \.seed_S\.next; .*--replace` finishes it\)",
    ):
        load_runs(runs_dir, algorithms=["Joint"], seeds=[1])


def test_filtered_out_broken_run_is_not_read(runs_dir: Path) -> None:
    (runs_dir / "Joint" / "seed_0" / "run.json").write_text("{not json")
    assert len(load_runs(runs_dir, algorithms=["FedAvg"])) == 2


def test_curves_mean_and_std_per_round(runs_dir: Path) -> None:
    points = curves(load_runs(runs_dir))["FedAvg"]
    assert [p.round for p in points] == [1, 2]
    assert (points[0].accuracy_mean, points[0].accuracy_std, points[0].n) == (
        pytest.approx(0.1),
        pytest.approx(0.0),
        2,  # one central model a seed
    )
    assert points[1].accuracy_mean == pytest.approx(0.75)
    assert points[1].accuracy_std == pytest.approx(0.15)
    proxy = curves(load_runs(runs_dir))["ProxyFL"]
    assert (proxy[1].n, proxy[1].accuracy_std) == (4, pytest.approx(math.sqrt(0.0125)))
    assert points[1].macro_accuracy_std == pytest.approx(0.25)


def test_privacy_table_from_proxyfl_with_joint_row(runs_dir: Path) -> None:
    table = privacy_table(load_runs(runs_dir))
    assert [r.client for r in table] == ["0", "1", "Joint"]
    first = table[0]
    assert (first.center, first.n_train, first.sigma, first.delta) == ("0", 38, 1.4, 1e-5)
    assert first.epsilon == pytest.approx(2.1)  # final-round ε 2.0 and 2.2 over two seeds
    assert (first.source, first.n_seeds) == ("ProxyFL", 2)
    assert table[1].n_train == 39
    joint = table[2]
    assert (joint.center, joint.n_train, joint.source) == ("pooled", 77, "Joint")
    assert joint.epsilon == pytest.approx(0.8)


def test_privacy_table_falls_back_in_paper_order(runs_dir: Path) -> None:
    runs = [r for r in load_runs(runs_dir) if r.algorithm in ("FedAvg", "Regular")]
    table = privacy_table(runs)
    assert {r.source for r in table} == {"FedAvg"}
    assert [r.epsilon for r in table] == [pytest.approx(2.0)] * 2
    regular_only = privacy_table([r for r in runs if r.algorithm == "Regular"])
    assert [(r.source, r.epsilon) for r in regular_only] == [("Regular", 9.0)] * 2


def test_format_table_markdown() -> None:
    accuracy = [AccuracyRow("ProxyFL", 0.8123, 0.0344, 0.5, 0.0, 60, 15, 30, "private")]
    assert format_table(accuracy).splitlines() == [
        "| Method | Model | Accuracy | Macro-accuracy | n |",
        "| :-- | :-- | --: | --: | --: |",
        "| ProxyFL | private | 0.812 ± 0.034 | 0.500 ± 0.000 | 60 |",
    ]
    privacy = [PrivacyRow("Joint", "pooled", 153, 1.4, 1e-5, 1.4643, "Joint", 1)]
    assert format_table(privacy).splitlines()[-1] == (
        "| Joint | pooled | 153 | 1.4 | 1e-05 | 1.46 | — | sample-level (ε, δ)-DP | Joint |"
    )
    ldp = PrivacyRow("1", "1", 40, None, 0.0, 15.0, "PrivateKT", 1, "label_ldp", 5.0)
    assert format_table([ldp]).splitlines()[-1] == (
        "| 1 | 1 | 40 | — | 0 | 15.00 | 5 "
        "| label-level ε-LDP, r·ε over the r rounds reported (basic composition) | PrivateKT |"
    )
    assert format_table([]) == ""


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: (d / "run.json").unlink(), r"run\.json: missing run\.json"),
        (lambda d: (d / "run.json").write_text("{oops"), r"run\.json: malformed JSON"),
        (lambda d: (d / "metrics.jsonl").unlink(), r"metrics\.jsonl: missing"),
        (lambda d: (d / "metrics.jsonl").write_text(""), r"metrics\.jsonl: no metrics rows"),
        (
            lambda d: (d / "metrics.jsonl").write_text(
                (d / "metrics.jsonl").read_text() + '{"algorithm": "FedAvg", \n'
            ),
            r"metrics\.jsonl: line 7: malformed JSON",
        ),
        (
            lambda d: (d / "metrics.jsonl").write_text('{"algorithm": "FedAvg", "seed": 0}\n'),
            r"line 1: missing field\(s\) client, round",
        ),
        (
            lambda d: _edit_row(d, 3, round=1.5),
            r"metrics\.jsonl: line 3: field 'round': Input should be a valid integer.*got 1\.5",
        ),
        (lambda d: _edit_row(d, 2, round=0), r"line 2: field 'round': .*greater than or equal"),
        (lambda d: _edit_row(d, 1, primary=1), r"line 1: field 'primary': .*boolean, got 1"),
        (lambda d: _edit_row(d, 4, accuracy="0.9"), r"line 4: field 'accuracy': .*got '0\.9'"),
        (lambda d: _edit_row(d, 5, seed=True), r"line 5: field 'seed': .*integer, got True"),
        (lambda d: _edit_row(d, 6, seed=3), r"line 6: row of 'FedAvg' seed 3 in the run"),
        (
            lambda d: (d / "metrics.jsonl").write_text("[1, 2]\n"),
            r"metrics\.jsonl: line 1: expected a JSON object",
        ),
        (  # the issue's: the last line gone, a mean over one client fewer than trained
            lambda d: _drop_final_rows_of(d, client=1),
            r"metrics\.jsonl: no row of client\(s\) 1 in the final round 2, though run\.json "
            r"lists them.*--algorithms FedAvg --seeds 0 --replace",
        ),
    ],
)
def test_malformed_runs_name_the_file(runs_dir: Path, damage: Any, message: str) -> None:
    damage(runs_dir / "FedAvg" / "seed_0")
    with pytest.raises(ReportError, match=message) as info:
        load_runs(runs_dir)
    assert str(runs_dir / "FedAvg" / "seed_0") in str(info.value)


def _drop_final_rows_of(run_dir: Path, client: int) -> None:
    """Remove ``client``'s rows of the final round from a run's metrics.jsonl."""
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    final = max(row["round"] for row in rows)
    kept = [r for r in rows if not (r["round"] == final and r["client"] == client)]
    assert len(kept) < len(rows)
    path.write_text("".join(json.dumps(row) + "\n" for row in kept))


def _edit_row(run_dir: Path, number: int, **changes: Any) -> None:
    """Change fields of line ``number`` (from 1) of a run's metrics.jsonl."""
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines()
    lines[number - 1] = json.dumps({**json.loads(lines[number - 1]), **changes})
    path.write_text("".join(line + "\n" for line in lines))


def test_rows_are_metric_rows_and_unknown_keys_are_kept(runs_dir: Path) -> None:
    _edit_row(runs_dir / "FedAvg" / "seed_0", 1, note="rerun on node 3")
    (run,) = load_runs(runs_dir, algorithms=["FedAvg"], seeds=[0])
    assert all(isinstance(r, MetricRow) for r in run.rows)
    assert run.rows[0].model_extra == {"note": "rerun on node 3"}
    assert [(r.client, r.accuracy) for r in run.primary_rows(2)] == [(0, 0.6), (1, 0.6)]
    assert [(r.client, r.accuracy) for r in run.model_rows(2)] == [(0, 0.6)]  # one model


def test_a_server_model_whose_clients_disagree_is_named_and_counted_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A central model is one model on one test set: clients scoring it differently is a
    fault the report names (run, round, both clients and scores) while counting the model
    once, by its lowest client's row."""
    rows = [
        {**row("FedAvg", 0, client, 1, accuracy), "evaluated_model": "central"}
        for client, accuracy in ((0, 0.7), (1, 0.7), (2, 0.65))
    ]
    run_dir = make_run(tmp_path, "FedAvg", 0, rows)
    (run,) = load_runs(tmp_path)
    with caplog.at_level(logging.WARNING, logger="analysis.report.load"):
        kept = run.model_rows(1)
    assert [(r.client, r.accuracy) for r in kept] == [(0, 0.7)]
    (warning,) = caplog.records
    assert warning.getMessage() == (
        f"{run_dir}: round 1: client 0's central model scores 0.7, client 2's 0.65"
    )


def test_unfinished_run_says_how_to_resume(tmp_path: Path) -> None:
    make_run(tmp_path, "CWT", 3, [row("CWT", 3, 0, 1, 0.5)], status="running")
    with pytest.raises(ReportError, match=r"CWT/seed_3 is unfinished .*--resume"):
        load_runs(tmp_path)


def test_no_runs_and_mismatched_directory(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match="no runs found"):
        load_runs(tmp_path)
    with pytest.raises(ReportError, match="does not exist"):
        load_runs(tmp_path / "nowhere")
    make_run(tmp_path, "FML", 0, [row("FML", 0, 0, 1, 0.5)])
    (tmp_path / "FML" / "seed_0").rename(tmp_path / "FML" / "seed_4")
    with pytest.raises(ReportError, match="directory is FML/seed_4"):
        load_runs(tmp_path)


def test_duplicate_primary_rows_are_rejected(tmp_path: Path) -> None:
    make_run(tmp_path, "CWT", 0, [row("CWT", 0, 0, 1, 0.5), row("CWT", 0, 0, 1, 0.6)])
    with pytest.raises(ReportError, match="two primary rows for client 0 in round 1"):
        load_runs(tmp_path)


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_write_report_files_parse_and_are_deterministic(runs_dir: Path, tmp_path: Path) -> None:
    runs = load_runs(runs_dir)
    paths = write_report(runs, tmp_path / "a")
    assert all(p.is_file() for p in paths.all())
    out = tmp_path / "a"
    assert not list(out.rglob(".*.tmp"))

    accuracy = read_csv(paths.accuracy_csv)
    assert [r["method"] for r in accuracy] == ["Regular", "FedAvg", "ProxyFL", "Joint"]
    assert float(accuracy[1]["accuracy_mean"]) == pytest.approx(0.75)
    assert float(accuracy[1]["accuracy_std"]) == pytest.approx(0.15)
    table = paths.accuracy_md.read_text()
    assert "| FedAvg | central | 0.750 ± 0.150 | 0.750 ± 0.250 | 2 |" in table
    assert "| Joint | local | 0.900 | 0.900 | 1 |" in table  # one model: no spread shown
    privacy = read_csv(paths.privacy_csv)
    assert [r["client"] for r in privacy] == ["0", "1", "Joint"]
    assert float(privacy[0]["epsilon"]) == pytest.approx(2.1)
    assert "| 0 | 0 | 38 | 1.4 | 1e-05 | 2.10 | — | sample-level (ε, δ)-DP | ProxyFL |" in (
        paths.privacy_md.read_text()
    )

    metrics = json.loads(paths.metrics_json.read_text())
    assert metrics["FedAvg"] == {"accuracy": pytest.approx(0.75), "macro_accuracy": 0.75}
    assert set(metrics) == {"Regular", "FedAvg", "ProxyFL", "Joint", "max_epsilon"}
    assert metrics["max_epsilon"] == pytest.approx(2.1)  # the clients', not Joint's 0.8
    assert not any("." in key or " " in key for key in _keys(metrics))

    curve = read_csv(paths.curves["FedAvg"])
    assert list(curve[0]) == [
        "round",
        "accuracy",
        "accuracy_std",
        "macro_accuracy",
        "macro_accuracy_std",
    ]
    assert [int(r["round"]) for r in curve] == [1, 2]
    assert float(curve[1]["accuracy"]) == pytest.approx(0.75)
    for png in paths.plots():
        data = png.read_bytes()
        assert len(data) > 1000 and data.startswith(PNG_SIGNATURE)

    again = write_report(runs, tmp_path / "b")
    for first, second in zip(paths.all(), again.all(), strict=True):
        assert first.read_bytes() == second.read_bytes(), first.name


def test_write_report_removes_stale_curves(runs_dir: Path, tmp_path: Path) -> None:
    runs = load_runs(runs_dir)
    write_report(runs, tmp_path)
    paths = write_report([r for r in runs if r.algorithm == "Joint"], tmp_path)
    assert sorted(p.name for p in (tmp_path / "curves").iterdir()) == ["Joint.csv"]
    assert [r["client"] for r in read_csv(paths.privacy_csv)] == ["Joint"]
    with pytest.raises(ReportError):
        write_report([], tmp_path)


FIXTURE_TITLE = (
    "Mean ± std over 2 clients × 1–2 seeds "
    "(FedAvg: 1 central model × 2 seeds; Joint: 1 pooled model × 1 seed)"
)


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from the IHDR chunk, which follows the signature."""
    assert data.startswith(PNG_SIGNATURE) and data[12:16] == b"IHDR"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_write_report_writes_the_two_panel_figure(runs_dir: Path, tmp_path: Path) -> None:
    paths = write_report(load_runs(runs_dir), tmp_path)
    assert paths.curves_png == tmp_path / "plots" / "curves.png"
    assert paths.curves_png in paths.plots() and paths.curves_png in paths.all()
    width, height = png_size(paths.curves_png.read_bytes())
    assert width / height > 2  # two panels side by side
    single_width, single_height = png_size(paths.accuracy_png.read_bytes())
    assert single_width / single_height < width / height


def test_figure_panels_legend_and_title(runs_dir: Path, tmp_path: Path) -> None:
    runs = load_runs(runs_dir)
    assert sample_sizes(runs) == {
        "Regular": SampleSize(clients=2, seeds=1),
        "FedAvg": SampleSize(clients=1, seeds=2, server_model="central"),
        "ProxyFL": SampleSize(clients=2, seeds=2),
        "Joint": SampleSize(clients=1, seeds=1),
    }
    title = sample_title(sample_sizes(runs))
    assert title == FIXTURE_TITLE
    figure = plot_figure(curves(runs), tmp_path / "curves.png", title=title)
    assert png_size((tmp_path / "curves.png").read_bytes())[0] > 0
    assert figure.get_suptitle() == FIXTURE_TITLE
    panels = figure.axes
    assert len(panels) == 2
    assert [a.get_title() for a in panels] == ["Accuracy", "Macro-accuracy"]
    assert [a.get_ylabel() for a in panels] == ["Accuracy", "Macro-accuracy"]
    assert [a.get_xlabel() for a in panels] == ["Round", "Round"]
    (legend,) = figure.legends  # one legend for both panels, in paper order
    assert [t.get_text() for t in legend.get_texts()] == ["Regular", "FedAvg", "ProxyFL", "Joint"]
    assert all(a.get_legend() is None for a in panels)
    for axes in panels:
        assert all(tick == int(tick) for tick in axes.get_xticks())
        lines = {line.get_label(): line for line in axes.get_lines()}
        assert list(lines) == ["Regular", "FedAvg", "ProxyFL", "Joint"]
        proxy = lines.pop("ProxyFL")
        assert all(proxy.get_linewidth() > line.get_linewidth() for line in lines.values())
        assert all(proxy.get_zorder() > line.get_zorder() for line in lines.values())
        assert proxy.get_alpha() == 1.0 and all(line.get_alpha() < 1 for line in lines.values())
        bands = axes.collections
        assert len(bands) == 4 and all(band.get_alpha() <= 0.25 for band in bands)
        assert max(band.get_zorder() for band in bands) < min(
            line.get_zorder() for line in axes.get_lines()
        )
        low, high = axes.get_ylim()
        y = [line.get_ydata() for line in axes.get_lines()]
        y += [path.vertices[:, 1] for band in bands for path in band.get_paths()]
        values = np.concatenate(y)
        assert low <= values.min() and values.max() <= high
        assert low >= -0.05 and high <= 1.05
    # Tightened to the data: FedAvg has accuracy 0.1 in round 1, a macro band up to 1.0.
    assert panels[0].get_ylim()[0] < 0.1 and panels[1].get_ylim()[1] > 0.8


def test_single_panel_plots_share_the_figure_styles(runs_dir: Path, tmp_path: Path) -> None:
    per_round = curves(load_runs(runs_dir))
    single = plot_curves(per_round, "macro_accuracy", "Macro-accuracy", tmp_path / "m.png")
    double = plot_figure(per_round, tmp_path / "c.png", title="t")
    (axes,) = single.axes
    assert axes.get_ylabel() == "Macro-accuracy"

    def look(line: Any) -> tuple[Any, ...]:
        return (line.get_color(), line.get_marker(), line.get_linewidth(), line.get_zorder())

    assert [look(line) for line in axes.get_lines()] == [
        look(line) for line in double.axes[1].get_lines()
    ]
    for line in axes.get_lines():
        style = method_style(line.get_label())
        assert (line.get_color(), line.get_marker()) == (style.color, style.marker)
        np.testing.assert_allclose(
            line.get_ydata(), [p.macro_accuracy_mean for p in per_round[line.get_label()]]
        )


def test_method_styles_are_colour_blind_and_greyscale_safe() -> None:
    styles = {name: method_style(name) for name in PAPER_ORDER}
    palette = set(OKABE_ITO.values())
    assert all(style.color in palette for style in styles.values())
    triples = {(s.color, str(s.linestyle), s.marker) for s in styles.values()}
    assert len(triples) == len(PAPER_ORDER)
    # Distinct without colour too: every marker, and every dash pattern, differs.
    assert len({s.marker for s in styles.values()}) == len(PAPER_ORDER)
    assert len({str(s.linestyle) for s in styles.values()}) == len(PAPER_ORDER)
    assert len({s.color for s in styles.values()}) == len(PAPER_ORDER)
    proxy = styles.pop("ProxyFL")
    assert all(proxy.linewidth > s.linewidth and proxy.zorder > s.zorder for s in styles.values())
    assert proxy.alpha == 1.0
    other = method_style("MyMethod")
    assert other == method_style("MyMethod") and other.color in palette
    assert other.marker not in {s.marker for s in styles.values()} | {proxy.marker}


def test_sample_title_states_clients_and_seeds() -> None:
    uniform = {name: SampleSize(4, 3) for name in ("FedAvg", "ProxyFL")}
    assert sample_title(uniform) == "Mean ± std over 4 clients × 3 seeds"
    mixed = {"FedAvg": SampleSize(4, 1), "ProxyFL": SampleSize(3, 1), "Joint": SampleSize(1, 2)}
    assert sample_title(mixed) == (
        "Mean ± std over 3–4 clients × 1 seed (Joint: 1 pooled model × 2 seeds)"
    )
    assert sample_title({"Joint": SampleSize(1, 5)}) == "Mean ± std over 1 pooled model × 5 seeds"
    central = SampleSize(1, 3, server_model="central")
    servers = {"FedAvg": central, "ProxyFL": SampleSize(4, 3), "PrivateKT": central}
    assert sample_title(servers) == (
        "Mean ± std over 4 clients × 3 seeds (FedAvg, PrivateKT: 1 central model × 3 seeds)"
    )
    assert sample_title({"FedAvg": central}) == "Mean ± std over 1 central model × 3 seeds"


def _keys(tree: dict[str, Any]) -> list[str]:
    keys = []
    for key, value in tree.items():
        keys.append(key)
        if isinstance(value, dict):
            keys += _keys(value)
    return keys


def test_no_noise_is_an_infinite_epsilon_in_every_file(tmp_path: Path) -> None:
    """σ = 0: the metric rows hold ε as null (infinite; strict JSON). The privacy table
    says ∞ and why, its CSV inf, metrics.json null with a flag, the summary ∞: never NaN,
    blank or "n/a", which would read as a missing value."""
    root = tmp_path / "runs"
    make_run(root, "ProxyFL", 0, [{**row("ProxyFL", 0, c, 2, 0.8), "epsilon": None}
                                  for c in (0, 1)], sigma=0.0)  # fmt: skip
    runs = load_runs(root)
    assert [r.epsilon for r in privacy_table(runs)] == [math.inf, math.inf]
    paths = write_report(runs, tmp_path / "results")
    assert "| 0 | 0 | 100 | 0 | 1e-05 | ∞ (σ = 0: no DP) | — |" in paths.privacy_md.read_text()
    assert [r["epsilon"] for r in read_csv(paths.privacy_csv)] == ["inf", "inf"]
    metrics = json.loads(paths.metrics_json.read_text())
    assert (metrics["max_epsilon"], metrics["max_epsilon_infinite"]) == (None, True)
    assert summary_line(metrics).endswith("max ε ∞ (σ = 0: no DP)")


def test_privatekt_privacy_rows_say_label_level_ldp_and_stay_out_of_max_epsilon(
    tmp_path: Path,
) -> None:
    """PrivateKT's ε (label-level ε-LDP, T·ε) is listed after the DP-SGD clients, with its
    per-round ε and its notion, and metrics.json keeps it apart from max_epsilon."""
    runs_dir = tmp_path / "runs"
    make_run(runs_dir, "ProxyFL", 0, [row("ProxyFL", 0, c, 3, 0.8, epsilon=2.0) for c in (0, 1)])
    ldp_rows = [{**row("PrivateKT", 0, c, r, 0.7, epsilon=5.0 * r), "evaluated_model": "central",
                 "privacy_notion": "label_ldp", "epsilon_per_round": 5.0, "delta": 0.0}
                for c in (0, 1) for r in (1, 2, 3)]  # fmt: skip
    make_run(runs_dir, "PrivateKT", 0, ldp_rows)
    runs = load_runs(runs_dir)
    table = privacy_table(runs)
    assert [(r.source, r.client, r.notion, r.epsilon, r.epsilon_per_round) for r in table] == [
        ("ProxyFL", "0", "sample_dp", 2.0, None),
        ("ProxyFL", "1", "sample_dp", 2.0, None),
        ("PrivateKT", "0", "label_ldp", 15.0, 5.0),
        ("PrivateKT", "1", "label_ldp", 15.0, 5.0),
    ]
    assert table[-1].sigma is None and table[-1].delta == 0.0
    paths = write_report(runs, tmp_path / "out")
    metrics = json.loads(paths.metrics_json.read_text())
    assert metrics["max_epsilon"] == 2.0 and metrics["max_epsilon_label_ldp"] == 15.0
    assert [r["method"] for r in read_csv(paths.accuracy_csv)] == ["ProxyFL", "PrivateKT"]


# --------------------------------------------------------------------------------------
# Per-patch predictions: the model each row evaluates, the majority class, per-centre
# accuracy, sensitivity, specificity and AUC with patient-bootstrap intervals
# --------------------------------------------------------------------------------------

# The merged test set: centres 0 and 1, four patches each, two patients per centre;
# 5 tumour and 3 healthy patches, so the majority class is tumour, 5/8 = 0.625.
TEST_CENTER = np.array([0, 0, 0, 0, 1, 1, 1, 1])
TEST_ROW = np.array([0, 1, 2, 3, 0, 1, 2, 3])
TEST_PATIENT = np.array(["patient_000", "patient_000", "patient_001", "patient_001",
                         "patient_020", "patient_020", "patient_021", "patient_021"])  # fmt: skip
TEST_LABEL = np.array([1, 0, 0, 1, 1, 1, 0, 1])
# ProxyFL's private models (the reported ones), client 0 and client 1:
#   client 0 says tumour (> 0.5) on patches 0, 2, 4, 7: TP 0, 4, 7; FN 3, 5; TN 1, 6; FP 2
#     sensitivity 3/5, specificity 2/3; right on centre 0: 0, 1 (2/4), centre 1: 4, 6, 7 (3/4)
#     AUC: tumour {.9, .4, .8, .3, .7} vs healthy {.2, .6, .1}: 3 + 2 + 3 + 2 + 3 = 13 of 15
#   client 1 says tumour on 3, 4, 7: TP 3, 4, 7; FN 0, 5; TN 1, 2, 6; FP none
#     sensitivity 3/5, specificity 3/3; right on centre 0: 1, 2, 3 (3/4), centre 1: 4, 6, 7
#     AUC: tumour {.5, .9, .9, .5, .9} vs healthy {.5, .5, .2}: 2 + 3 + 3 + 2 + 3 = 13 of 15
PRIVATE = {
    0: [0.9, 0.2, 0.6, 0.4, 0.8, 0.3, 0.1, 0.7],
    1: [0.5, 0.5, 0.5, 0.9, 0.9, 0.5, 0.2, 0.9],
}


def write_model_predictions(run_dir: Path, client: int, models: dict[str, Sequence[float]]) -> None:
    """``predictions/client_{c}.csv`` of ``run_dir``: each model's p_tumor on TEST_*."""
    n = len(TEST_LABEL)
    write_predictions(
        predictions_path(run_dir, client),
        Predictions(
            evaluated_model=np.repeat(list(models), n),
            center=np.tile(TEST_CENTER, len(models)),
            row=np.tile(TEST_ROW, len(models)),
            patient=np.tile(TEST_PATIENT, len(models)),
            label=np.tile(TEST_LABEL, len(models)),
            p_tumor=np.concatenate([np.asarray(p, dtype=float) for p in models.values()]),
        ),
    )


@pytest.fixture
def clinical_runs(tmp_path: Path) -> Path:
    """ProxyFL (clients 0 and 1, one seed) with predictions of its private models and of
    decoy proxies (always 0.99: sensitivity 1, specificity 0), and FedAvg without any (a
    run made before predictions were recorded)."""
    root = tmp_path / "runs"
    rows = []
    for client in (0, 1):
        rows.append(row("ProxyFL", 0, client, 1, 0.5))
        rows.append(row("ProxyFL", 0, client, 1, 0.5, primary=False))
    run_dir = make_run(root, "ProxyFL", 0, rows)
    for client in (0, 1):
        write_model_predictions(run_dir, client, {"private": PRIVATE[client],
                                                  "proxy": [0.99] * 8})  # fmt: skip
    make_run(root, "FedAvg", 0, fedavg_rows(0, [0.65, 0.65], [0.5, 0.5]))
    return root


def test_a_server_model_is_one_model_a_seed_in_every_table(tmp_path: Path) -> None:
    """FedAvg's central model, which both clients hold and test on the same patches, is one
    model of seed 0 and one of seed 1: the accuracy table, the curves, the per-centre and
    clinical tables count 2 models, not 4 (its copies would shrink the spread's n)."""
    root = tmp_path / "runs"
    for seed, final in ((0, 0.6), (1, 0.9)):
        run_dir = make_run(root, "FedAvg", seed, fedavg_rows(seed, [final, final], [0.5, 0.5]))
        for client in (0, 1):
            write_model_predictions(run_dir, client, {"central": PRIVATE[seed]})
    runs = load_runs(root)
    (fedavg,) = accuracy_table(runs)
    assert (fedavg.n, fedavg.accuracy_std) == (2, pytest.approx(0.15))
    assert [point.n for point in curves(runs)["FedAvg"]] == [2, 2]
    methods = load_predictions(runs)
    assert [(m.seed, m.client) for m in methods["FedAvg"].models] == [(0, 0), (1, 0)]
    assert {row.n_models for row in per_centre_table(methods)} == {2}
    (clinical,) = clinical_table(methods, n_resamples=50)
    assert clinical.n_models == 2


def test_clinical_measures_of_the_reported_models_by_hand(clinical_runs: Path) -> None:
    methods = load_predictions(load_runs(clinical_runs))
    assert list(methods) == ["FedAvg", "ProxyFL"]
    assert [(m.client, m.evaluated_model) for m in methods["ProxyFL"].models] == [
        (0, "private"), (1, "private")
    ]  # fmt: skip
    assert methods["FedAvg"].models == () and methods["FedAvg"].evaluated_models == ("central",)
    fedavg, proxy = clinical_table(methods, n_resamples=300)
    assert (proxy.algorithm, proxy.evaluated_model, proxy.n_models) == ("ProxyFL", "private", 2)
    assert proxy.sensitivity == pytest.approx(3 / 5)  # (3/5 + 3/5) / 2
    assert proxy.specificity == pytest.approx((2 / 3 + 1) / 2)
    assert proxy.auc == pytest.approx(13 / 15)  # (13/15 + 13/15) / 2
    assert (proxy.n_patients, proxy.n_patches, proxy.n_resamples) == (4, 8, 300)
    for name in ("sensitivity", "specificity", "auc"):
        low, value, high = (getattr(proxy, f"{name}_low"), getattr(proxy, name),
                            getattr(proxy, f"{name}_high"))  # fmt: skip
        assert 0 <= low <= value <= high <= 1
    assert fedavg.n_models == 0 and math.isnan(fedavg.sensitivity) and math.isnan(fedavg.auc)
    assert without_predictions(methods) == ["FedAvg"]


def test_per_centre_accuracy_and_majority_class_by_hand(clinical_runs: Path) -> None:
    methods = load_predictions(load_runs(clinical_runs))
    table = per_centre_table(methods)
    fedavg = [r for r in table if r.algorithm == "FedAvg"]
    assert len(fedavg) == 1 and fedavg[0].center is None and fedavg[0].n_models == 0
    proxy = {r.center: r for r in table if r.algorithm == "ProxyFL"}
    assert sorted(proxy) == [0, 1]
    # centre 0: client 0 right on 2 of 4, client 1 on 3 of 4; centre 1: 3 of 4 for both
    assert (proxy[0].accuracy_mean, proxy[0].accuracy_std) == (pytest.approx(0.625), 0.125)
    assert (proxy[1].accuracy_mean, proxy[1].accuracy_std) == (0.75, 0.0)
    assert (proxy[0].n_models, proxy[0].n_patches) == (2, 4)
    majority = merged_majority(methods)
    assert majority is not None
    assert (majority.name, majority.rate, majority.n_patches) == ("tumour", 0.625, 8)


def test_report_files_say_the_model_the_majority_class_and_the_clinical_numbers(
    clinical_runs: Path, tmp_path: Path
) -> None:
    runs = load_runs(clinical_runs)
    paths = write_report(runs, tmp_path / "a", n_resamples=200)
    accuracy = read_csv(paths.accuracy_csv)
    assert [(r["method"], r["evaluated_model"]) for r in accuracy] == [
        ("FedAvg", "central"), ("ProxyFL", "private"), ("majority class (always tumour)", ""),
    ]  # fmt: skip
    assert float(accuracy[2]["accuracy_mean"]) == 0.625
    assert float(accuracy[2]["macro_accuracy_mean"]) == 0.5
    assert accuracy[2]["n"] == "" and accuracy[2]["final_round"] == ""
    markdown = paths.accuracy_md.read_text()
    assert "| majority class (always tumour) | — | 0.625 | 0.500 | — |" in markdown
    assert "62.5% of the 8 merged test patches are tumour (from the predictions' labels)" in (
        markdown
    )
    assert "Data: unknown (no store directory given" in markdown

    clinical = {r["method"]: r for r in read_csv(paths.clinical_csv)}
    assert float(clinical["ProxyFL"]["auc"]) == pytest.approx(13 / 15)
    assert float(clinical["ProxyFL"]["specificity"]) == pytest.approx(5 / 6)
    assert clinical["ProxyFL"]["n_patients"] == "4" and clinical["ProxyFL"]["n_resamples"] == "200"
    assert clinical["FedAvg"]["n_models"] == "0" and clinical["FedAvg"]["auc"] == ""
    text = paths.clinical_md.read_text()
    assert "| ProxyFL | private | 0.600 [" in text
    assert "| FedAvg | central | no predictions recorded |" in text
    assert "percentile bootstrap over the 4 test patients (8 test patches)" in text
    assert "200 resamples" in text and "default_rng(0)" in text
    assert "Only 4 test patients: these intervals are wide" in text
    assert "No predictions recorded for: FedAvg" in text

    per_centre = read_csv(paths.per_centre_csv)
    assert [(r["method"], r["center"], r["accuracy_mean"]) for r in per_centre] == [
        ("FedAvg", "", ""), ("ProxyFL", "0", "0.625"), ("ProxyFL", "1", "0.75"),
    ]  # fmt: skip
    assert "| ProxyFL | private | 0.625 ± 0.125 | 0.750 ± 0.000 | 2 |" in (
        paths.per_centre_md.read_text()
    )
    assert "| Method | Model | Centre 0 (4 patches) | Centre 1 (4 patches) | Models |" in (
        paths.per_centre_md.read_text()
    )

    metrics = json.loads(paths.metrics_json.read_text())
    # the methods, and the majority class apart: the score every method must beat
    assert set(metrics) == {"FedAvg", "ProxyFL", "max_epsilon", "majority_class"}
    majority = next(r for r in read_csv(paths.accuracy_csv) if r["method"].startswith("majority"))
    assert metrics["majority_class"] == {
        "accuracy": pytest.approx(float(majority["accuracy_mean"])),
        "macro_accuracy": pytest.approx(float(majority["macro_accuracy_mean"])),
    }
    assert "majority" not in summary_line(metrics)
    assert metrics["FedAvg"] == {"accuracy": pytest.approx(0.65), "macro_accuracy": 0.5}
    assert metrics["ProxyFL"]["auc"] == pytest.approx(13 / 15)
    assert metrics["ProxyFL"]["sensitivity"] == pytest.approx(0.6)

    configuration = {r["setting"]: r for r in read_csv(paths.configuration_csv)}
    assert configuration["sigma"]["value"] == "1.4" and configuration["sigma"]["used_by"] == "all"
    assert configuration["seeds"]["value"] == "0"
    assert configuration["rounds"]["value"] == "2 (FedAvg); 1 (ProxyFL)"  # the runs disagree
    assert configuration["private_model"]["used_by"] == "ProxyFL"
    assert configuration["patches"]["value"] == (
        "not read: centre 0: no report beside the stores; centre 1: no report beside the stores"
    )

    again = write_report(runs, tmp_path / "b", n_resamples=200)
    for first, second in zip(paths.all(), again.all(), strict=True):
        assert first.read_bytes() == second.read_bytes(), first.name


def test_a_report_without_predictions_says_so(runs_dir: Path, tmp_path: Path) -> None:
    paths = write_report(load_runs(runs_dir), tmp_path)
    assert paths.clinical_md.read_text().startswith("\nNo predictions recorded: sensitivity")
    assert [r["n_models"] for r in read_csv(paths.clinical_csv)] == ["0"] * 4
    per_centre = paths.per_centre_md.read_text()
    assert per_centre.startswith("No predictions recorded: no per-centre accuracy")
    assert "No predictions recorded for: Regular, FedAvg, ProxyFL, Joint" in per_centre
    assert [r["center"] for r in read_csv(paths.per_centre_csv)] == [""] * 4
    assert "Majority class: not known" in paths.accuracy_md.read_text()
    assert "majority class (always" not in paths.accuracy_csv.read_text()


def test_a_client_file_missing_is_named_and_a_malformed_one_refused(
    clinical_runs: Path, tmp_path: Path
) -> None:
    run_dir = clinical_runs / "ProxyFL" / "seed_0"
    predictions_path(run_dir, 1).unlink()
    methods = load_predictions(load_runs(clinical_runs))
    assert [m.client for m in methods["ProxyFL"].models] == [0]
    assert without_predictions(methods) == ["FedAvg", "ProxyFL seed_0 client 1"]
    (_, proxy) = clinical_table(methods, n_resamples=50)
    assert proxy.n_models == 1 and proxy.specificity == pytest.approx(2 / 3)

    predictions_path(run_dir, 1).write_text("evaluated_model,center\nprivate,0\n")
    with pytest.raises(ReportError, match=r"client_1\.csv: expected the columns"):
        write_report(load_runs(clinical_runs), tmp_path / "out")
    write_model_predictions(run_dir, 1, {"private": [1.5] * 8})
    with pytest.raises(ReportError, match=r"client_1\.csv: p_tumor outside \[0, 1\]"):
        load_predictions(load_runs(clinical_runs))


def test_figure_8_sets_privatekt_apart_with_the_majority_line(tmp_path: Path) -> None:
    runs_dir = tmp_path / "runs"
    for name in ("FedAvg", "ProxyFL", "PrivateKT"):
        make_run(runs_dir, name, 0, [row(name, 0, c, r, 0.7 + 0.05 * r) for c in (0, 1)
                                     for r in (1, 2)])  # fmt: skip
    per_round = curves(load_runs(runs_dir))
    majority = majority_class([3, 5])
    assert majority is not None
    figure = plot_figure(per_round, tmp_path / "c.png", title="t", majority=majority)
    panels = figure.axes
    assert len(panels) == 4  # two rows: the paper's methods, then PrivateKT
    assert [a.get_title() for a in panels] == [
        "Accuracy: the ProxyFL paper's methods", "Macro-accuracy: the ProxyFL paper's methods",
        "Accuracy: PrivateKT (not in the paper)", "Macro-accuracy: PrivateKT (not in the paper)",
    ]  # fmt: skip
    baseline = "majority class (always tumour)"
    for axes, methods, level in zip(panels, (["FedAvg", "ProxyFL"], ["FedAvg", "ProxyFL"],
                                             ["PrivateKT"], ["PrivateKT"]),
                                    (0.625, 0.5, 0.625, 0.5), strict=True):  # fmt: skip
        lines = {line.get_label(): line for line in axes.get_lines()}
        assert list(lines) == [*methods, baseline]
        dashed = lines[baseline]
        assert dashed.get_linestyle() == "--" and list(dashed.get_ydata()) == [level, level]
        low, high = axes.get_ylim()
        assert low < level < high
    (legend,) = figure.legends
    assert [t.get_text() for t in legend.get_texts()] == ["FedAvg", "ProxyFL", "PrivateKT",
                                                          baseline]  # fmt: skip
    single = plot_curves(per_round, "accuracy", "Accuracy", tmp_path / "a.png", majority=majority)
    assert [a.get_title() for a in single.axes] == [
        "The ProxyFL paper's methods", "PrivateKT (not in the paper)"
    ]  # fmt: skip
    assert all(baseline in [line.get_label() for line in a.get_lines()] for a in single.axes)
    assert method_groups(["Zeta", "Joint", "PrivateKT", "Regular"]) == [
        ("the ProxyFL paper's methods", ["Regular", "Joint"]),
        ("PrivateKT, Zeta (not in the paper)", ["PrivateKT", "Zeta"]),
    ]
    # all seven: two rows, ProxyFL the reference in both, so no band hides seven others
    everything = ["ProxyFL", "PrivateKT", "Joint", "FML", "FedAvg", "CWT", "AvgPush", "Regular"]
    assert method_groups(everything) == [
        ("the paper's baselines", ["Regular", "FedAvg", "ProxyFL", "Joint"]),
        ("the paper's decentralised methods", ["AvgPush", "CWT", "FML", "ProxyFL"]),
        ("PrivateKT (not in the paper)", ["PrivateKT"]),
    ]
    full = {m: per_round["FedAvg"] for m in everything}
    figure = plot_figure(full, tmp_path / "all.png", title="t", majority=majority)
    assert len(figure.axes) == 3 * 2  # three rows: accuracy and macro-accuracy each
    drawn = [{line.get_label() for line in a.get_lines()} - {baseline} for a in figure.axes]
    assert drawn[0] == drawn[1] == {"Regular", "FedAvg", "ProxyFL", "Joint"}
    assert drawn[4] == drawn[5] == {"PrivateKT"}


def test_data_source_from_the_centre_reports() -> None:
    def report(center: int, **recorded: Any) -> CenterReport:
        return CenterReport.from_json({"center": center, "counts": {}, "patients": {},
                                       "store": f"center_{center}.h5", **recorded})  # fmt: skip

    synthetic = [report(0, data_root="data/synthetic", synthetic=True),
                 report(1, data_root=None, synthetic=True)]  # fmt: skip
    source = data_source(synthetic, [0, 1])
    assert source.kind == "synthetic"
    assert source.synthetic_roots == ("data/synthetic", "root not recorded")
    assert "Camelyon-17" in source.sentence() and "not Camelyon-17" in source.heading()
    assert data_source(synthetic, [0]).synthetic_roots == ("data/synthetic",)
    real = data_source([report(2, data_root="/slides", synthetic=False)], [2])
    assert (real.kind, real.sentence()) == ("real", "Real slides from /slides.")
    old = data_source([report(0)], [0])  # a report from before data_root and synthetic
    assert old.kind == "unknown" and "centre(s) 0" in old.detail
    assert data_source(synthetic, [0, 3]).kind == "unknown"  # centre 3 has no report
    assert data_source(None, [0]).detail.startswith("no store directory given")
    counts = {"train": {"healthy": 9, "tumor": 9}, "test": {"healthy": 2, "tumor": 5}}
    with_counts = [CenterReport(c, counts, {}, f"center_{c}.h5") for c in (0, 1)]
    majority = majority_from_reports(with_counts, [0, 1])
    assert majority is not None and (majority.name, majority.rate) == ("tumour", 10 / 14)
    assert majority_from_reports(with_counts, [0, 2]) is None  # centre 2 not reported


def _keep_models(run_dir: Path, seed: int) -> None:
    """A small kept ``local`` model per client of the run at ``run_dir`` (Regular's)."""
    import torch

    from proxyfl.engine.models import build_model
    from proxyfl.engine.trained import CLASSES, NORMALISATION, ModelCard, save_trained
    from proxyfl.kept import trained_path

    for client in (0, 1):
        torch.manual_seed(seed + client)
        card = ModelCard("cnn1", 2, 32, 32, NORMALISATION, CLASSES, "local", "Regular", 0,
                         client, client, 2, "sha256:" + "0" * 64)  # fmt: skip
        save_trained(build_model("cnn1", n_classes=2, input_size=32),
                     trained_path(run_dir, client, "local"), card)  # fmt: skip


def test_the_staging_is_shown_beside_its_runs_and_a_missing_picture_is_named(
    runs_dir: Path, tmp_path: Path
) -> None:
    from analysis.staging.models import staging_model

    regular = runs_dir / "Regular" / "seed_0"
    _keep_models(regular, seed=0)
    digests = {str(c): staging_model(regular, "Regular", 0, [0, 1], c).digest for c in (0, 1)}
    staging_dir = tmp_path / "staging"
    pictures = staging_dir / "center_0" / "pictures"
    pictures.mkdir(parents=True)
    for node in (0, 1, 2):  # 1,000 bytes each
        (pictures / f"patient_000_node_{node}.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 992)
    picture = pictures / "patient_000_node_0.png"
    confusion = [[0] * 5 for _ in range(5)]
    confusion[3][4] = 1  # one pN1 patient called pN2
    summary = tmp_path / "staging.json"
    summary.write_text(json.dumps({
        "format": 2, "measures": [], "failures": [],
        "methods": {"Regular/seed_0": {
            "n_patients": 1, "n_slides": 3,
            "thresholds": {"0": {"patient_000": 0.5}, "1": {"patient_020": 0.7}},
            "stages": {"patient_000": ["pN1", "pN2"]}, "incomplete": [], "models": digests,
            "stage_confusion": confusion,
        }},
        "wrong_calls": {"0": {"patient_000_node_0": 0, "patient_000_node_1": 0,
                              "patient_000_node_2": 1}},
        "pictures": {"0": {f"patient_000_node_{n}": f"pictures/patient_000_node_{n}.png"
                           for n in (0, 1, 2)}},
    }))  # fmt: skip
    runs = load_runs(runs_dir)
    paths = write_report(runs, tmp_path / "out", staging=summary, staging_dir=staging_dir)
    assert paths.staging_md is not None
    markdown = paths.staging_md.read_text()
    assert "| Regular/seed_0 |" in markdown and "| 0: 0.5; 1: 0.7 |" in markdown
    assert "Stage confusion of Regular/seed_0" in markdown
    assert "| pN1 | 0 | 0 | 0 | 0 | 1 |" in markdown  # true pN1, predicted pN2
    page = paths.report_html.read_text()
    assert page.count('<figure class="staging">') == 3 and "3 of 3 slides shown" in page
    assert 'id="stage-confusion-1"' in page
    # a budget of two pictures: the slide a method called wrong first, then one other
    paths = write_report(runs, tmp_path / "out", staging=summary, staging_dir=staging_dir,
                         staging_pictures_mb=0.0025)  # fmt: skip
    page = paths.report_html.read_text()
    assert page.count('<figure class="staging">') == 2 and "2 of 3 slides shown" in page
    assert "patient_000_node_2: the slide" in page

    # a picture the summary names that is gone: refused, naming it and the repair
    picture.unlink()
    with pytest.raises(ReportError, match=r"patient_000_node_0\.png: the picture of .* "
                       r"`camelyon-proxyfl stage --centers 0`"):  # fmt: skip
        write_report(runs, tmp_path / "out", staging=summary, staging_dir=staging_dir)

    # the run retrained since: the staging is of other models, not shown (no error)
    _keep_models(regular, seed=5)
    paths = write_report(runs, tmp_path / "out", staging=summary, staging_dir=staging_dir)
    assert paths.staging_md is None and not (tmp_path / "out/tables/staging.md").exists()
    page = paths.report_html.read_text()
    assert "is not a staging of these runs: Regular/seed_0 stages centre 0 with another" in page
