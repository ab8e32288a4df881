"""What a run shows in the Prefect UI's Artifacts tab: the paper's tables as markdown.

Keys (lowercase, dashes) make each table a versioned artifact on the Artifacts page:
``table-1-patches`` and ``preprocessing-failures`` from preprocessing, ``accuracy-table``
and ``privacy-table`` from the report. Training's progress artifacts are created by its
task (:func:`tasks.train.training_run`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from prefect.artifacts import create_markdown_artifact

from wsi.summary import TABLE_1_COLUMNS, TABLE_1_HEADER

if TYPE_CHECKING:  # not imported: preprocessing's DVC stage must not depend on the report
    from analysis.report import ReportPaths
    from wsi.summary import SlideFailure


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub-flavoured markdown table; ``|`` inside a cell is escaped."""

    def cell(value: object) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(map(cell, header)) + " |",
             "|" + "---|" * len(header)]  # fmt: skip
    lines += ["| " + " | ".join(map(cell, row)) + " |" for row in rows]
    return "\n".join(lines)


def publish_table_1(rows: Sequence[Mapping[str, object]]) -> None:
    """Patches per centre, split and label (the paper's Table 1)."""
    table = markdown_table(TABLE_1_HEADER, [[row[key] for key in TABLE_1_COLUMNS] for row in rows])
    create_markdown_artifact(
        f"# Patches per centre (Table 1)\n\n{table}\n", key="table-1-patches",
        description="Patches per centre, split and label, as stored",
    )  # fmt: skip


def publish_failures(failures: Sequence[SlideFailure]) -> None:
    """Every slide, catalogue entry or centre left out, at which step and why."""
    if failures:
        body = markdown_table(["slide or file", "centre", "step", "reason"],
                              [[f.slide, "" if f.center is None else f.center, f.stage, f.error]
                               for f in failures])  # fmt: skip
    else:
        body = "No slide, catalogue entry or centre was left out."
    create_markdown_artifact(
        f"# Preprocessing failures ({len(failures)})\n\n{body}\n",
        key="preprocessing-failures", description="What preprocessing left out, and why",
    )  # fmt: skip


def publish_report(paths: ReportPaths) -> None:
    """The accuracy table and the privacy table, as the report wrote them."""
    for key, title, path in (("accuracy-table", "Accuracy (Table 2)", paths.accuracy_md),
                             ("privacy-table", "Privacy", paths.privacy_md)):  # fmt: skip
        create_markdown_artifact(
            f"# {title}\n\n{path.read_text()}\n\n`{path}`; the whole report, figures included: "
            f"`{paths.report_html}`\n", key=key, description=title,
        )  # fmt: skip
