"""``report.html``: the whole report in one self-contained page.

What the numbers are of first (synthetic or real slides and their root; the title never
claims Camelyon-17 results on synthetic slides), then Figure 8 (embedded as a ``data:``
PNG), the accuracy table (the model each row evaluates, and the majority class's score),
the per-centre accuracy, sensitivity, specificity and AUC with patient-bootstrap intervals
(how they were computed and on how many test patients), the privacy table with the notion
of every ε, the empirical privacy audit (membership inference on the kept models with its
ROC figure, the canary runs' ε lower bounds beside the accounted ε, or a line saying no
audit was recorded), the configuration the runs were made with, the paper's Table 1
(patches per centre, split and label) and what preprocessing left out. The page has no
script, no stylesheet or font to fetch and no link outside the report's own folder, so it
opens offline, from a mail attachment or a DVC cache alike. Cells are the markdown tables' cells
(:data:`~analysis.report.render.LAYOUTS`), so the page and ``tables/*.md`` always say the
same numbers.

Pure: :func:`report_html` returns text; :mod:`analysis.report.write` writes it.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jinja2

from analysis.report.audit import (
    CANARY_ALIGN,
    MEMBERSHIP_ALIGN,
    MEMBERSHIP_HEADER,
    Audit,
    audit_notes,
    audit_violations,
    canary_cells,
    canary_header,
    canary_note,
    canary_rows,
    check_line,
    membership_cells,
    membership_note,
    membership_table,
    settings_line,
)
from analysis.report.context import ConfigurationRow, DataSource
from analysis.report.load import RunResult
from analysis.report.plots import method_groups
from analysis.report.predictions import ClinicalRow, PerCentreRow
from analysis.report.render import LAYOUTS, TableRow, per_centre_cells, public_pool_note
from analysis.report.staging import stage_confusion_rows, staging_notes, staging_rows
from analysis.report.stats import PRIVATE_KT, AccuracyRow, PrivacyRow
from proxyfl.results import LABEL_LDP
from wsi.summary import TABLE_1_COLUMNS, TABLE_1_HEADER, CenterReport, summary_rows

# what a centre was to the runs reported (Table 1's last column)
CLIENT, PUBLIC_POOL = "client", "public pool (PrivateKT; labels unused)"


@dataclass(frozen=True)
class HtmlTable:
    """Header, column alignment (``left``/``right``) and cells of one table, as text."""

    header: Sequence[str]
    align: Sequence[str]
    rows: Sequence[Sequence[str]]


@dataclass(frozen=True)
class Preprocessing:
    """What the stores' reports say: their directory, the reports, and any that could not
    be read (file and reason), shown instead of silently left out."""

    directory: str
    reports: Sequence[CenterReport] = ()
    unreadable: Sequence[tuple[str, str]] = field(default_factory=tuple)


def _align(markdown_align: Sequence[str]) -> list[str]:
    return ["right" if a.endswith(":") and not a.startswith(":") else "left"
            for a in markdown_align]  # fmt: skip


def rows_phrase(groups: Sequence[tuple[str, Sequence[str]]]) -> str:
    """The phrase ", one row of panels each for A, B and C, top to bottom" (empty for one
    group)."""
    if len(groups) < 2:
        return ""
    names = [name for name, _ in groups]
    return f", one row of panels each for {', '.join(names[:-1])} and {names[-1]}, top to bottom"


def result_table(rows: Sequence[TableRow]) -> HtmlTable:
    """A table of :data:`~analysis.report.render.LAYOUTS` (accuracy, privacy, clinical,
    configuration) with the markdown table's header and cells."""
    layout = LAYOUTS[type(rows[0])]
    return HtmlTable(layout.markdown_header, _align(layout.markdown_align),
                     [layout.markdown_cells(r) for r in rows])  # fmt: skip


def per_centre_table(rows: Sequence[PerCentreRow]) -> HtmlTable | None:
    """The per-centre accuracy with per_centre.md's header and cells; None without any
    predictions."""
    if not any(row.center is not None for row in rows):
        return None
    header, align, cells = per_centre_cells(rows)
    return HtmlTable(header, _align(align), cells)


def staging_html_table(summary: Mapping[str, Any]) -> HtmlTable:
    """The staging table with staging.md's header and cells."""
    header, rows = staging_rows(summary)
    return HtmlTable(header, ["left", *["right"] * (len(header) - 2), "left"], rows)


def stage_confusion_tables(summary: Mapping[str, Any]) -> list[tuple[str, HtmlTable]]:
    """Each method's stage confusion (staging.md's), beside its name."""
    tables = []
    for key, entry in summary["methods"].items():
        header, rows = stage_confusion_rows(entry)
        tables.append((key, HtmlTable(header, ["left", *["right"] * (len(header) - 1)], rows)))
    return tables


def audit_membership_table(audit: Audit) -> HtmlTable | None:
    """The audit's membership-inference table with audit.md's header and cells; None
    without training rows."""
    rows = membership_table(audit.rows)
    if not rows:
        return None
    return HtmlTable(MEMBERSHIP_HEADER, _align(MEMBERSHIP_ALIGN),
                     [membership_cells(row) for row in rows])  # fmt: skip


def audit_canary_table(audit: Audit) -> HtmlTable | None:
    """The audit's ε lower bound table with audit.md's header and cells; None without
    canary rows."""
    rows = canary_rows(audit.rows)
    if not rows:
        return None
    return HtmlTable(canary_header(audit.settings), _align(CANARY_ALIGN),
                     [canary_cells(row) for row in rows])  # fmt: skip


def centre_roles(runs: Iterable[RunResult]) -> dict[int, str]:
    """Each centre the runs trained on as a client, or read as PrivateKT's public pool."""
    roles: dict[int, str] = {}
    for run in runs:
        for center in run.config.get("centers") or ():
            roles[int(center)] = CLIENT
        pool = run.config.get("public_pool", "center")  # runs before the share pool: center
        if (run.algorithm == PRIVATE_KT and pool == "center"
                and run.config.get("public_center") is not None):  # fmt: skip
            roles.setdefault(int(run.config["public_center"]), PUBLIC_POOL)
    return roles


def table_1(reports: Sequence[CenterReport], roles: Mapping[int, str]) -> HtmlTable:
    """Patches per complete centre, split and label, and the centre's role in the runs."""
    header = (*TABLE_1_HEADER, "role")
    align = ["left" if c in ("split", "patients", "role") else "right" for c in header]
    rows = [(*(str(row[key]) for key in TABLE_1_COLUMNS), roles.get(int(row["center"]), ""))
            for row in summary_rows(reports)]  # fmt: skip
    return HtmlTable(header, align, rows)


def failures_table(reports: Sequence[CenterReport]) -> HtmlTable:
    """Every slide, catalogue entry or centre the reports say was left out, and why."""
    rows = [(f.slide, "" if f.center is None else str(f.center), f.stage, f.error)
            for report in reports for f in report.failures]  # fmt: skip
    return HtmlTable(("slide or file", "centre", "step", "reason"), ["left"] * 4, rows)


def report_html(
    *,
    accuracy: Sequence[AccuracyRow],
    privacy: Sequence[PrivacyRow],
    accuracy_note: str,
    summary: str,
    figure_png: bytes,
    figure_title: str,
    runs: Sequence[RunResult],
    runs_dir: str,
    preprocessing: Preprocessing | None,
    links: Sequence[str],
    unlisted_note: str = "",
    other_configurations: Mapping[str, Sequence[AccuracyRow]] | None = None,
    data: DataSource | None = None,
    configuration: Sequence[ConfigurationRow] = (),
    configuration_note: str = "",
    per_centre: Sequence[PerCentreRow] = (),
    per_centre_note: str = "",
    clinical: Sequence[ClinicalRow] = (),
    clinical_note: str = "",
    audit: Audit | None = None,
    audit_absent: str = "no audit file given",
    audit_roc_png: bytes | None = None,
    audit_roc_title: str = "",
    staging: Mapping[str, Any] | None = None,
    staging_absent: str = "no staging file given",
    staging_pictures: Mapping[str, Sequence[tuple[str, bytes]]] | None = None,
    staging_pictures_total: int = 0,
    staging_pictures_mb: float | None = None,
) -> str:
    """The report page. ``links`` are the report's other files, relative to the page;
    ``preprocessing`` is None when no store directory is known; ``unlisted_note`` names
    runs found but not listed; ``other_configurations`` are accuracy rows of runs made
    with other parameters, by the label of those parameters, shown apart. ``data`` says
    what slides the numbers are of (unknown when None); ``configuration``, ``per_centre``
    and ``clinical`` are their tables' rows, each with the note that goes under it.
    ``audit`` is the privacy audit read (None: the section says "No audit recorded
    (``audit_absent``)"), ``audit_roc_png`` its ROC figure (None without training rows)
    and ``audit_roc_title`` the figure's title. ``staging`` is the staging's summary (None:
    "No staging shown (``staging_absent``)"), ``staging_pictures`` per centre the test
    slides' pictures shown, of ``staging_pictures_total`` within ``staging_pictures_mb``."""
    roles = centre_roles(runs)
    reports = preprocessing.reports if preprocessing else ()
    data = data or DataSource("unknown", detail="not given to the page")
    return _TEMPLATE.render(
        heading=data.heading(),
        data_sentence=data.sentence(),
        data_kind=data.kind,
        configuration=result_table(configuration) if configuration else None,
        configuration_note=configuration_note.strip(),
        per_centre=per_centre_table(per_centre),
        per_centre_note=per_centre_note.strip(),
        clinical=result_table(clinical) if any(r.n_models for r in clinical) else None,
        clinical_note=clinical_note.strip(),
        summary=summary,
        runs_dir=runs_dir,
        methods=list(dict.fromkeys(run.algorithm for run in runs)),
        seeds=sorted({run.seed for run in runs}),
        figure=base64.b64encode(figure_png).decode("ascii"),
        figure_title=figure_title,
        figure_rows=rows_phrase(method_groups(dict.fromkeys(run.algorithm for run in runs))),
        majority_line=any(row.baseline for row in accuracy),
        accuracy=result_table(accuracy) if accuracy else None,
        accuracy_note=accuracy_note.strip(),
        privacy=result_table(privacy) if privacy else None,
        label_ldp=any(row.notion == LABEL_LDP for row in privacy),
        public_pool=public_pool_note(runs).strip(),
        preprocessing=preprocessing,
        table_1=table_1(reports, roles),
        failures=failures_table(reports),
        links=links,
        unlisted_note=unlisted_note,
        other_configurations=[
            (label, result_table(rows))
            for label, rows in (other_configurations or {}).items()
            if rows
        ],
        audit=audit,
        audit_absent=audit_absent,
        audit_settings=settings_line(audit.settings) if audit else "",
        audit_membership=audit_membership_table(audit) if audit else None,
        audit_membership_note=membership_note(),
        audit_roc=None if audit_roc_png is None else base64.b64encode(audit_roc_png).decode(),
        audit_roc_title=audit_roc_title,
        audit_canaries=audit_canary_table(audit) if audit else None,
        audit_canary_note=canary_note(audit.settings) if audit else "",
        audit_check=check_line(audit) if audit else "",
        audit_violated=bool(audit and audit_violations(audit)),
        audit_notes=audit_notes(audit) if audit else [],
        staging=staging,
        staging_absent=staging_absent,
        staging_table=staging_html_table(staging) if staging else None,
        staging_notes=staging_notes(staging) if staging else [],
        stage_confusions=stage_confusion_tables(staging) if staging else [],
        pictures_shown=sum(len(shown) for shown in (staging_pictures or {}).values()),
        pictures_total=staging_pictures_total,
        pictures_mb=staging_pictures_mb,
        staging_pictures=[
            (center, [(slide, base64.b64encode(png).decode("ascii")) for slide, png in shown])
            for center, shown in sorted((staging_pictures or {}).items(), key=lambda i: int(i[0]))
        ],
    )


_ENVIRONMENT = jinja2.Environment(
    autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True
)
_TEMPLATE = _ENVIRONMENT.from_string(
    """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ heading }}: report</title>
<style>
  body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1d1d1f;
         max-width: 72rem; margin: 2rem auto; padding: 0 1.5rem; }
  h1 { font-size: 1.6rem; margin-bottom: .2rem; }
  h2 { font-size: 1.2rem; margin-top: 2.2rem; border-bottom: 1px solid #d0d0d7; }
  h3 { font-size: 1.05rem; margin-top: 1.4rem; }
  .summary { font-size: 1.05rem; background: #f3f6fa; border-left: 4px solid #0072b2;
             padding: .6rem .9rem; }
  .meta, .note, figcaption { color: #555; font-size: .9rem; }
  nav a { margin-right: 1rem; }
  figure { margin: 1rem 0; }
  figure img { max-width: 100%; height: auto; border: 1px solid #e3e3e8; }
  table { border-collapse: collapse; margin: .6rem 0; font-variant-numeric: tabular-nums; }
  th, td { padding: .3rem .7rem; border-bottom: 1px solid #e3e3e8; vertical-align: top; }
  th { background: #f6f6f8; text-align: left; }
  td.right, th.right { text-align: right; }
  td.right { white-space: nowrap; }
  tr:hover td { background: #fafafc; }
  .empty { font-style: italic; color: #555; }
  .problem { color: #a33; }
  .data { font-size: 1.05rem; padding: .5rem .9rem; border-left: 4px solid #999; }
  .data.synthetic, .data.mixed { background: #fdf3e1; border-left-color: #e69f00; }
  .data.unknown { background: #f6f6f8; }
  .note p, p.note { margin: .3rem 0; }
  .confusions { display: flex; flex-wrap: wrap; gap: 0 1.5rem; }
  .confusion table { font-size: .85rem; }
  code { font-size: .9em; }
</style>
</head>
<body>
<h1>{{ heading }}</h1>
<p class="data {{ data_kind }}" id="data-source">{{ data_sentence }}</p>
<p class="meta">{{ methods | length }} method(s): {{ methods | join(", ") }};
seed(s) {{ seeds | join(", ") }}; runs from <code>{{ runs_dir }}</code>.</p>
<p class="summary" id="summary">{{ summary }}</p>
<nav><a href="#curves">Curves</a><a href="#accuracy">Accuracy</a>
<a href="#per-centre">Per centre</a><a href="#clinical">Sensitivity, specificity, AUC</a>
<a href="#privacy">Privacy</a><a href="#audit">Privacy audit</a>
<a href="#configuration">Configuration</a>
<a href="#patches">Patches (Table 1)</a><a href="#failures">Failures</a></nav>

<h2 id="curves">Accuracy and macro-accuracy per round (Figure 8)</h2>
<figure>
<img id="figure-8"
     alt="Test accuracy (left) and macro-accuracy (right) per round, one line per method"
     src="data:image/png;base64,{{ figure }}">
<figcaption>{{ figure_title }}: mean over those models (line) and ± one standard deviation
(band), every round{{ figure_rows }}{% if majority_line %}; the dashed line is the
score of always answering the majority class{% endif %}.</figcaption>
</figure>

{% macro render(table, id) %}
<table id="{{ id }}">
<thead><tr>
{% for cell in table.header %}<th class="{{ table.align[loop.index0] }}">{{ cell }}</th>{% endfor %}
</tr></thead>
<tbody>
{% for row in table.rows %}
<tr>{% for cell in row %}<td class="{{ table.align[loop.index0] }}">{{ cell }}</td>{% endfor %}</tr>
{% endfor %}
</tbody>
</table>
{% endmacro %}
<h2 id="accuracy">Accuracy (Table 2)</h2>
{% if accuracy %}{{ render(accuracy, "accuracy-table") }}
{% else %}<p class="empty">No runs.</p>{% endif %}
{% for line in accuracy_note.split("\n") if line %}<p class="note">{{ line }}</p>
{% endfor %}
{% if unlisted_note %}
<p class="note" id="unlisted">{{ unlisted_note }}</p>
{% endif %}
{% if other_configurations %}
<h2 id="other-configurations">Runs made with other parameters (not in the tables above)</h2>
{% for label, table in other_configurations %}
<h3>Made with {{ label }}</h3>
{{ render(table, "other-configuration-" ~ loop.index) }}
{% endfor %}
{% endif %}

<h2 id="per-centre">Accuracy per test centre</h2>
{% if per_centre %}{{ render(per_centre, "per-centre-table") }}
{% else %}<p class="empty">No predictions recorded: no per-centre accuracy.</p>{% endif %}
{% for line in per_centre_note.split("\n") if line %}<p class="note">{{ line }}</p>
{% endfor %}

<h2 id="clinical">Sensitivity, specificity and AUC (tumour positive)</h2>
{% if clinical %}{{ render(clinical, "clinical-table") }}
{% else %}<p class="empty">No predictions recorded: no sensitivity, specificity or AUC.</p>
{% endif %}
{% for line in clinical_note.split("\n") if line %}<p class="note">{{ line }}</p>
{% endfor %}

<h2 id="staging">From patches to patients: lymph nodes and pN stages</h2>
{% if staging is none %}
<p class="empty" id="staging-absent">No staging shown ({{ staging_absent }}): no node
classes or pN stages to show.</p>
{% else %}
{{ render(staging_table, "staging-table") }}
{% for line in staging_notes %}<p class="note">{{ line }}</p>
{% endfor %}
<h3>Stage confusion (test patients; rows true, columns predicted)</h3>
<div class="confusions">
{% for key, table in stage_confusions %}
<div class="confusion"><p class="note">{{ key }}</p>
{{ render(table, "stage-confusion-" ~ loop.index) }}</div>
{% endfor %}
</div>
<p class="note">Each test slide: the slide with its annotated lesions outlined (left), then
each method's tumour map over it (blue: healthy, red: tumour; the lesions it found at its
threshold outlined in black), its node class and whether it is the annotated one.
{{ pictures_shown }} of {{ pictures_total }} slides shown{% if pictures_shown < pictures_total %}
(report.staging_pictures_mb = {{ pictures_mb }} MB of pictures: the slides most methods
called wrong first, then the others in a fixed random order){% endif %}.</p>
{% for center, pictures in staging_pictures %}
<h3>Centre {{ center }}</h3>
{% for slide, png in pictures %}
<figure class="staging">
<img alt="{{ slide }}: the slide with its annotated lesions, and each method's tumour map"
     src="data:image/png;base64,{{ png }}">
</figure>
{% endfor %}
{% endfor %}
{% endif %}

<h2 id="privacy">Privacy</h2>
{% if privacy %}{{ render(privacy, "privacy-table") }}
{% else %}<p class="empty">No privacy rows.</p>{% endif %}
<p class="note">ε of a DP-SGD method is sample-level (ε, δ)-differential privacy of the client's
training patches (Rényi-DP accountant, converted at δ), over all rounds.
{% if label_ldp %}
PrivateKT's ε is another notion: label-level ε-local DP of the K labels a client sends per
round (randomized response, Lemma 1 of Qi et al.), composed by basic composition over the
r rounds a client reported in (r·ε; a client the server did not select sends nothing that
round); its clients train without DP. The two are not comparable as numbers.
{{ public_pool }}
{% endif %}</p>

<h2 id="audit">Empirical privacy audit</h2>
{% if audit is none %}
<p class="empty" id="audit-absent">No audit recorded ({{ audit_absent }}): no membership
inference or ε lower bound to show.</p>
{% else %}
<p class="meta">From <code>{{ audit.path }}</code>{% if audit_settings %}. {{ audit_settings }}
{% else %}.{% endif %}</p>
<h3>Membership inference (training runs)</h3>
{% if audit_membership %}{{ render(audit_membership, "audit-membership-table") }}
{% else %}<p class="empty">No training run audited.</p>{% endif %}
<p class="note">{{ audit_membership_note }}</p>
{% if audit_roc %}
<figure>
<img id="audit-roc"
     alt="Membership-inference ROC curves (log-log), one per method and model, and chance"
     src="data:image/png;base64,{{ audit_roc }}">
<figcaption>{{ audit_roc_title }}: true positive rate against false positive rate (log
axes, from 0.1 % FPR), mean over clients × seeds; solid: a released model, dotted: a private
model that never leaves its hospital; dashed: chance (TPR = FPR).</figcaption>
</figure>
{% endif %}
<h3>One-run ε lower bound (canary runs)</h3>
{% if audit_canaries %}{{ render(audit_canaries, "audit-canary-table") }}
{% else %}<p class="empty">No canary run audited.</p>{% endif %}
<p class="note">{{ audit_canary_note }}</p>
<p class="{{ 'problem' if audit_violated else 'note' }}" id="audit-check">{{ audit_check }}</p>
{% if audit_notes %}
<div class="note">
{% for label, text in audit_notes %}<p><strong>{{ label }}</strong>: {{ text }}</p>
{% endfor %}
</div>
{% endif %}
{% endif %}

<h2 id="configuration">Configuration</h2>
{% if configuration %}{{ render(configuration, "configuration-table") }}
{% else %}<p class="empty">No configuration recorded.</p>{% endif %}
<p class="note">{{ configuration_note }}</p>

<h2 id="patches">Patches per centre (Table 1)</h2>
{% if preprocessing is none %}
<p class="empty">No store directory given: Table 1 and the failures are not shown.</p>
{% else %}
<p class="meta">From the centre reports in <code>{{ preprocessing.directory }}</code>
(<code>center_*.json</code>, beside the stores).</p>
{% for path, reason in preprocessing.unreadable %}
<p class="problem">Could not read <code>{{ path }}</code>: {{ reason }}</p>
{% endfor %}
{% if table_1.rows %}{{ render(table_1, "table-1") }}
{% else %}<p class="empty">No complete centre report.</p>{% endif %}

<h2 id="failures">Preprocessing failures ({{ failures.rows | length }})</h2>
{% if failures.rows %}{{ render(failures, "failures-table") }}{% else %}
<p class="empty">No slide, catalogue entry or centre was left out.</p>{% endif %}
{% endif %}

<h2 id="files">Files</h2>
<p class="meta">
{% for path in links %}<a href="{{ path }}">{{ path }}</a>{{ ", " if not loop.last }}
{% endfor %}</p>
</body>
</html>
"""
)
