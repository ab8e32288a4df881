"""What a training launch can check before it starts a server or an MPI job: the stores it
reads, the batch size against every client's training size, PrivateKT's public pool (the
ranks' own rules, :mod:`proxyfl.rules`), the run directories it would write (writable;
:mod:`proxyfl.launch.rundir`: never a finished run of another configuration without
``--replace``), and where the jobs would run (a hostfile there, ``srun`` to call:
:mod:`camelyon_proxyfl.placement`). The pipeline's preflight uses the same rules with the
sizes its planning gives; ``flows.train`` with the sizes of the stores on disk.
"""

from __future__ import annotations

from collections.abc import Mapping

from camelyon_proxyfl.findings import CentreSize, Finding
from camelyon_proxyfl.params.train import TrainSection
from camelyon_proxyfl.placement import placement_findings
from plumbing.atomic import unwritable_reason
from proxyfl.launch.rundir import RunConflict, check_launch, read_centers
from proxyfl.rules import (
    SHUFFLED_BATCHES,
    batch_size_problem,
    held_out_count,
    public_pool_problems,
    share_pool_name,
)
from wsi.store.reader import read_store_info
from wsi.store.schema import StoreError, rebuild_hint, store_path


def stored_sizes(train: TrainSection) -> tuple[dict[int, CentreSize], list[Finding]]:
    """The sizes of every store the jobs of ``train`` read, from the stores themselves,
    and an error naming the centre, the file and the fix for each that cannot be read."""
    sizes: dict[int, CentreSize] = {}
    findings: list[Finding] = []
    centers = {c for config in train.job_configs() for c in read_centers(config)}
    for center in sorted(centers):
        path = store_path(train.data, center)
        try:
            info = read_store_info(path, center=center)
        except StoreError as error:
            findings.append(Finding("error", f"centre {center}",
                                    f"{path}: {error.reason}; {rebuild_hint(center)}"))  # fmt: skip
            continue
        sizes[center] = CentreSize(len(info.splits["train"]), len(info.splits["test"]), "store")
    return sizes, findings


def training_findings(train: TrainSection, sizes: Mapping[int, CentreSize]) -> list[Finding]:
    """Batch size against each client's training size (Joint: pooled), test splits, and
    PrivateKT's public pool, for the centres whose ``sizes`` are known."""
    findings = []
    batch = train.options.batch_size
    clients = [c for c in train.centers if c in sizes]
    per_client = any(
        algorithm not in ("Joint", *SHUFFLED_BATCHES) for algorithm in train.algorithms
    )
    groups = [([c], f"centre {c}") for c in clients] if per_client else []
    if "Joint" in train.algorithms:
        groups.append((clients, f"Joint's pooled centres {clients}"))
    for centres, name in groups:
        n_train = sum(sizes[c].train for c in centres)
        exact = all(sizes[c].source != "bound" for c in centres)
        problem = batch_size_problem(batch, n_train, name, exact=exact)
        if problem is not None:
            findings.append(Finding("error", "train.options.batch_size", problem))
    for c in clients:
        if sizes[c].test == 0:
            findings.append(Finding("error", f"centre {c}", "its test split would be empty"))
    if "PrivateKT" in train.algorithms:
        findings += _public_pool(train, sizes)
    return findings


def _public_pool(train: TrainSection, sizes: Mapping[int, CentreSize]) -> list[Finding]:
    options = train.options
    if options.public_pool == "share":
        clients = [c for c in train.centers if c in sizes]
        pool_size = sum(held_out_count(sizes[c].train, options.public_share) for c in clients)
        pool = share_pool_name(options.public_share, clients)
    else:
        size = sizes.get(options.public_center)
        if size is None or size.test is None:
            return []
        pool_size, pool = size.train + size.test, f"centre {options.public_center}"
    problems = public_pool_problems(options.kt_samples, options.self_train_samples,
                                    pool_size, pool)  # fmt: skip
    return [Finding("error", f"train.options.{key}", reason) for key, reason in problems.items()]


def run_directory_findings(train: TrainSection, replace: bool) -> list[Finding]:
    """An error for each job that would replace a run of another configuration."""
    findings = []
    for config in train.job_configs():
        try:
            check_launch(config, replace)
        except RunConflict as conflict:
            findings.append(Finding("error", str(conflict.subject), conflict.reason))
    return findings


def writable_findings(train: TrainSection) -> list[Finding]:
    """An error when ``train.runs`` cannot be written (a read-only file system, another
    user's folder): every launch writes there, a kept run's lock file included, and would
    otherwise learn it only once its server and ranks had started."""
    reason = unwritable_reason(train.runs, "every launch writes its runs there, even one "
                               "that keeps a finished run (its lock file); make it "
                               "writable, or set train.runs to a folder that is")  # fmt: skip
    return [Finding("error", "train.runs", reason)] if reason else []


def check_training(train: TrainSection, replace: bool) -> list[Finding]:
    """Every check of this module for the jobs of ``train``, on the stores as they are."""
    findings = placement_findings(train) + writable_findings(train)
    findings += run_directory_findings(train, replace)
    sizes, unreadable = stored_sizes(train)
    return findings + unreadable + training_findings(train, sizes)
