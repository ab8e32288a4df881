"""A test slide as a pathologist would look at it: the slide with its annotated lesions
outlined, and beside it each model's tumour map over the slide with the lesions it found
outlined, the node's true class and each model's call in the titles.

One PNG per test slide (``STAGING/center_{c}/pictures/{slide_id}.png``), drawn within the
centre's folder by the stage that mapped it; the report embeds them. No software or date
metadata: the same maps give the same bytes.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

THUMBNAIL_WIDTH = 320  # pixels of the slide's picture: enough to see lesions of a few cells
COLUMNS = 5  # panels a row: the slide and four maps, then the next row


@dataclass(frozen=True)
class Panel:
    """One model's map of the slide and what it called."""

    title: str
    probability: np.ndarray  # (rows, cols), NaN: not predicted
    threshold: float
    predicted: str


def slide_picture(
    thumbnail: np.ndarray,
    downsample: float,
    lesions: Sequence[np.ndarray],
    truth: str,
    extent: int,
    panels: Sequence[Panel],
    title: str,
) -> bytes:
    """The PNG: ``thumbnail`` (the slide at ``downsample``) with ``lesions`` (level-0
    polygons) outlined, then one panel per model: its map over the thumbnail (cells of
    ``extent`` level-0 pixels, blue to red with the probability, transparent where not
    predicted), the cells at or above its threshold outlined."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    height, width = thumbnail.shape[:2]
    box = (0, width * downsample, height * downsample, 0)  # level-0 coordinates
    aspect = height / width
    columns = min(COLUMNS, 1 + len(panels))
    rows = -(-(1 + len(panels)) // columns)
    figure = Figure(figsize=(2.2 * columns, rows * (2.2 * aspect + 0.3) + 0.25), dpi=100,
                    layout="constrained")  # fmt: skip
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    for unused in axes[1 + len(panels) :]:
        unused.set_axis_off()
    figure.suptitle(title, fontsize=8)
    _slide_panel(axes[0], thumbnail, box, lesions, f"annotated: {truth}")
    for ax, panel in zip(axes[1 : 1 + len(panels)], panels, strict=True):
        cell_rows, cell_cols = panel.probability.shape
        cells = (0, cell_cols * extent, cell_rows * extent, 0)
        _slide_panel(ax, thumbnail, box, lesions, "", outline="#ffffff")
        ax.imshow(np.ma.masked_invalid(panel.probability), extent=cells, cmap="coolwarm",
                  vmin=0.0, vmax=1.0, alpha=0.6, interpolation="nearest")  # fmt: skip
        found = np.nan_to_num(panel.probability, nan=0.0) >= panel.threshold
        if found.any() and not found.all():
            centres_x = (np.arange(cell_cols) + 0.5) * extent
            centres_y = (np.arange(cell_rows) + 0.5) * extent
            ax.contour(centres_x, centres_y, found.astype(float), levels=[0.5],
                       colors="#000000", linewidths=0.8)  # fmt: skip
        mark = "✓" if panel.predicted == truth else "✗"
        ax.set_title(f"{panel.title}: {panel.predicted} {mark}", fontsize=7)
        ax.set_xlim(box[0], box[1])
        ax.set_ylim(box[2], box[3])
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()


def _slide_panel(
    ax,  # type: ignore[no-untyped-def]
    thumbnail: np.ndarray,
    box: tuple[float, float, float, float],
    lesions: Sequence[np.ndarray],
    title: str,
    outline: str = "#00a000",
) -> None:
    ax.imshow(thumbnail, extent=box, interpolation="bilinear")
    for vertices in lesions:
        closed = np.vstack([vertices, vertices[:1]])
        ax.plot(closed[:, 0], closed[:, 1], color=outline, linewidth=0.8)
    ax.set_xticks([])
    ax.set_yticks([])
    if title:
        ax.set_title(title, fontsize=7)


def picture_downsample(dimensions: tuple[int, int], width: int = THUMBNAIL_WIDTH) -> float:
    """The downsample that makes a slide of level-0 ``dimensions`` ``width`` pixels wide
    (never finer than level 0)."""
    return max(dimensions[0] / width, 1.0)


def panel_titles(keys: Sequence[str]) -> Mapping[str, str]:
    """Each model key's title: the method alone when every key has one seed."""
    methods = [key.split("/")[0] for key in keys]
    unique = len(set(methods)) == len(methods)
    return {key: (method if unique else key) for key, method in zip(keys, methods, strict=True)}
