"""Reliability diagrams (matplotlib, headless): per-bin accuracy against confidence, the
gap to the diagonal shaded, the bin counts beneath, the ECE in the legend.

Figures are built with :class:`matplotlib.figure.Figure`, never through ``pyplot``: no
backend is selected, no window opens, the user's ``pyplot`` state is untouched.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cogcal._constraints import COUNT, check
from cogcal.metrics import reliability_bins
from cogcal.report._common import save_figure

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["plot_reliability", "plot_reliability_per_task", "reliability_diagram"]

_BAR = "#3b75af"
_GAP = "#d62728"


def _as_bins(obj: Any, *, n_bins: int, task: str) -> dict[str, np.ndarray]:
    """A ``reliability_bins`` dict from either such a dict or a ``(logits, labels)`` pair."""
    if isinstance(obj, Mapping):
        missing = {"count", "confidence", "accuracy", "edges"} - set(obj)
        if missing:
            raise ValueError(
                f"a bins dict needs the keys count, confidence, accuracy, edges (as returned "
                f"by cogcal.metrics.reliability_bins); missing {sorted(missing)}."
            )
        return {
            k: np.asarray(obj[k], dtype=float) for k in ("count", "confidence", "accuracy", "edges")
        }
    if isinstance(obj, tuple | list) and len(obj) == 2:
        return reliability_bins(obj[0], obj[1], n_bins=n_bins, task=task)
    raise ValueError(
        "expected a bins dict from cogcal.metrics.reliability_bins or a (logits, labels) "
        f"pair, got {type(obj).__name__}."
    )


def _pooled(bins: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Multi-label bins (T, B) pooled over tasks: every (sample, task) pair counts once."""
    count = bins["count"]
    if count.ndim != 2:
        return bins
    total = count.sum(0)
    out = {"count": total, "edges": bins["edges"]}
    with np.errstate(invalid="ignore", divide="ignore"):
        for key in ("confidence", "accuracy"):
            s = np.nan_to_num(bins[key] * count).sum(0)
            out[key] = np.where(total > 0, s / np.where(total > 0, total, 1), np.nan)
    return out


def _ece(bins: Mapping[str, np.ndarray]) -> float:
    count = np.asarray(bins["count"], dtype=float)
    gap = np.abs(np.asarray(bins["accuracy"]) - np.asarray(bins["confidence"]))
    return float(np.nansum(count * gap) / count.sum())


def _draw(
    ax: Axes,
    count_ax: Axes | None,
    bins: Mapping[str, np.ndarray],
    *,
    title: str | None,
    label: str | None,
    color: str,
) -> None:
    from matplotlib.patches import Patch  # here: matplotlib (heavy) loads only to draw

    count = np.asarray(bins["count"], dtype=float)
    if count.ndim != 1:
        raise ValueError(
            f"one reliability diagram needs 1-D bins, got count of shape {count.shape}; "
            "for multilabel bins use plot_reliability_per_task."
        )
    edges = np.asarray(bins["edges"], dtype=float)
    acc = np.asarray(bins["accuracy"], dtype=float)
    conf = np.asarray(bins["confidence"], dtype=float)
    left, width = edges[:-1], np.diff(edges)
    full = count > 0
    ece = _ece(bins)
    ax.bar(
        left[full], acc[full], width=width[full], align="edge", color=color, alpha=0.85,
        edgecolor="white", linewidth=0.5,
    )  # fmt: skip
    lo, hi = np.minimum(acc, conf)[full], np.abs(acc - conf)[full]
    ax.bar(
        left[full], hi, bottom=lo, width=width[full], align="edge", color=_GAP, alpha=0.3,
        edgecolor=_GAP, hatch="//", linewidth=0.5,
    )  # fmt: skip
    ax.plot([0, 1], [0, 1], ls="--", color="0.3", lw=1)
    name = f"{label}: " if label else ""
    handles = [
        Patch(color=color, alpha=0.85, label=f"{name}accuracy (ECE = {100 * ece:.2f}%)"),
        Patch(facecolor=_GAP, alpha=0.3, hatch="//", edgecolor=_GAP, label="gap to confidence"),
    ]
    ax.legend(handles=handles, loc="upper left", fontsize="small", frameon=False)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy")
    if title:
        ax.set_title(title)
    if count_ax is None:
        ax.set_xlabel("confidence")
        return
    count_ax.bar(left, count, width=width, align="edge", color="0.5", edgecolor="white", lw=0.5)
    count_ax.set_xlim(0, 1)
    count_ax.set_xlabel("confidence")
    count_ax.set_ylabel("count")
    if count.max() > 0 and count.max() / max(count[full].min(), 1) > 100:
        count_ax.set_yscale("log")
    ax.tick_params(labelbottom=False)


def reliability_diagram(
    bins_or_results: Any,
    *,
    ax: Axes | None = None,
    count_ax: Axes | None = None,
    title: str | None = None,
    label: str | None = None,
    n_bins: int = 15,
    task: str = "multiclass",
    color: str = _BAR,
) -> Figure:
    """Draw one reliability diagram: per-bin accuracy against confidence, counts beneath.

    ``bins_or_results`` is the output of :func:`cogcal.metrics.reliability_bins` or a
    ``(logits, labels)`` pair binned here (``n_bins``, ``task``); multi-label input is
    pooled over tasks, every (sample, task) pair counting once (its legend ECE is that of
    the pooled bins; :func:`plot_reliability_per_task` draws one panel per task). Without
    ``ax`` a new figure holds the diagram above a bin-count panel; with ``ax`` and no
    ``count_ax`` the counts are omitted. ``title`` and ``label`` (a method name for the
    legend) are optional; ``color`` colours the accuracy bars. Returns the figure.

    >>> import torch
    >>> fig = reliability_diagram((torch.randn(200, 3), torch.randint(0, 3, (200,))), n_bins=10)
    >>> len(fig.axes)
    2
    """
    from matplotlib.figure import Figure  # here: matplotlib (heavy) loads only to draw

    bins = _pooled(_as_bins(bins_or_results, n_bins=n_bins, task=task))
    if ax is None:
        fig = Figure(figsize=(4.2, 5.0), layout="constrained")
        ax, count_ax = fig.subplots(2, 1, sharex=True, height_ratios=(3, 1))
    _draw(ax, count_ax, bins, title=title, label=label, color=color)
    return ax.get_figure()


def plot_reliability(
    methods: Mapping[str, Any],
    path: str | Path | None = None,
    *,
    n_bins: int = 15,
    task: str = "multiclass",
    title: str | None = None,
    dpi: int = 150,
) -> Figure:
    """Reliability diagrams of several methods side by side (``{name: bins dict or
    (logits, labels)}``, as in :func:`reliability_diagram`), written to ``path`` when
    given (``.png``, ``.svg`` or ``.pdf``, parent folders created); returns the figure.

    >>> import torch
    >>> y = torch.randint(0, 3, (100,))
    >>> fig = plot_reliability({"ce": (torch.randn(100, 3), y), "cog-fc": (torch.randn(100, 3), y)})
    >>> len(fig.axes)
    4
    """
    from matplotlib.figure import Figure  # here: matplotlib (heavy) loads only to draw

    if not isinstance(methods, Mapping) or not methods:
        raise ValueError("`methods` must be a non-empty dict mapping method names to results.")
    m = len(methods)
    width, height = 3.6 * m, 4.6
    fig = Figure(figsize=(width, height))
    # fixed margins (inches) instead of a constrained layout, which doubles the drawing
    # time of a wide figure; the panels share their y axes, so only the first has labels
    fig.subplots_adjust(
        left=0.75 / width, right=1 - 0.15 / width, bottom=0.55 / height,
        top=1 - (0.75 if title else 0.45) / height, wspace=0.12, hspace=0.12,
    )  # fmt: skip
    axes = fig.subplots(2, m, sharex=True, sharey="row", height_ratios=(3, 1), squeeze=False)
    for j, (name, res) in enumerate(methods.items()):
        bins = _pooled(_as_bins(res, n_bins=n_bins, task=task))
        _draw(axes[0, j], axes[1, j], bins, title=str(name), label=None, color=_BAR)
        if j:
            axes[0, j].set_ylabel("")
            axes[1, j].set_ylabel("")
    if title:
        fig.suptitle(title)
    if path is not None:
        save_figure(fig, path, dpi)
    return fig


def plot_reliability_per_task(
    results: Any,
    path: str | Path | None = None,
    *,
    n_bins: int = 15,
    task_names: Sequence[str] | None = None,
    ncols: int = 5,
    title: str | None = None,
    dpi: int = 150,
) -> Figure:
    """One small reliability diagram per task of a multi-label model, ``ncols`` per row.

    ``results`` is a multi-label ``(logits, labels)`` pair of shape (N, T) or the output of
    ``reliability_bins(..., task="multilabel")``; ``task_names`` titles the panels
    (default ``t0 ... t{T-1}``). Written to ``path`` when given; returns the figure.

    >>> import torch
    >>> fig = plot_reliability_per_task((torch.randn(80, 3), torch.randint(0, 2, (80, 3))), ncols=2)
    >>> len(fig.axes)
    4
    """
    from matplotlib.figure import Figure  # here: matplotlib (heavy) loads only to draw
    from matplotlib.patches import Patch  # here: as above

    bins = _as_bins(results, n_bins=n_bins, task="multilabel")
    count = np.asarray(bins["count"])
    if count.ndim != 2:
        raise ValueError(
            f"per-task diagrams need multilabel bins of shape (T, B), got {count.shape}; "
            "compute them with reliability_bins(..., task='multilabel')."
        )
    t = count.shape[0]
    names = list(task_names) if task_names is not None else [f"t{i}" for i in range(t)]
    if len(names) != t:
        raise ValueError(f"`task_names` has {len(names)} names for {t} tasks.")
    check(ncols, COUNT, "ncols")
    ncols = min(ncols, t)
    nrows = -(-t // ncols)
    fig = Figure(figsize=(2.6 * ncols, 2.6 * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, sharex=True, sharey=True, squeeze=False).ravel()
    for i, ax in enumerate(axes):
        if i >= t:
            ax.set_visible(False)
            continue
        one = {k: (v if k == "edges" else np.asarray(v)[i]) for k, v in bins.items()}
        _draw(ax, None, one, title=names[i], label=None, color=_BAR)
        ax.legend(
            handles=[Patch(color=_BAR, alpha=0.85, label=f"ECE {100 * _ece(one):.1f}%")],
            loc="upper left", fontsize="x-small", frameon=False,
        )  # fmt: skip
        if i % ncols:
            ax.set_ylabel("")
        if i < t - ncols:
            ax.set_xlabel("")
    if title:
        fig.suptitle(title)
    if path is not None:
        save_figure(fig, path, dpi)
    return fig
