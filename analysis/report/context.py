"""What a report's numbers are of: the slides (synthetic or real, from which root), the
stores' patch geometry, the configuration the runs were made with, and the majority class
of the clients' test splits when no predictions say it.

Each centre's report beside its store (``STORES/center_{c}.json``,
:class:`wsi.summary.CenterReport`) records ``data_root`` (the slides' root as given in the
parameters) and ``synthetic`` (the slides were written by :mod:`wsi.synth`); reports
written before these keys existed leave the data unknown, and the page says so. The patch
size, pyramid level and resolution are in the same reports (``patch_size``, ``level``,
``mpp``). The configuration is run.json's ``config`` of the runs reported.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from analysis.report.clinical import MajorityClass, majority_class
from analysis.report.load import RunResult, by_algorithm, order_key
from proxyfl.names import PAPER_ALGORITHMS
from wsi.summary import CenterReport

logger = logging.getLogger(__name__)

PRIVATE_KT = "PrivateKT"
# the patches per label of a centre report's counts, by label (0 healthy, 1 tumour)
_COUNT_LABELS: dict[str, int] = {"healthy": 0, "tumor": 1, "tumour": 1}

DataKind = Literal["synthetic", "real", "mixed", "unknown"]


def client_centres(runs: Iterable[RunResult]) -> list[int]:
    """The centres the runs trained and tested on (run.json's ``config.centers``), sorted."""
    return sorted({int(c) for run in runs for c in run.config.get("centers") or ()})


def report_centres(runs: Sequence[RunResult]) -> list[int]:
    """The clients' centres and, when PrivateKT read another centre's store as its public
    pool, that centre: every store whose data the runs used, sorted."""
    centres = set(client_centres(runs))
    for run in runs:
        config = run.config
        if (run.algorithm == PRIVATE_KT and config.get("public_pool", "center") == "center"
                and isinstance(config.get("public_center"), int)):  # fmt: skip
            centres.add(int(config["public_center"]))
    return sorted(centres)


@dataclass(frozen=True)
class CentreData:
    """What centre ``center``'s report says of its slides: their root and whether
    :mod:`wsi.synth` wrote them (None: not recorded, or no readable report)."""

    center: int
    data_root: str | None
    synthetic: bool | None


def centre_data(reports: Sequence[CenterReport], centres: Iterable[int]) -> list[CentreData]:
    """``data_root`` and ``synthetic`` of each centre's report; None for a value that is
    not recorded (a report written before they were, or none) or not of its type."""
    by_centre = {report.center: report for report in reports}
    found = []
    for center in centres:
        report = by_centre.get(center)
        root = getattr(report, "data_root", None)
        synthetic = getattr(report, "synthetic", None)
        found.append(CentreData(center, root if isinstance(root, str) else None,
                                synthetic if isinstance(synthetic, bool) else None))  # fmt: skip
    return found


@dataclass(frozen=True)
class DataSource:
    """Whether the reported runs saw synthetic or real slides, and from which root(s):
    ``unknown`` when a centre report does not say (``detail`` says why)."""

    kind: DataKind
    synthetic_roots: tuple[str, ...] = ()
    real_roots: tuple[str, ...] = ()
    detail: str = ""

    def sentence(self) -> str:
        """The line at the top of the report (and under every table)."""
        synthetic, real = ", ".join(self.synthetic_roots), ", ".join(self.real_roots)
        if self.kind == "synthetic":
            return (f"Synthetic slides (written by wsi.synth, {synthetic}): these numbers show "
                    "the pipeline works, not how the methods do on Camelyon-17.")  # fmt: skip
        if self.kind == "real":
            return f"Real slides from {real}."
        if self.kind == "mixed":
            return (f"Mixed data: synthetic slides (written by wsi.synth, {synthetic}) and real "
                    f"slides from {real} ({self.detail}): these numbers are not Camelyon-17 "
                    "results.")  # fmt: skip
        return f"Data: unknown ({self.detail})."

    def heading(self) -> str:
        """The page's title: never a claim of Camelyon-17 results on synthetic slides."""
        if self.kind == "synthetic":
            return "Federated learning on synthetic slides (a pipeline check, not Camelyon-17)"
        if self.kind == "real":
            return f"Federated learning on real slides ({', '.join(self.real_roots)})"
        if self.kind == "mixed":
            return "Federated learning on mixed synthetic and real slides"
        return "Federated learning on histopathology patches (data unknown)"

    def short(self) -> str:
        """The configuration table's cell: ``synthetic (wsi.synth): data/synthetic``."""
        parts = []
        if self.synthetic_roots:
            parts.append(f"synthetic (wsi.synth): {', '.join(self.synthetic_roots)}")
        if self.real_roots:
            parts.append(f"real: {', '.join(self.real_roots)}")
        return "; ".join(parts) if parts else f"unknown ({self.detail})"


def data_source(
    reports: Sequence[CenterReport] | None, centres: Sequence[int], where: str = ""
) -> DataSource:
    """The slides behind the stores of ``centres``, from their centre ``reports`` (read
    from ``where``; None: no store directory): synthetic if every centre's report says
    wsi.synth wrote its slides, real if every one says it did not, mixed if they differ,
    unknown if a report does not say. A root not recorded reads "root not recorded"."""
    if reports is None:
        return DataSource("unknown", detail="no store directory given, so no centre report read")
    if not centres:
        return DataSource("unknown", detail="the runs record no centres")
    data = centre_data(reports, centres)
    silent = [d.center for d in data if d.synthetic is None]
    if silent:
        place = f" in {where}" if where else ""
        return DataSource("unknown", detail=(
            f"the centre report(s) of centre(s) {', '.join(map(str, silent))}{place} do not "
            "record whether the slides are synthetic (data_root, synthetic): written before "
            "they were, or missing; rebuild the stores to record them"))  # fmt: skip

    def roots(synthetic: bool) -> tuple[str, ...]:
        return tuple(sorted({d.data_root or "root not recorded"
                             for d in data if d.synthetic is synthetic}))  # fmt: skip

    synthetic, real = roots(True), roots(False)
    if synthetic and real:
        which = "; ".join(
            f"centre {d.center}: {'synthetic' if d.synthetic else 'real'}" for d in data
        )
        return DataSource("mixed", synthetic, real, which)
    return DataSource("synthetic" if synthetic else "real", synthetic, real)


@dataclass(frozen=True)
class StoreGeometry:
    """A store's patches: side in pixels, pyramid level and its µm per pixel."""

    center: int
    patch_size: int
    level: int
    mpp: float

    def describe(self) -> str:
        """``32 px at level 2 (1 µm/px: 32 µm)``."""
        return (f"{self.patch_size} px at level {self.level} ({self.mpp:.3g} µm/px: "
                f"{self.patch_size * self.mpp:.3g} µm)")  # fmt: skip


def store_geometry(
    reports: Sequence[CenterReport] | None, centres: Iterable[int]
) -> tuple[list[StoreGeometry], list[str]]:
    """The geometry of each centre's store, from its report beside it, and, for each
    centre whose report does not give it (missing, failed, or written before the reports
    recorded it), ``centre c: reason``."""
    by_centre = {report.center: report for report in reports or ()}
    geometry, problems = [], []
    for center in centres:
        report = by_centre.get(center)
        if report is None:
            problems.append(f"centre {center}: no report beside the stores")
        elif report.patch_size is None or report.level is None or report.mpp is None:
            problems.append(f"centre {center}: its report predates the patch geometry")
        else:
            geometry.append(StoreGeometry(center, report.patch_size, report.level, report.mpp))
    return geometry, problems


def describe_geometry(geometry: Sequence[StoreGeometry], problems: Sequence[str]) -> str:
    """One geometry for all stores, else one per centre; the stores not read after."""
    kinds = {g.describe() for g in geometry}
    if len(kinds) == 1:
        text = kinds.pop()
    else:
        text = "; ".join(f"centre {g.center}: {g.describe()}" for g in geometry)
    unread = f"not read: {'; '.join(problems)}" if problems else ""
    return "; ".join(part for part in (text, unread) if part) or "unknown"


def majority_from_reports(
    reports: Sequence[CenterReport], centres: Sequence[int]
) -> MajorityClass | None:
    """The majority class of the merged test splits of ``centres`` from their complete
    reports' test counts (Σ over centres of the patches per label); None if a centre's
    report is missing or incomplete, or names a label other than healthy and tumour."""
    by_centre = {r.center: r for r in reports if r.status == "complete"}
    if not centres or any(c not in by_centre for c in centres):
        return None
    counts = [0, 0]
    for center in centres:
        for name, n in by_centre[center].counts.get("test", {}).items():
            if name not in _COUNT_LABELS:
                return None
            counts[_COUNT_LABELS[name]] += int(n)
    return majority_class(counts)


# ----------------------------------------------------------------------------------------
# The configuration table
# ----------------------------------------------------------------------------------------

DP_METHODS = PAPER_ALGORITHMS  # every method of the ProxyFL paper trains with DP-SGD
MUTUAL = ("ProxyFL", "FML")
PUSHSUM = ("ProxyFL", "AvgPush")
# (config key, the methods it applies to: None for all), in the table's order
SETTINGS: tuple[tuple[str, tuple[str, ...] | None], ...] = (
    ("private_model", MUTUAL),
    ("proxy_model", None),
    ("input_size", None),
    ("rounds", None),
    ("local_epochs", DP_METHODS),
    ("batch_size", None),
    ("lr", DP_METHODS),
    ("private_lr", MUTUAL),
    ("weight_decay", DP_METHODS),
    ("sigma", DP_METHODS),
    ("clip", DP_METHODS),
    ("delta", DP_METHODS),
    ("dml_alpha", MUTUAL),
    ("dml_beta", MUTUAL),
    ("graph", PUSHSUM),
    ("epsilon_budget", None),
    ("kt_local_epochs", (PRIVATE_KT,)),
    ("kt_optimizer", (PRIVATE_KT,)),
    ("kt_lr", (PRIVATE_KT,)),
    ("kt_samples", (PRIVATE_KT,)),
    ("ldp_epsilon", (PRIVATE_KT,)),
    ("buffer_size", (PRIVATE_KT,)),
    ("self_train_samples", (PRIVATE_KT,)),
    ("finetune_epochs", (PRIVATE_KT,)),
    ("client_fraction", (PRIVATE_KT,)),
    ("public_pool", (PRIVATE_KT,)),
)
# what a null value means, per key
_NULL_MEANS = {
    "private_lr": "null (= lr)",
    "input_size": "null (the stores' patch size)",
    "epsilon_budget": "null (none)",
    "self_train_samples": "null (a tenth of the public pool)",
}
NOT_RECORDED = "not recorded"


@dataclass(frozen=True)
class ConfigurationRow:
    """One setting of the reported runs: its key (``train.options`` in params.yaml, or
    what the report adds), its value(s) and the methods it applies to."""

    setting: str
    value: str
    used_by: str


def configuration_table(
    runs: Sequence[RunResult], data: DataSource, geometry: str
) -> list[ConfigurationRow]:
    """The settings that made the runs: the data and patch geometry, centres, seeds, then
    every key of :data:`SETTINGS` that applies to a method reported (PrivateKT's only with
    PrivateKT). A value the runs of its methods disagree on is listed with the methods of
    each; a key a run.json lacks reads "not recorded"."""
    groups = by_algorithm(runs)
    methods = list(groups)
    every = "all"
    centres = ", ".join(map(str, client_centres(runs))) or NOT_RECORDED
    rows = [
        ConfigurationRow("data", data.short(), every),
        ConfigurationRow("patches", geometry, every),
        ConfigurationRow("centers", centres, every),
        ConfigurationRow("seeds", ", ".join(map(str, sorted({r.seed for r in runs}))), every),
    ]
    for key, users in SETTINGS:
        present = [m for m in methods if users is None or m in users]
        if not present:
            continue
        by_value: dict[str, list[str]] = {}
        for method in present:
            for run in groups[method]:
                value = _value(key, run.config)
                if method not in by_value.setdefault(value, []):
                    by_value[value].append(method)
        if len(by_value) == 1:
            value = next(iter(by_value))
        else:
            value = "; ".join(f"{v} ({', '.join(ms)})" for v, ms in by_value.items())
        rows.append(ConfigurationRow(key, value, _used_by(present, methods)))
    if PRIVATE_KT in groups:
        rows.append(ConfigurationRow("public_share / public_center",
                                     _public_pool(groups[PRIVATE_KT]), PRIVATE_KT))  # fmt: skip
    return rows


def _used_by(present: Sequence[str], methods: Sequence[str]) -> str:
    """ "all", "all but PrivateKT", or the methods a setting applies to."""
    left_out = [m for m in methods if m not in present]
    if not left_out:
        return "all"
    if len(left_out) < len(present):
        return f"all but {', '.join(left_out)}"
    return ", ".join(present)


def _value(key: str, config: Mapping[str, Any]) -> str:
    if key not in config:
        return NOT_RECORDED
    value = config[key]
    if value is None:
        return _NULL_MEANS.get(key, "null")
    if isinstance(value, list):
        return ", ".join(map(str, value))
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _public_pool(runs: Sequence[RunResult]) -> str:
    pools = []
    for run in sorted(runs, key=lambda r: (order_key(r.algorithm), r.seed)):
        config = run.config
        if config.get("public_pool", "center") == "share":
            text = f"{config.get('public_share', 0.2):g} of each client's training split"
        elif isinstance(config.get("public_center"), int):
            text = f"centre {config['public_center']}'s store"
        else:
            text = NOT_RECORDED
        if text not in pools:
            pools.append(text)
    return "; ".join(pools)
