"""The privacy audit in the report: ``results/audit.json`` (written by the audit stage) as
``tables/audit.{md,csv}``, a ROC figure and a section of report.html; a report without
the file says so, and a malformed one is refused, naming it."""

from __future__ import annotations

import base64
import csv
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from analysis.report import (
    ReportError,
    load_runs,
    plot_roc,
    read_audit,
    roc_curves,
    write_report,
)
from camelyon_proxyfl.params.audit import AuditSection
from camelyon_proxyfl.params.report import ReportParams, ReportSection
from camelyon_proxyfl.params.train import TrainSection
from flows.report import parse_config
from tests.analysis.test_report import PNG_SIGNATURE, make_run, row
from tests.analysis.test_report_html import Page

GRID = [0.0, *np.geomspace(1e-3, 1.0, 100).tolist()]
NO_VIOLATION = "no violation: every DP model's lower bound is below its accounted ε"


def roc(scale: float) -> list[float]:
    """A ROC curve on GRID: TPR = min(1, scale · FPR), 0 at FPR 0."""
    return [min(1.0, scale * fpr) for fpr in GRID]


def audit_row(
    method: str,
    client: int,
    evaluated_model: str,
    *,
    auc: float,
    tpr_1: float = 0.05,
    tpr_01: float = 0.01,
    epsilon: float | None = None,
    run: str = "training",
    bound: float | None = None,
    members: int = 409,
    scale: float = 2.0,
) -> dict[str, Any]:
    """One row as the audit stage writes it; private models are not released and have
    no DP, the others sample-level DP with ``epsilon``."""
    private = evaluated_model == "private"
    record: dict[str, Any] = {
        "method": method, "seed": 0, "client": client, "center": client,
        "model": "private" if private else "shared", "evaluated_model": evaluated_model,
        "architecture": "cnn2", "released": not private, "run": run,
        "privacy_notion": "none" if private else "sample_dp",
        "epsilon_accounted": None if private else epsilon, "delta": 0.0 if private else 1e-5,
        "epsilon_lower_bound": bound, "attack": "lira_offline" if run == "training" else "loss",
        "reference_models": 4 if run == "training" else 0, "loss_attack_auc": auc - 0.01,
        "mia_auc": auc, "mia_auc_ci": [auc - 0.05, auc + 0.05],
        "tpr_at_1pct_fpr": tpr_1, "tpr_at_1pct_fpr_ci": [0.0, tpr_1 * 2],
        "tpr_at_0_1pct_fpr": tpr_01, "tpr_at_0_1pct_fpr_ci": [0.0, tpr_01 * 3],
        "n_members": members, "n_non_members": 191, "roc_fpr": GRID, "roc_tpr": roc(scale),
    }  # fmt: skip
    if run == "canary":
        record.update(canaries=256, canary_guesses=128, canary_correct=100)
    return record


def audit_document(**changes: Any) -> dict[str, Any]:
    """ProxyFL (private and proxy models) and FedAvg (central) on two clients, and
    ProxyFL's canary run; ProxyFL's rows first (first appearance, not paper order)."""
    rows = [
        audit_row("ProxyFL", 0, "private", auc=0.80, tpr_1=0.10, tpr_01=0.02, scale=8.0),
        audit_row("ProxyFL", 0, "proxy", auc=0.52, epsilon=3.50, tpr_1=0.02, scale=1.5),
        audit_row("ProxyFL", 1, "private", auc=0.70, tpr_1=0.06, tpr_01=0.00, scale=4.0),
        audit_row("ProxyFL", 1, "proxy", auc=0.50, epsilon=3.62, tpr_1=0.01, scale=1.0),
        audit_row("FedAvg", 0, "central", auc=0.55, epsilon=2.0),
        audit_row("FedAvg", 1, "central", auc=0.53, epsilon=2.0, members=380),
        audit_row("ProxyFL", 0, "private", auc=0.90, run="canary", bound=4.2),
        audit_row("ProxyFL", 0, "proxy", auc=0.55, epsilon=3.50, run="canary", bound=0.91),
        audit_row("ProxyFL", 1, "private", auc=0.85, run="canary", bound=3.1),
        audit_row("ProxyFL", 1, "proxy", auc=0.51, epsilon=3.62, run="canary", bound=0.0),
    ]  # fmt: skip
    document = {
        "settings": {"reference_models": 4, "bootstrap": 1000, "seed": 0,
                     "canary": {"algorithms": ["ProxyFL"], "seed": 0, "count": 256,
                                "kind": "noise", "guesses": [16, 32, 64],
                                "confidence": 0.95}},
        "notes": {"training": "membership inference on the run's kept models",
                  "canary": "the canary run: the one-run ε lower bound",
                  "epsilon_lower_bound": "sample-level, at the stated confidence",
                  "privacy_notion": "none: a private model that never leaves its hospital"},
        "rows": rows,
        "violations": [],
    }  # fmt: skip
    document.update(changes)
    return document


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    make_run(root, "ProxyFL", 0, [row("ProxyFL", 0, c, 1, 0.7) for c in (0, 1)])
    make_run(root, "FedAvg", 0, [row("FedAvg", 0, c, 1, 0.6) for c in (0, 1)])
    return root


def write_audit(path: Path, document: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2))
    return path


def markdown_tables(path: Path) -> list[list[list[str]]]:
    """Every markdown table of ``path``: header and body cells (alignment row dropped)."""
    tables: list[list[list[str]]] = []
    previous = False
    for line in path.read_text().splitlines():
        is_row = line.startswith("|")
        if is_row and not previous:
            tables.append([])
        if is_row:
            tables[-1].append([cell.strip() for cell in line.strip("|").split(" | ")])
        previous = is_row
    return [[table[0], *table[2:]] for table in tables]


def page_text(page: Page) -> str:
    return " ".join("".join(page.text).split())


def test_the_audit_tables_say_the_numbers_of_the_file(runs_dir: Path, tmp_path: Path) -> None:
    audit = write_audit(tmp_path / "results" / "audit.json", audit_document())
    paths = write_report(load_runs(runs_dir), tmp_path / "results", audit=audit)
    assert paths.audit_md == tmp_path / "results" / "tables" / "audit.md"
    assert paths.audit_md.is_file() and paths.audit_csv == paths.audit_md.with_suffix(".csv")

    membership, canaries = markdown_tables(paths.audit_md)
    assert membership[0] == ["Method", "Model", "Released", "Notion / ε accounted", "Attack",
                             "MIA AUC [min–max]", "TPR @ 1 % FPR", "TPR @ 0.1 % FPR",
                             "Members / non-members"]  # fmt: skip
    lira = "LiRA offline (4 reference models)"
    assert membership[1:] == [
        ["ProxyFL", "private", "no", "none (never leaves)", lira, "0.750 [0.700–0.800]",
         "0.080", "0.010", "409/191"],
        ["ProxyFL", "proxy", "yes", "sample-level DP, ε = 3.56", lira, "0.510 [0.500–0.520]",
         "0.015", "0.010", "409/191"],
        ["FedAvg", "central", "yes", "sample-level DP, ε = 2.00", lira, "0.540 [0.530–0.550]",
         "0.050", "0.010", "380–409/191"],
    ]  # fmt: skip
    assert canaries[0] == ["Method", "Client", "Model", "Released", "ε accounted",
                           "ε lower bound (95 %)", "Canaries m", "Guesses r", "Correct v",
                           "Canary AUC"]  # fmt: skip
    assert canaries[1:] == [
        ["ProxyFL", "0", "private", "no", "none (no DP)", "4.20", "256", "128", "100", "0.900"],
        ["ProxyFL", "0", "proxy", "yes", "3.50", "0.91", "256", "128", "100", "0.550"],
        ["ProxyFL", "1", "private", "no", "none (no DP)", "3.10", "256", "128", "100", "0.850"],
        ["ProxyFL", "1", "proxy", "yes", "3.62", "0.00", "256", "128", "100", "0.510"],
    ]  # fmt: skip
    text = paths.audit_md.read_text()
    assert "## Membership inference (training runs)" in text
    assert "## One-run ε lower bound (canary runs)" in text
    assert NO_VIOLATION in text and "VIOLATION" not in text

    with open(paths.audit_csv, newline="") as handle:
        records = list(csv.DictReader(handle))
    assert len(records) == 10  # every row, training and canary
    assert [r["run"] for r in records] == ["training"] * 6 + ["canary"] * 4
    assert records[1]["mia_auc"] == "0.52"
    assert float(records[1]["mia_auc_low"]) == pytest.approx(0.47)
    assert records[1]["epsilon_accounted"] == "3.5" and records[0]["epsilon_accounted"] == ""
    assert records[6]["epsilon_lower_bound"] == "4.2" and records[6]["canaries"] == "256"
    assert "roc_fpr" not in records[0] and "roc_tpr" not in records[0]


def test_the_page_shows_the_audit_with_its_roc_figure(runs_dir: Path, tmp_path: Path) -> None:
    audit = write_audit(tmp_path / "audit.json", audit_document())
    paths = write_report(load_runs(runs_dir), tmp_path / "results", audit=audit)
    page = Page(paths.report_html.read_text())
    membership, canaries = markdown_tables(paths.audit_md)
    assert page.tables["audit-membership-table"] == membership
    assert page.tables["audit-canary-table"] == canaries

    # both figures embedded, nothing fetched: Figure 8, then the audit's ROC figure
    assert not {"script", "link", "iframe", "object", "embed"} & set(page.tags)
    assert len(page.sources) == 2
    assert all(source.startswith("data:image/png;base64,") for source in page.sources)
    assert paths.audit_roc_png is not None and paths.audit_roc_png in paths.plots()
    roc_png = base64.b64decode(page.sources[1].removeprefix("data:image/png;base64,"))
    assert roc_png == paths.audit_roc_png.read_bytes() and roc_png.startswith(PNG_SIGNATURE)

    text = page_text(page)
    assert "Empirical privacy audit" in text and NO_VIOLATION in text
    assert f"From {audit}" in text and "No audit recorded" not in text
    assert "membership inference on the run's kept models" in text  # the file's notes
    assert "none: a private model that never leaves its hospital" in text
    assert {"audit.md", "audit.csv", "audit_roc.png"} <= {Path(x).name for x in page.links}

    again = write_report(load_runs(runs_dir), tmp_path / "again", audit=audit)
    for first, second in zip(paths.all(), again.all(), strict=True):
        assert first.read_bytes() == second.read_bytes(), first.name


def test_the_roc_curves_are_the_mean_over_clients_on_log_axes(tmp_path: Path) -> None:
    path = write_audit(tmp_path / "audit.json", audit_document())
    curves = roc_curves(read_audit(path).rows)
    assert [c.label for c in curves] == ["ProxyFL: private", "ProxyFL: proxy", "FedAvg: central"]
    assert [c.released for c in curves] == [False, True, True]
    private = curves[0]
    assert private.n_models == 2  # the canary rows are not in it
    index = GRID.index(min(GRID[1:], key=lambda x: abs(x - 0.01)))
    assert private.tpr[index] == pytest.approx((8.0 + 4.0) / 2 * GRID[index])

    figure = plot_roc(curves, tmp_path / "roc.png", title="ROC")
    axes = figure.axes[0]
    assert axes.get_xscale() == "log" and axes.get_yscale() == "log"
    assert axes.get_xlim() == pytest.approx((1e-3, 1.0))
    lines = {str(line.get_label()): line for line in axes.get_lines()}
    assert set(lines) == {"chance (TPR = FPR)", *(c.label for c in curves)}
    assert lines["ProxyFL: private"].get_linestyle() != lines["ProxyFL: proxy"].get_linestyle()
    assert list(lines["chance (TPR = FPR)"].get_xdata()) == list(
        lines["chance (TPR = FPR)"].get_ydata()
    )
    assert min(lines["ProxyFL: proxy"].get_xdata()) >= 1e-3  # FPR 0 cannot be on a log axis


def test_a_violation_is_stated(runs_dir: Path, tmp_path: Path) -> None:
    listed = "ProxyFL seed 0 client 1 proxy: ε lower bound 5.000 > accounted ε 3.620"
    document = audit_document(violations=[listed])
    document["rows"][9]["epsilon_lower_bound"] = 5.0
    audit = write_audit(tmp_path / "audit.json", document)
    paths = write_report(load_runs(runs_dir), tmp_path / "results", audit=audit)
    text = paths.audit_md.read_text()
    assert NO_VIOLATION not in text
    assert "VIOLATION: an ε lower bound exceeds its accounted ε" in text and listed in text
    assert text.count("client 1 proxy") == 1  # listed once, not again from the rows
    html = paths.report_html.read_text()
    assert 'class="problem" id="audit-check"' in html and listed in page_text(Page(html))

    # a row above its ε that the file does not list is stated all the same
    document = audit_document()
    document["rows"][7]["epsilon_lower_bound"] = 4.0
    audit = write_audit(tmp_path / "unlisted.json", document)
    paths = write_report(load_runs(runs_dir), tmp_path / "unlisted", audit=audit)
    text = paths.audit_md.read_text()
    assert NO_VIOLATION not in text
    assert "ProxyFL seed 0 client 0 proxy: ε lower bound 4.000 > accounted ε 3.500" in text


def test_without_an_audit_the_page_says_so_and_no_audit_file_is_left(
    runs_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "results"
    audit = write_audit(tmp_path / "audit.json", audit_document())
    write_report(load_runs(runs_dir), out, audit=audit)
    assert (out / "tables" / "audit.md").is_file()

    missing = tmp_path / "nowhere" / "audit.json"
    paths = write_report(load_runs(runs_dir), out, audit=missing)
    assert paths.audit_md is None and paths.audit_csv is None and paths.audit_roc_png is None
    for name in ("tables/audit.md", "tables/audit.csv", "plots/audit_roc.png"):
        assert not (out / name).exists(), name  # the earlier report's, removed
    page = Page(paths.report_html.read_text())
    text = page_text(page)
    assert f"No audit recorded ({missing} absent)" in text
    assert "audit-membership-table" not in page.tables and len(page.sources) == 1

    paths = write_report(load_runs(runs_dir), out)  # no audit file given at all
    assert "No audit recorded (no audit file given)" in page_text(
        Page(paths.report_html.read_text())
    )


def _drop_field(document: dict[str, Any]) -> dict[str, Any]:
    del document["rows"][1]["mia_auc"]
    return document


def _canary_without_counts(document: dict[str, Any]) -> dict[str, Any]:
    del document["rows"][6]["canaries"]
    return document


def _bad_run_kind(document: dict[str, Any]) -> dict[str, Any]:
    document["rows"][0]["run"] = "holiday"
    return document


@pytest.mark.parametrize(
    ("write", "message"),
    [
        (lambda path: path.write_text('{"rows": [{"method"'), r"malformed JSON"),
        (lambda path: path.write_text("[1, 2]"), r"not an audit \(expected a JSON object"),
        (lambda path: write_audit(path, {"settings": {}}), r"missing field\(s\) rows"),
        (lambda path: write_audit(path, _drop_field(audit_document())),
         r"missing field\(s\) rows\.1\.mia_auc"),
        (lambda path: write_audit(path, _canary_without_counts(audit_document())),
         r"rows\.6.*a canary row needs canaries"),
        (lambda path: write_audit(path, _bad_run_kind(audit_document())),
         r"field 'rows\.0\.run'.*got 'holiday'"),
    ],
)  # fmt: skip
def test_a_malformed_audit_is_refused_naming_the_file(
    runs_dir: Path, tmp_path: Path, write: Any, message: str
) -> None:
    path = tmp_path / "audit.json"
    write(path)
    out = tmp_path / "results"
    with pytest.raises(ReportError, match=message) as caught:
        write_report(load_runs(runs_dir), out, audit=path)
    assert str(caught.value).startswith(f"{path}: ")
    assert not out.exists()  # refused before anything is written


def test_the_report_stage_reads_audit_out(tmp_path: Path) -> None:
    params = ReportParams(train=TrainSection(), report=ReportSection())  # as whole.py builds it
    assert params.config().audit == AuditSection().out == Path("results/audit.json")
    custom = ReportParams(train=TrainSection(), report=ReportSection(),
                          audit=AuditSection(out=tmp_path / "a.json"))  # fmt: skip
    assert custom.config().audit == tmp_path / "a.json"

    file = tmp_path / "params.yaml"
    file.write_text("audit:\n  out: elsewhere/audit.json\nreport:\n  out: out\n")
    assert parse_config(["--config", str(file)]).audit == Path("elsewhere/audit.json")
    flag = parse_config(["--config", str(file), "--audit", str(tmp_path / "b.json")])
    assert flag.audit == tmp_path / "b.json"


def test_no_noise_reads_as_an_infinite_epsilon_not_as_a_missing_one(
    runs_dir: Path, tmp_path: Path
) -> None:
    """σ = 0 (no DP): run.json holds ε as null (strict JSON has no infinity); the tables
    say ∞ and why, never "not recorded"."""
    rows = [audit_row("FedAvg", c, "central", auc=0.6, epsilon=None) for c in (0, 1)]
    rows.append(audit_row("FedAvg", 0, "central", auc=0.6, run="canary", bound=1.0))
    audit = write_audit(tmp_path / "audit.json", audit_document(rows=rows))
    paths = write_report(load_runs(runs_dir), tmp_path / "results", audit=audit)
    membership, canaries = markdown_tables(paths.audit_md)
    assert membership[1][3] == "sample-level DP, ε = ∞ (σ = 0: no DP)"
    assert canaries[1][4] == "∞ (σ = 0: no DP)"
    assert "not recorded" not in paths.audit_md.read_text()
