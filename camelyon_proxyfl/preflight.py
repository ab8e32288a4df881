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
  items;
- the folders it writes (``preprocess.out``, ``preprocess.cache_dir``, ``train.runs``)
  can be written;
- the run directories: no run of another configuration in ``train.runs`` is replaced
  unless asked (the rules of :mod:`camelyon_proxyfl.training_checks`, which
  ``flows.train`` applies to the stores on disk);
- where the jobs run: ``train.hostfile`` readable, ``srun`` on PATH for
  ``train.launcher: srun`` (:mod:`camelyon_proxyfl.placement`).

Each finding is an error (the run would fail), a warning (the catalogue's problems: files
that will be left out) or a note (the sizes found, or what cannot be checked yet, and
when it will be).
"""

from __future__ import annotations

from camelyon_proxyfl.findings import CentreSize, Finding
from camelyon_proxyfl.params.data import DATA_ROOT_FIX
from camelyon_proxyfl.params.whole import Params
from camelyon_proxyfl.placement import placement_findings
from camelyon_proxyfl.training_checks import (
    run_directory_findings,
    training_findings,
    writable_findings,
)
from wsi.cache import CandidateCache
from wsi.catalogue import Catalogue, DatasetRootError, check_dataset_root, scan_camelyon
from wsi.center import (
    InsufficientPatchesError,
    catalogue_test_patients,
    params_hash,
    plan_center,
)
from wsi.patches import LABEL_NAMES
from wsi.store.reader import read_store_info
from wsi.store.schema import StoreError, store_path


def preflight(params: Params, replace_runs: bool = False) -> list[Finding]:
    """Every check this module describes, on ``params`` (already validated);
    ``replace_runs``: runs of another configuration in ``train.runs`` may be replaced."""
    findings: list[Finding] = placement_findings(params.train)
    findings += writable_folder_findings(params)
    findings += run_directory_findings(params.train, replace_runs)
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
    findings += training_findings(params.train, sizes)
    return findings


def writable_folder_findings(params: Params) -> list[Finding]:
    """An error for each folder the pipeline writes that cannot be written: the stores',
    the candidate cache's and the runs' (checked by ``python -m flows.pipeline`` before its
    server starts, and again by the flow)."""
    findings = [Finding("error", key, reason)
                for key, reason in params.preprocess.unwritable_folders().items()]  # fmt: skip
    return findings + writable_findings(params.train)


def _named_centres(params: Params, catalogue: Catalogue) -> list[Finding]:
    named = {("preprocess.centers", c) for c in params.preprocess.centers}
    named |= {("train.centers", c) for c in params.train.centers}
    if "PrivateKT" in params.train.algorithms and params.train.options.public_pool == "center":
        named.add(("train.options.public_center", params.train.options.public_center))
    return [
        Finding("error", key, reason)
        for key, center in sorted(named)
        if (reason := catalogue.unlabelled_centre_reason(center)) is not None
    ]


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
        info = read_store_info(path, center=center)
    except StoreError:
        return None  # rebuilt by preprocessing
    if info.attrs.params_hash != params_hash(section.patch, section.sampling(center)):
        return None
    return CentreSize(len(info.splits["train"]), len(info.splits["test"]), "store")
