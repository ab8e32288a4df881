"""What a pipeline run can check before any work, so that it fails in seconds, not after
minutes of preprocessing or in an MPI job (``python -m flows.pipeline --check``).

- ``data.root`` is a Camelyon-17 dataset root (the embedded synthetic one may be absent:
  the pipeline writes it), and every centre named (``preprocess.centers``,
  ``train.centers``, PrivateKT's ``public_center``) has labelled slides there;
- per centre, once the candidate cache holds every slide's candidates for these patch
  parameters: enough candidates of each label for ``patches_per_class`` (the check the
  preprocess flow makes before writing a store), and the exact train and test sizes of
  the store to come (its test patients come from the catalogue and its patches from the
  seeded sampler, so no pixel is read);
- otherwise the sizes of a store already built with these parameters, else the bound
  n_train ≤ 2 · patches_per_class;
- ``train.options.batch_size`` against every client's training size (Joint: the pooled
  size), as ``proxyfl.run`` would find it, and non-empty test splits;
- PrivateKT: a public pool of at least K (``kt_samples``) and M (``self_train_samples``)
  items.

Each finding is an error (the run would fail), a warning (the catalogue's problems: files
that will be left out) or a note (the sizes found, or what cannot be checked yet, and
when it will be).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from camelyon_proxyfl.params import DATA_ROOT_FIX, Params
from plumbing.errors import PipelineError
from wsi.cache import CandidateCache
from wsi.catalogue import Catalogue, DatasetRootError, check_dataset_root, scan_camelyon
from wsi.center import (
    InsufficientPatchesError,
    catalogue_test_patients,
    params_hash,
    plan_center,
)
from wsi.patches import LABEL_NAMES
from wsi.store import StoreError, read_store_info, store_path

Level = Literal["error", "warning", "note"]
LOG_LEVELS = {"error": logging.ERROR, "warning": logging.WARNING, "note": logging.INFO}


@dataclass(frozen=True)
class Finding:
    """One thing checked: how bad (``level``), about what (``subject``), and what."""

    level: Level
    subject: str
    message: str

    def __str__(self) -> str:
        return f"{self.level}: {self.subject}: {self.message}"


@dataclass(frozen=True)
class CentreSize:
    """A centre's training and test sizes, and where they come from: ``plan`` (exact, from
    the cached candidates), ``store`` (exact, a store built with these parameters) or
    ``bound`` (``train`` is an upper bound, ``test`` unknown)."""

    train: int
    test: int | None
    source: Literal["plan", "store", "bound"]


class PreflightFailed(PipelineError):
    """Raised by a run whose checks found errors; the message lists them."""


def preflight(params: Params) -> list[Finding]:
    """Every check this module describes, on ``params`` (already validated)."""
    findings: list[Finding] = []
    data = params.data
    try:
        check_dataset_root(data.root)
    except DatasetRootError as error:
        if data.is_synthetic and not data.root.exists():
            findings.append(Finding("note", "data.root", f"{data.root} is absent: the "
                                    "pipeline writes the synthetic dataset first; the "
                                    "centres are checked once it exists"))  # fmt: skip
        else:
            findings.append(Finding("error", "data.root", f"{error}; {DATA_ROOT_FIX}"))
        return findings
    catalogue = scan_camelyon(data.root)
    wanted = set(params.preprocess.centers)
    findings += [Finding("warning", "catalogue", f"{problem} (left out)")
                 for problem in catalogue.problems
                 if problem.center is None or problem.center in wanted]  # fmt: skip
    findings += _named_centres(params, catalogue)
    if any(f.level == "error" for f in findings):
        return findings
    sizes: dict[int, CentreSize] = {}
    for center in sorted(set(params.preprocess.centers)):
        size, finding = centre_size(params, catalogue, center)
        findings.append(finding)
        if size is not None:
            sizes[center] = size
    findings += _training(params, sizes)
    return findings


def errors(findings: Sequence[Finding]) -> list[Finding]:
    return [finding for finding in findings if finding.level == "error"]


def _named_centres(params: Params, catalogue: Catalogue) -> list[Finding]:
    labelled = {r.center for r in catalogue.slides if r.node_label is not None}
    named = {("preprocess.centers", c) for c in params.preprocess.centers}
    named |= {("train.centers", c) for c in params.train.centers}
    if "PrivateKT" in params.train.algorithms:
        named.add(("train.options.public_center", params.train.options.public_center))
    return [
        Finding("error", key, f"centre {center} has no labelled slide under "
                f"{catalogue.root} (centres with labelled slides: {sorted(labelled)})")
        for key, center in sorted(named) if center not in labelled
    ]  # fmt: skip


def centre_size(
    params: Params, catalogue: Catalogue, center: int
) -> tuple[CentreSize | None, Finding]:
    """``center``'s store sizes, exact where the cache or a current store allows, and the
    finding that says so; no sizes, and an error, when the centre will fall short."""
    section = params.preprocess
    patch, sampling = section.patch, section.sampling(center)
    records = [r for r in catalogue.for_centers([center]) if r.node_label is not None]
    cache = CandidateCache(section.cache_dir)
    slides = [cache.load(record, patch) for record in records]
    missing = [r.slide_id for r, s in zip(records, slides, strict=True) if s is None]
    subject = f"centre {center}"
    if not missing:
        try:
            plan = plan_center(center, slides, sampling,  # type: ignore[arg-type]
                               catalogue_test_patients(records, patch, sampling))  # fmt: skip
        except InsufficientPatchesError as error:
            return None, Finding("error", subject, error.reason)
        train, test = (sum(plan.split(s).label_counts(len(LABEL_NAMES))) for s in ("train", "test"))
        return CentreSize(train, test, "plan"), Finding(
            "note", subject, f"{train} training and {test} test patches (planned from the "
            f"cached candidates of its {len(records)} slides)")  # fmt: skip
    stored = _current_store(params, center)
    uncached = (f"{len(missing)} of {len(records)} slides' candidates are not cached yet "
                f"(e.g. {missing[0]}): the patches per label are checked when preprocessing "
                "computes them")  # fmt: skip
    if stored is not None:
        held = f"its current store holds {stored.train} training, {stored.test} test patches"
        return stored, Finding("note", subject, f"{uncached}; {held}")
    bound = len(LABEL_NAMES) * sampling.patches_per_class
    return CentreSize(bound, None, "bound"), Finding("note", subject, uncached)


def _current_store(params: Params, center: int) -> CentreSize | None:
    """The sizes of ``center``'s store if one was built with these parameters."""
    section = params.preprocess
    path = store_path(section.out, center)
    if not path.is_file():
        return None
    try:
        info = read_store_info(path)
    except StoreError:
        return None  # rebuilt by preprocessing
    if info.attrs.params_hash != params_hash(section.patch, section.sampling(center)):
        return None
    return CentreSize(len(info.splits["train"]), len(info.splits["test"]), "store")


def _training(params: Params, sizes: dict[int, CentreSize]) -> list[Finding]:
    """Batch size against each client's training size, test splits, the public pool."""
    train, findings = params.train, []
    batch = train.options.batch_size
    clients = [c for c in train.centers if c in sizes]
    per_client = any(algorithm != "Joint" for algorithm in train.algorithms)
    groups = [([c], f"centre {c}") for c in clients] if per_client else []
    if "Joint" in train.algorithms:
        groups.append((clients, f"Joint's pooled centres {clients}"))
    for centres, name in groups:
        n_train = sum(sizes[c].train for c in centres)
        exact = all(sizes[c].source != "bound" for c in centres)
        if batch > n_train:
            what = "training patches" if exact else "patches at most (2 × patches_per_class)"
            message = f"{batch} is larger than the {n_train} {what} of {name}"
            findings.append(Finding("error", "train.options.batch_size", message))
    for c in clients:
        if sizes[c].test == 0:
            findings.append(Finding("error", f"centre {c}", "its test split would be empty"))
    if "PrivateKT" in train.algorithms:
        findings += _public_pool(params, sizes)
    return findings


def _public_pool(params: Params, sizes: dict[int, CentreSize]) -> list[Finding]:
    options = params.train.options
    size = sizes.get(options.public_center)
    if size is None or size.test is None:
        return []
    pool = size.train + size.test
    asked = {"kt_samples": options.kt_samples, "self_train_samples": options.self_train_samples}
    return [
        Finding("error", f"train.options.{key}", f"{value} is more than the {pool} items of "
                f"the public pool (centre {options.public_center})")
        for key, value in asked.items() if value is not None and value > pool
    ]  # fmt: skip
