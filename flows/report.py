"""Report flow: runs/ -> the paper's Table 2 (accuracy, macro-accuracy, ε) and Figure 8.

    finished runs -> report files: results/tables/{accuracy,privacy}.{md,csv} (accuracy:
                     the model each row evaluates, and the majority class's row),
                     results/tables/per_centre.{md,csv} (accuracy per test centre),
                     results/tables/clinical.{md,csv} (sensitivity, specificity, AUC with
                     95 % patient-bootstrap intervals; from the runs' per-patch predictions),
                     results/tables/configuration.{md,csv} (data, patches, settings),
                     results/tables/audit.{md,csv} (when the privacy audit's file,
                     audit.out, exists: membership inference per method and model, the
                     canary runs' ε lower bounds beside the accounted ε; with
                     plots/audit_roc.png, its ROC curves),
                     results/metrics.json, results/curves/*.csv, results/plots/*.png
                     (plots/curves.png: Figure 8, accuracy and macro-accuracy per round),
                     results/report.html (all of it, saying whether the slides were
                     synthetic or real, with Table 1 and the failures of the stores in
                     train.data, in one self-contained page);
                     beside them, not DVC outputs (they change with every launch):
                     results/timings.{md,csv} (where each run's wall time went, from
                     its machine.json; "—" where a run does not record it)

    python -m flows.report
    python -m flows.report --runs runs --out results --algorithms ProxyFL Joint --seeds 0 1
    python -m flows.report --data data/patches      # the stores behind report.html's Table 1
    python -m flows.report --audit results/audit.json  # the privacy audit to show

Defaults come from ``params.yaml`` (``report:``, ``audit.out``, and the runs, stores,
methods, seeds, centres and options of ``train:``). Only runs made with those parameters
are tabled: a listed run made with others (or stopped at another round) is refused by name
with the difference, or with ``--other-configurations separate`` tabled apart, labelled
with its parameters (``tables/other_configurations.md``); runs found but not listed are
named in a note. Runs made before per-patch predictions were recorded are reported too:
their per-centre and clinical cells say "no predictions recorded". Without the audit's
file (the audit stage not run) report.html says no audit was recorded and no audit table
is written; a malformed one is refused, naming it. Prints the accuracy, clinical, privacy
and audit tables. Exits 1 when a requested run is missing, unfinished or of other
parameters, or the audit's file is malformed, 2 on a bad parameter.
"""

from __future__ import annotations

import sys

from prefect import flow
from rich.console import Console
from rich.markdown import Markdown

from analysis.report import ReportError, ReportPaths
from camelyon_proxyfl.params.base import ParamsCommand
from camelyon_proxyfl.params.report import ReportConfig, ReportParams, ReportSection
from flows.artifacts import publish_report
from flows.server import run_flow_command
from plumbing.cli import exit_on_bad_parameters, refuse_unwritable
from plumbing.processes import start_command
from proxyfl.config import TrainOptions
from tasks.report import finished_runs, report_files, timing_files


@flow(name="report")
def report(config: ReportConfig) -> ReportPaths:
    """Write the report of ``config.runs`` under ``config.out`` and print its tables."""
    selection = finished_runs(config)
    paths = report_files(selection, config.out, config.data, config.audit, config.staging,
                         config.staging_dir, config.staging_pictures_mb)  # fmt: skip
    timing_files(selection, config.out)
    publish_report(paths)
    print_tables(paths)
    return paths


def print_tables(paths: ReportPaths) -> None:
    console = Console()
    tables = [("Accuracy", paths.accuracy_md),
              ("Sensitivity, specificity, AUC", paths.clinical_md),
              ("Privacy", paths.privacy_md)]  # fmt: skip
    if paths.audit_md is not None:
        tables.append(("Empirical privacy audit", paths.audit_md))
    if paths.staging_md is not None:
        tables.append(("From patches to patients (staging)", paths.staging_md))
    for title, table in tables:
        console.print(f"\n[bold]{title}[/bold] ({table})")
        console.print(Markdown(table.read_text()))
    console.print(f"\nplots: {', '.join(str(p) for p in paths.plots())}")
    console.print(f"report: {paths.report_html} (open it in a browser; it needs no network)")


def parse_config(argv: list[str] | None) -> ReportConfig:
    """``report.out`` and the runs ``train:`` describes, with the flags given laid over."""
    command = ParamsCommand(ReportParams, "python -m flows.report", __doc__.split("\n")[0], argv)
    for option, key in (("--runs", ("train", "runs")), ("--data", ("train", "data")),
                        ("--algorithms", ("train", "algorithms")),
                        ("--seeds", ("train", "seeds")),
                        ("--centers", ("train", "centers")),
                        ("--audit", ("audit", "out")),
                        ("--staging", ("stage", "summary"))):  # fmt: skip
        command.add_key(option, key)
    command.add_section(ReportSection, ("report",))
    command.add_section(TrainOptions, ("train", "options"),
                        group="the training options the runs must have been made with "
                        "(train.options in params.yaml)")  # fmt: skip
    _, params = command.parse()
    return params.config()


@exit_on_bad_parameters
def main(argv: list[str] | None = None) -> int:
    config = parse_config(argv)
    if refuse_unwritable(config.unwritable_folders()):
        return 2
    return run_flow_command(lambda: report(config), failures=(ReportError,))


if __name__ == "__main__":
    start_command()
    sys.exit(main())
