"""The whole pipeline as one flow, each stage its own flow run in Prefect:

    slides --preprocess--> centre stores --train--> runs/ --audit--> results/audit.json
           --stage--> staging/, results/staging.json --report--> tables and curves

What is up to date is kept, as ``dvc repro`` keeps it: a store whose recorded inputs are
unchanged (:mod:`wsi.freshness`), a finished run of the same configuration and stores
(:mod:`proxyfl.launch.rundir`).

The embedded synthetic slides are written first when ``data.root`` is ``data/synthetic``
and they are absent; any other missing or empty data root fails the flow at once. Then,
before any work, the checks of :mod:`camelyon_proxyfl.preflight` (centres, patches
available per label, batch size against training sizes, PrivateKT's public pool).

    python -m flows.pipeline                       # params.yaml (the demo configuration)
    python -m flows.pipeline --config params-paper.yaml
    python -m flows.pipeline --check               # those checks only: exit 0, or 2
    python -m flows.pipeline --rebuild-stores      # every store built, up to date or not

Also the entry points of the Prefect deployments in ``prefect.yaml``: ``pipeline`` for the
whole thing and ``preprocess_centre`` for one centre's store. Exits 1 when a stage fails
(the message says which and why), 2 on a bad parameter.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from prefect import flow, get_run_logger

from analysis.audit.population import AuditInputError
from analysis.audit.runs import AuditViolation
from analysis.report import ReportError, ReportPaths
from analysis.report.render import summary_line
from analysis.staging.models import StagingModelError
from camelyon_proxyfl.findings import PreflightFailed, errors
from camelyon_proxyfl.params.base import DEFAULT_PARAMS, ParamsCommand
from camelyon_proxyfl.params.whole import Params, load_params
from camelyon_proxyfl.placement import placement
from camelyon_proxyfl.preflight import preflight, writable_folder_findings
from flows.audit import privacy_audit
from flows.canary import canary_run
from flows.preprocess import PreprocessFailed, run_preprocess, stale_stores
from flows.report import report
from flows.server import address_towards, run_flow_command
from flows.stage import staging
from flows.train import train
from plumbing.cli import exit_on_bad_parameters
from plumbing.kernels import pin_this_command
from plumbing.locks import Busy
from plumbing.processes import start_command
from proxyfl.canaries import CanaryPlanError
from proxyfl.launch.job import TrainingJobFailed, warm_ranks
from proxyfl.launch.rundir import RunConflict
from tasks.checks import preflight_checks
from tasks.data import dataset
from wsi.catalogue import DatasetRootError


def load_pipeline_params(params_file: Path) -> Params:
    """``params_file`` validated, its stages checked to fit together."""
    params = load_params(Path(params_file))
    params.check_pipeline(params_file)
    return params


@flow(name="pipeline")
def pipeline(
    params_file: Path = DEFAULT_PARAMS, replace_runs: bool = False, rebuild_stores: bool = False
) -> ReportPaths:
    """Slides to accuracy, macro-accuracy and ε tables, as ``params_file`` describes.

    What is up to date is kept, as ``dvc repro`` would: a store built from the same slides,
    parameters, code and libraries (:mod:`wsi.freshness`; ``rebuild_stores`` builds every
    store all the same), and a finished run of this configuration on these stores
    (:mod:`proxyfl.launch.rundir`). ``replace_runs``: runs of another configuration in
    ``train.runs`` are replaced (else the checks refuse)."""
    params = load_pipeline_params(Path(params_file))
    dataset(params.data)
    preflight_checks(params, replace_runs)
    stores = params.preprocess_config()
    to_build = list(stores.centers) if rebuild_stores else stale_stores(stores)
    if to_build:
        run_preprocess(stores.model_copy(update={"centers": to_build}))
    else:
        get_run_logger().info("every store is up to date: preprocessing skipped")
    with warm_ranks(placement(params.train)):  # one warm server for every training job
        train(params.train, replace_runs)
        for algorithm in params.audit.canary.algorithms:
            canary_run(params.train, params.audit, algorithm)
    privacy_audit(params.train, params.audit)
    staging(params.staging_params(), params.train.centers)
    paths = report(params.report_config())
    # the run's last line: its result, for a log read from the end
    summary = summary_line(json.loads(paths.metrics_json.read_text()))
    get_run_logger().info("result: %s (tables: %s)", summary, paths.accuracy_md.parent)
    return paths


@flow(name="preprocess-centre")
def preprocess_centre(center: int, params_file: Path = DEFAULT_PARAMS) -> None:
    """Rebuild one centre's store with the parameters of ``params_file``."""
    config = load_params(Path(params_file)).preprocess_config()
    run_preprocess(config.model_copy(update={"centers": [center]}))


def print_findings(params: Params, replace_runs: bool = False) -> int:
    """``--check``: every finding, one line each; 2 when any is an error."""
    findings = preflight(params, replace_runs)
    for finding in findings:
        print(finding)
    count = Counter(finding.level for finding in findings)
    print(f"{count['error']} error(s), {count['warning']} warning(s), {count['note']} note(s)")
    return 2 if errors(findings) else 0


@exit_on_bad_parameters
def main(argv: list[str] | None = None) -> int:
    command = ParamsCommand(Params, "python -m flows.pipeline", __doc__.split("\n")[0], argv)
    command.parser.add_argument(
        "--check", action="store_true",
        help="only check what can be checked before any work (data root, centres, patches "
        "available per label, batch size against training sizes) and exit: 0, or 2 on errors",
    )  # fmt: skip
    command.parser.add_argument(
        "--replace-runs", action="store_true",
        help="replace the runs in train.runs made with another configuration (each stays "
        "until its successor has finished); without it the checks refuse them",
    )  # fmt: skip
    command.parser.add_argument(
        "--rebuild-stores", action="store_true",
        help="build every centre's store, even those whose recorded inputs (slides, "
        "parameters, code, libraries) are unchanged; without it those are kept",
    )  # fmt: skip
    args, _ = command.parse()  # --config only: the stages' keys are set in the file
    params = load_pipeline_params(command.params_file)
    if args.check:
        return print_findings(params, args.replace_runs)
    if argv is None:  # this process's own command line: run it again pinned, if need be
        # the stages' kernels, as dvc repro runs them: the same bytes from either path
        pin_this_command(params.machine.cpu_kernels)
    unwritable = writable_folder_findings(params)  # before a server, or a slide, is started
    for finding in unwritable:
        print(finding, file=sys.stderr)
    if unwritable:
        return 2
    scheduler = params.preprocess.scheduler_address
    return run_flow_command(  # one server for the pipeline, its stages and their workers
        lambda: pipeline(command.params_file, args.replace_runs, args.rebuild_stores),
        failures=(
            DatasetRootError,
            PreflightFailed,
            Busy,
            RunConflict,
            PreprocessFailed,
            TrainingJobFailed,
            CanaryPlanError,
            AuditInputError,
            AuditViolation,
            StagingModelError,
            ReportError,
        ),
        host=address_towards(scheduler) if scheduler else "127.0.0.1",
    )


if __name__ == "__main__":
    start_command()
    sys.exit(main())
