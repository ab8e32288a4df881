"""What preprocessing stored and left out, per centre: the paper's Table 1 and the failures.

Each centre's store has a report beside it, ``center_{c}.json`` (:class:`CenterReport`):
its patches per split and label, its patients, and every slide, catalogue entry or the
centre itself left out (:class:`SlideFailure`). The reports are read back by the
preprocessing summary (``summary.{json,csv}``, ``failures.json``) and by the training
report (``results/report.html``), so this module imports nothing heavier than the
standard library.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from plumbing.atomic import write_json, write_text
from plumbing.errors import PipelineError, describe

_REPORT_NAME = re.compile(r"center_[0-9]+\.json")

# Table 1's columns (the keys of summary_rows' rows) and how they are headed
TABLE_1_COLUMNS = ("center", "split", "healthy", "tumor", "total", "patients")
TABLE_1_HEADER = ("centre", "split", "healthy", "tumour", "total", "patients")


@dataclass(frozen=True)
class SlideFailure:
    """Something left out, at which step and why: a slide (steps open, annotation,
    tissue, lesions, candidates, resolution, pixels), a catalogue entry (step catalogue;
    ``slide`` is then the file concerned) or a whole centre (step centre)."""

    slide: str
    stage: str
    error: str
    center: int | None = None


CenterStatus = Literal["complete", "failed"]


@dataclass
class CenterReport:
    """Table 1 for one centre: counts per split and label, patients, what was left out.

    A ``"failed"`` report has no counts and says why in ``error``; its ``store`` names the
    store of an earlier build that the failure left as it was ("" where there was none),
    which no summary counts and the next run builds again.
    """

    center: int
    counts: dict[str, dict[str, int]]
    patients: dict[str, list[str]]
    store: str
    failures: list[SlideFailure] = field(default_factory=list)
    status: CenterStatus = "complete"
    error: str | None = None
    # the slides' root as the parameters gave it, and whether every slide was written by
    # wsi.synth (None: a report written before these were recorded, or a failed centre)
    data_root: str | None = None
    synthetic: bool | None = None
    # the store's patches: pixels per side, pyramid level, µm per pixel at that level
    patch_size: int | None = None
    level: int | None = None
    mpp: float | None = None

    def to_json(self) -> dict[str, object]:
        return {**asdict(self), "failures": [asdict(f) for f in self.failures]}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> CenterReport:
        failures = [SlideFailure(**f) for f in data.get("failures", [])]  # type: ignore[union-attr]
        return cls(
            center=int(data["center"]),  # type: ignore[call-overload]
            counts=data["counts"],  # type: ignore[arg-type]
            patients=data["patients"],  # type: ignore[arg-type]
            store=str(data["store"]),
            failures=failures,
            status=data.get("status", "complete"),  # type: ignore[arg-type]
            error=data.get("error"),  # type: ignore[arg-type]
            data_root=data.get("data_root"),  # type: ignore[arg-type]
            synthetic=data.get("synthetic"),  # type: ignore[arg-type]
            patch_size=data.get("patch_size"),  # type: ignore[arg-type]
            level=data.get("level"),  # type: ignore[arg-type]
            mpp=data.get("mpp"),  # type: ignore[arg-type]
        )


def report_path(out_dir: str | os.PathLike[str], center: int) -> Path:
    """Where centre ``center``'s report lives beside its store."""
    return Path(out_dir) / f"center_{center}.json"


def summary_rows(reports: Sequence[CenterReport]) -> list[dict[str, object]]:
    """One row per complete centre and split: healthy, tumour and total counts, patients."""
    rows = []
    for report in sorted(reports, key=lambda r: r.center):
        if report.status != "complete":
            continue
        for split in ("train", "test"):
            counts = report.counts[split]
            rows.append(
                {
                    "center": report.center,
                    "split": split,
                    **counts,
                    "total": sum(counts.values()),
                    "patients": " ".join(report.patients[split]),
                }
            )
    return rows


class CenterReportError(PipelineError):
    """A ``center_{c}.json`` that cannot be read as a centre report."""


def read_center_report(path: str | os.PathLike[str]) -> CenterReport:
    """The report at ``path``; a :class:`CenterReportError` saying why it is not one."""
    try:
        return CenterReport.from_json(json.loads(Path(path).read_text()))
    except OSError as error:
        raise CenterReportError(path, describe(error)) from error
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise CenterReportError(path, f"not a centre report ({describe(error)})") from error


def scan_center_reports(
    out_dir: str | os.PathLike[str],
) -> tuple[list[CenterReport], list[CenterReportError]]:
    """Every ``center_{c}.json`` report in ``out_dir`` that reads, by centre, and the
    error of each that does not."""
    reports, unreadable = [], []
    for path in sorted(Path(out_dir).glob("center_*.json")):
        if not _REPORT_NAME.fullmatch(path.name):  # center_{c}.inputs.json: wsi.freshness
            continue
        try:
            reports.append(read_center_report(path))
        except CenterReportError as error:
            unreadable.append(error)
    return sorted(reports, key=lambda report: report.center), unreadable


def read_center_reports(out_dir: str | os.PathLike[str]) -> list[CenterReport]:
    """Every ``center_{c}.json`` report in ``out_dir``, by centre; the first that does not
    read raises its :class:`CenterReportError`."""
    reports, unreadable = scan_center_reports(out_dir)
    if unreadable:
        raise unreadable[0]
    return reports


def write_summary(
    out_dir: str | os.PathLike[str], extra_failures: Sequence[SlideFailure] = ()
) -> list[dict[str, object]]:
    """``summary.json``, ``summary.csv`` and ``failures.json`` over every centre report in
    ``out_dir`` (so centres built by separate runs, e.g. one DVC stage each, add up)."""
    out_dir = Path(out_dir)
    reports = read_center_reports(out_dir)
    failures = [f for report in reports for f in report.failures] + list(extra_failures)
    rows = summary_rows(reports)
    write_json(
        out_dir / "summary.json",
        {"centers": {str(r.center): r.to_json() for r in reports}, "table": rows},
        sort_keys=True,
    )
    buffer = io.StringIO()
    if rows:
        writer = csv.DictWriter(buffer, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    write_text(out_dir / "summary.csv", buffer.getvalue())
    write_json(out_dir / "failures.json", [asdict(f) for f in failures], sort_keys=True)
    return rows
