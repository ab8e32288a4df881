"""Figure 8 of the ProxyFL paper with matplotlib: accuracy and macro-accuracy per round,
one mean line and mean ± std band per method, as PNG files. The paper's methods share a
row of panels (with more than four, two rows: its baselines, and its decentralised
methods, ProxyFL in both) and any other method (PrivateKT) has its own below
(:func:`method_groups`), so that eight overlapping bands do not hide the paper's
comparison; every panel shows the majority class's score as a dashed line, the accuracy a
model gets without learning anything.

Every method has one fixed style in every figure (:func:`method_style`): an Okabe–Ito
colour, a dash pattern and a marker, each unique, so the lines stay apart with any common
colour vision deficiency and in greyscale; ProxyFL is drawn thick, opaque and on top. The
PNGs carry no software or date metadata, so the same curves give the same bytes.
matplotlib is imported where a figure is drawn: the tables need none of it.

The privacy audit's figure (:func:`plot_roc`): the membership-inference ROC curve of
every method's model, mean over clients × seeds, on log-log axes with the chance diagonal.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from analysis.report.audit import RocCurve
from analysis.report.clinical import MajorityClass
from analysis.report.load import JOINT, order_key
from analysis.report.stats import CurvePoint, SampleSize
from plumbing import atomic
from proxyfl.names import PAPER_ALGORITHMS

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D


@dataclass(frozen=True)
class MethodStyle:
    """How one method is drawn in every figure: Okabe–Ito colour, dash pattern, marker."""

    color: str
    linestyle: str | tuple[float, tuple[float, ...]]
    marker: str
    linewidth: float
    alpha: float
    zorder: float


# Okabe & Ito (2008), "Color Universal Design": distinguishable with every common colour
# vision deficiency. Grey is the ninth colour of R's ``palette.colors("Okabe-Ito")``; yellow
# is kept for unknown methods only, as it fades on white paper.
OKABE_ITO: dict[str, str] = {
    "black": "#000000",
    "orange": "#E69F00",
    "sky blue": "#56B4E9",
    "bluish green": "#009E73",
    "yellow": "#F0E442",
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "reddish purple": "#CC79A7",
    "grey": "#999999",
}
EMPHASISED = "ProxyFL"
# Colour, dash pattern (offset, on-off lengths in line widths) and marker per method: each
# pair of dash pattern and marker is unique too, so the lines stay apart in greyscale.
_STYLES: dict[str, tuple[str, str | tuple[float, tuple[float, ...]], str]] = {
    "Regular": (OKABE_ITO["grey"], (0, (1, 1.5)), "v"),
    "AvgPush": (OKABE_ITO["sky blue"], (0, (5, 1.5, 1, 1.5)), "^"),
    "CWT": (OKABE_ITO["reddish purple"], (0, (5, 1.5, 1, 1.5, 1, 1.5)), "s"),
    "FedAvg": (OKABE_ITO["bluish green"], (0, (3, 1.5)), "D"),
    "FML": (OKABE_ITO["blue"], (0, (8, 2)), "P"),
    "ProxyFL": (OKABE_ITO["vermillion"], "solid", "o"),
    "Joint": (OKABE_ITO["black"], (0, (8, 2, 1, 2)), "X"),
}
_OTHER_COLORS = (OKABE_ITO["orange"], OKABE_ITO["yellow"])
_OTHER_LINESTYLES: tuple[tuple[float, tuple[float, ...]], ...] = (
    (0, (2, 1)),
    (0, (8, 2, 1, 2, 1, 2)),
    (0, (12, 3)),
)
_OTHER_MARKERS = ("<", ">", "h", "p", "*")
_PANELS: tuple[tuple[str, str], ...] = (
    ("accuracy", "Accuracy"),
    ("macro_accuracy", "Macro-accuracy"),
)
# The majority class's score: a dark grey dashed line under the methods' lines, no marker.
_BASELINE_GID = "majority-class"
_BASELINE_STYLE: dict[str, object] = {
    "color": "#555555", "linestyle": "--", "linewidth": 1.3, "zorder": 2.0,
}  # fmt: skip
_MAX_MARKERS = 12  # per line; more rounds than this get a marker every few rounds
_BAND_ALPHA = 0.12


def method_style(algorithm: str) -> MethodStyle:
    """The fixed style of a method, the same in every figure: ProxyFL thick, opaque and on
    top; the others thinner and slightly transparent so that overlapping lines show."""
    if algorithm in _STYLES:
        color, linestyle, marker = _STYLES[algorithm]
    else:  # a deterministic function of the name (``hash`` of a str differs per process)
        code = sum(map(ord, algorithm))
        color = _OTHER_COLORS[code % len(_OTHER_COLORS)]
        linestyle = _OTHER_LINESTYLES[code % len(_OTHER_LINESTYLES)]
        marker = _OTHER_MARKERS[code % len(_OTHER_MARKERS)]
    if algorithm == EMPHASISED:
        return MethodStyle(color, linestyle, marker, linewidth=2.6, alpha=1.0, zorder=4.0)
    return MethodStyle(color, linestyle, marker, linewidth=1.4, alpha=0.85, zorder=3.0)


def sample_title(sizes: Mapping[str, SampleSize]) -> str:
    """What the mean ± std of a figure pools, e.g. "Mean ± std over 4 clients × 3 seeds
    (FedAvg, PrivateKT: 1 central model × 3 seeds; Joint: 1 pooled model × 3 seeds)";
    counts that differ between methods read as a range ("2–4 clients"). A server's model
    and Joint are stated apart: each is one model a seed, not one a client."""
    per_client = [size for name, size in sizes.items()
                  if name != JOINT and size.server_model is None]  # fmt: skip
    apart: dict[str, list[str]] = {}  # "1 central model × 3 seeds" -> its methods
    for name, size in sizes.items():
        if name == JOINT or size.server_model is not None:
            model = "pooled model" if name == JOINT else f"{size.server_model} model"
            pooled = f"{_count([size.clients], model)} × {_count([size.seeds], 'seed')}"
            apart.setdefault(pooled, []).append(name)
    parts = []
    if per_client:
        clients = _count([size.clients for size in per_client], "client")
        parts.append(f"{clients} × {_count([size.seeds for size in per_client], 'seed')}")
    if apart:
        stated = "; ".join(f"{', '.join(names)}: {pooled}" for pooled, names in apart.items())
        alone = not per_client and len(apart) == 1 and len(next(iter(apart.values()))) == 1
        parts.append(next(iter(apart)) if alone else f"({stated})" if per_client else stated)
    return "Mean ± std over " + " ".join(parts) if parts else "Mean ± std"


def _count(values: Sequence[int], noun: str) -> str:
    low, high = min(values), max(values)
    number = str(low) if low == high else f"{low}–{high}"
    return f"{number} {noun}{'' if high == 1 else 's'}"


# With more than four of the paper's methods, their bands hide each other: they are drawn
# in two panels, the baselines (each hospital alone, all data pooled, a central server)
# and the decentralised methods, each with ProxyFL, the method both are compared with.
MOST_IN_ONE_PANEL = 4
BASELINES: tuple[str, ...] = ("Regular", "Joint", "FedAvg")


def method_groups(methods: Iterable[str]) -> list[tuple[str, list[str]]]:
    """The methods split for Figure 8's panels, each in paper order: the ProxyFL paper's
    seven (:data:`~proxyfl.names.PAPER_ALGORITHMS`) together, or, when more than
    :data:`MOST_IN_ONE_PANEL` of them ran, its baselines (Regular, Joint, FedAvg) and its
    decentralised methods (AvgPush, CWT, FML) apart, ProxyFL in both; every other method
    (PrivateKT, unknown names) apart. A group without methods is left out. Each group: (its
    name, its methods)."""
    ordered = sorted(methods, key=order_key)
    paper = [name for name in ordered if name in PAPER_ALGORITHMS]
    other = [name for name in ordered if name not in PAPER_ALGORITHMS]
    groups: list[tuple[str, list[str]]] = []
    if len(paper) > MOST_IN_ONE_PANEL:
        reference = [name for name in paper if name == EMPHASISED]
        baselines = [name for name in paper if name in BASELINES]
        peers = [name for name in paper if name not in BASELINES and name != EMPHASISED]
        groups += [("the paper's baselines", sorted(baselines + reference, key=order_key)),
                   ("the paper's decentralised methods",
                    sorted(peers + reference, key=order_key))]  # fmt: skip
    elif paper:
        groups.append(("the ProxyFL paper's methods", paper))
    if other:
        groups.append((f"{', '.join(other)} (not in the paper)", other))
    return [(name, members) for name, members in groups if members]


def baseline_label(majority: MajorityClass) -> str:
    """The majority line's legend entry, e.g. "majority class (always tumour)"."""
    return f"majority class (always {majority.name})"


def plot_curves(
    per_round: Mapping[str, Sequence[CurvePoint]],
    metric: str,
    label: str,
    path: Path,
    *,
    title: str | None = None,
    majority: MajorityClass | None = None,
) -> Figure:
    """Write one metric of Figure 8 as a PNG and return its figure: one panel per group of
    :func:`method_groups` side by side, one line per method (legend in paper order) with a
    mean ± std band, x = round, and the majority class's score as a dashed line when
    ``majority`` is given. ``metric``: accuracy | macro_accuracy."""
    groups = method_groups(per_round) or [("", [])]
    figure = _figure(figsize=(7.6 + 4.6 * (len(groups) - 1), 4.4))
    panels = figure.subplots(1, len(groups), squeeze=False)[0]
    handles: list[Line2D] = []
    for axes, (name, methods) in zip(panels, groups, strict=True):
        handles += _draw_panel(axes, {m: per_round[m] for m in methods}, metric, label, majority)
        if len(groups) > 1:
            axes.set_title(name[:1].upper() + name[1:], fontsize="medium")  # "The ProxyFL ..."
    _legend(figure, _unique(handles), loc="outside right upper", ncols=1)
    if title and len(groups) == 1:  # over the panel: the legend takes the top right corner
        panels[0].set_title(title, fontsize="medium")
    elif title:
        figure.suptitle(title)
    _save_png(figure, path)
    return figure


def plot_figure(
    per_round: Mapping[str, Sequence[CurvePoint]],
    path: Path,
    *,
    title: str,
    majority: MajorityClass | None = None,
) -> Figure:
    """Write Figure 8 of the ProxyFL paper as a PNG and return it: accuracy (left) and
    macro-accuracy (right) per round, one mean line and mean ± std band per method, one row
    of panels per group of :func:`method_groups` (the paper's seven methods, then the
    others), the majority class's scores as dashed lines when ``majority`` is given, one
    legend in paper order below the panels and ``title`` (see :func:`sample_title`) above."""
    groups = method_groups(per_round) or [("", [])]
    figure = _figure(figsize=(11.0, 4.6 + 3.8 * (len(groups) - 1)))
    panels = figure.subplots(len(groups), len(_PANELS), squeeze=False)
    handles: list[Line2D] = []
    for row, (name, methods) in zip(panels, groups, strict=True):
        for axes, (metric, label) in zip(row, _PANELS, strict=True):
            curves_here = {m: per_round[m] for m in methods}
            handles += _draw_panel(axes, curves_here, metric, label, majority)
            axes.set_title(label if len(groups) == 1 else f"{label}: {name}")
    handles = _unique(handles)
    ncols = len(handles) if len(handles) <= 7 else math.ceil(len(handles) / 2)
    _legend(figure, handles, loc="outside lower center", ncols=ncols)
    figure.suptitle(title)
    _save_png(figure, path)
    return figure


# The membership-inference ROC figure: FPR from 0.1 % (log axes), the chance diagonal, a
# private model (never released) dotted with hollow markers, a released one solid.
ROC_FPR_MIN = 1e-3
_CHANCE_STYLE: dict[str, object] = {
    "color": "#555555", "linestyle": "--", "linewidth": 1.0, "zorder": 2.0,
}  # fmt: skip
_ROC_MARKERS = 10  # per curve


def plot_roc(curves: Sequence[RocCurve], path: Path, *, title: str) -> Figure:
    """Write the membership-inference ROC figure as a PNG and return it: one mean curve
    per method and model (:func:`~analysis.report.audit.roc_curves`) on log-log axes, FPR
    from 10⁻³ to 1, the chance diagonal TPR = FPR dashed; each method in its colour and
    marker (:func:`method_style`), a model that never leaves its hospital dotted with
    hollow markers, a released one solid. A TPR of 0 sits on the bottom edge."""
    figure = _figure(figsize=(8.4, 5.2))
    axes = figure.subplots()
    axes.set_xscale("log", nonpositive="clip")
    axes.set_yscale("log", nonpositive="clip")
    (chance,) = axes.plot([ROC_FPR_MIN, 1.0], [ROC_FPR_MIN, 1.0], label="chance (TPR = FPR)",
                          **_CHANCE_STYLE)  # fmt: skip
    lowest = ROC_FPR_MIN
    lines: list[Line2D] = []
    for index, curve in enumerate(curves):
        fpr, tpr = np.asarray(curve.fpr), np.asarray(curve.tpr)
        shown = fpr >= ROC_FPR_MIN * (1 - 1e-9)
        fpr, tpr = fpr[shown], tpr[shown]
        if np.any(tpr > 0):
            lowest = min(lowest, float(tpr[tpr > 0].min()))
        style = method_style(curve.method)
        step = max(1, math.ceil(len(fpr) / _ROC_MARKERS))
        (line,) = axes.plot(
            fpr,
            tpr,
            label=curve.label,
            color=style.color,
            linestyle="solid" if curve.released else (0, (1, 1.2)),
            linewidth=style.linewidth,
            alpha=style.alpha,
            zorder=style.zorder,
            marker=style.marker,
            markersize=4.5 + 0.75 * style.linewidth,
            markerfacecolor=style.color if curve.released else "white",
            markeredgecolor="white" if curve.released else style.color,
            markeredgewidth=0.6 if curve.released else 1.0,
            markevery=(index % step, step),
        )
        lines.append(line)
    axes.set_xlim(ROC_FPR_MIN, 1.0)
    axes.set_ylim(10 ** math.floor(math.log10(max(lowest, 1e-5)) + 1e-9) * 0.8, 1.05)
    axes.set_xlabel("False positive rate")
    axes.set_ylabel("True positive rate")
    axes.grid(alpha=0.3)
    axes.set_title(title, fontsize="medium")
    _legend(figure, [*lines, chance], loc="outside right upper", ncols=1)
    _save_png(figure, path)
    return figure


def _unique(handles: Sequence[Line2D]) -> list[Line2D]:
    """One legend entry per label: the methods in paper order, the majority line last."""
    seen: dict[str, Line2D] = {}
    for handle in handles:
        seen.setdefault(str(handle.get_label()), handle)
    methods = [h for h in seen.values() if h.get_gid() != _BASELINE_GID]
    baseline = [h for h in seen.values() if h.get_gid() == _BASELINE_GID]
    return sorted(methods, key=lambda h: order_key(str(h.get_label()))) + baseline


def _figure(figsize: tuple[float, float]) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # Constrained layout leaves room for a legend placed "outside" the panels.
    figure = Figure(figsize=figsize, dpi=120, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _legend(figure: Figure, lines: Sequence[Line2D], *, loc: str, ncols: int) -> None:
    """One legend for the figure, outside the panels so that it hides no data; long handles
    so that the dash patterns can be told apart."""
    if lines:
        figure.legend(handles=lines, loc=loc, ncols=max(ncols, 1), handlelength=3.5)


def _draw_panel(
    axes: Axes,
    per_round: Mapping[str, Sequence[CurvePoint]],
    metric: str,
    label: str,
    majority: MajorityClass | None = None,
) -> list[Line2D]:
    """Draw every method's mean line and mean ± std band of ``metric`` on ``axes``, and the
    majority class's score (accuracy: its share; macro-accuracy: 1 / classes) as a
    horizontal dashed line; return the lines in paper order, the majority line last (the
    legend's handles)."""
    from matplotlib.ticker import MaxNLocator

    methods = sorted(per_round, key=order_key)
    longest = max((len(per_round[name]) for name in methods), default=0)
    step = max(1, math.ceil(longest / _MAX_MARKERS))
    lines: list[Line2D] = []
    band_edges: list[np.ndarray] = []
    for index, algorithm in enumerate(methods):
        points = per_round[algorithm]
        x = np.array([p.round for p in points], dtype=float)
        mean = np.array([getattr(p, f"{metric}_mean") for p in points], dtype=float)
        std = np.array([getattr(p, f"{metric}_std") for p in points], dtype=float)
        style = method_style(algorithm)
        # Bands under every line; each method's markers start at a different round so that
        # markers of methods with equal values do not hide one another.
        band = {"color": style.color, "alpha": _BAND_ALPHA, "linewidth": 0, "zorder": 1.0}
        axes.fill_between(x, mean - std, mean + std, **band)
        (line,) = axes.plot(
            x,
            mean,
            label=algorithm,
            color=style.color,
            linestyle=style.linestyle,
            linewidth=style.linewidth,
            alpha=style.alpha,
            zorder=style.zorder,
            marker=style.marker,
            markersize=4.5 + 0.75 * style.linewidth,
            markeredgecolor="white",
            markeredgewidth=0.6,
            markevery=(index % step, step),
        )
        lines.append(line)
        band_edges += [mean - std, mean + std]
    if majority is not None:
        value = majority.rate if metric == "accuracy" else majority.macro_accuracy
        baseline = axes.axhline(value, label=baseline_label(majority), gid=_BASELINE_GID,
                                **_BASELINE_STYLE)  # fmt: skip
        lines.append(baseline)
        band_edges.append(np.array([value]))
    axes.set_xlabel("Round")
    axes.set_ylabel(label)
    axes.set_ylim(*_y_limits(band_edges))
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.grid(alpha=0.3)
    return lines


def _y_limits(values: Sequence[np.ndarray]) -> tuple[float, float]:
    """The y range: the smallest holding every mean and band edge (at least 0.1 wide), plus
    a margin so that a line at the edge stays visible; [0, 1] when there is no data."""
    finite = np.concatenate([*values, np.array([])])
    finite = finite[np.isfinite(finite)]
    if finite.size == 0:
        return 0.0, 1.0
    low, high = float(finite.min()), float(finite.max())
    if high - low < 0.1:
        centre = (low + high) / 2
        low, high = centre - 0.05, centre + 0.05
    margin = 0.04 * (high - low)
    return low - margin, high + margin


def _save_png(figure: Figure, path: Path) -> None:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})
    atomic.write_bytes(path, buffer.getvalue())
