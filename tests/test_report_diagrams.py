"""Tests of cogcal.report.diagrams (headless, PNG and SVG output)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure

from cogcal.metrics import reliability_bins
from cogcal.report import plot_reliability, plot_reliability_per_task, reliability_diagram


def _pair(n=300, k=4, seed=0, scale=2.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g) * scale, torch.randint(0, k, (n,), generator=g)


def test_single_diagram_from_bins_and_pair():
    z, y = _pair()
    bins = reliability_bins(z, y, n_bins=10)
    fig = reliability_diagram(bins, title="ce")
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    ax, count_ax = fig.axes
    ece = np.nansum(bins["count"] * np.abs(bins["accuracy"] - bins["confidence"])) / 300
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert f"ECE = {100 * ece:.2f}%" in legend[0]
    heights = sorted(round(p.get_height(), 6) for p in count_ax.patches)
    assert heights == sorted(round(c, 6) for c in bins["count"])  # counts beneath, every bin
    nonempty = int((bins["count"] > 0).sum())
    assert len(ax.patches) == 2 * nonempty  # accuracy bar + shaded gap per non-empty bin
    fig2 = reliability_diagram((z, y), n_bins=10)
    assert [t.get_text() for t in fig2.axes[0].get_legend().get_texts()] == legend


def test_diagram_on_given_axes_and_confidence_one():
    fig = Figure()
    ax = fig.add_subplot()
    z = torch.tensor([[100.0, 0.0, 0.0], [0.0, 0.0, 0.0]])  # c = 1.0 exactly
    out = reliability_diagram((z, torch.tensor([0, 1])), ax=ax, label="cog-fc", n_bins=5)
    assert out is fig and len(fig.axes) == 1
    assert "cog-fc" in ax.get_legend().get_texts()[0].get_text()


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_plot_reliability_side_by_side(tmp_path, suffix):
    methods = {
        "ce": _pair(seed=1),
        "ts": reliability_bins(*_pair(seed=2), n_bins=15),
        "cog-fc": _pair(seed=3, scale=0.5),
    }
    path = tmp_path / "sub" / f"rel{suffix}"
    fig = plot_reliability(methods, path, n_bins=15, title="CIFAR-10")
    assert path.exists() and path.stat().st_size > 1000
    head = path.read_bytes()[:200]
    assert head.startswith(b"\x89PNG") if suffix == ".png" else b"<svg" in path.read_bytes()[:2000]
    assert [a.get_title() for a in fig.axes[:3]] == ["ce", "ts", "cog-fc"]


def test_plot_reliability_bad_input(tmp_path):
    with pytest.raises(ValueError, match="suffix|ending"):
        plot_reliability({"ce": _pair()}, tmp_path / "x.jpeg2")
    with pytest.raises(ValueError, match="non-empty"):
        plot_reliability({}, tmp_path / "x.png")
    with pytest.raises(ValueError, match="missing"):
        plot_reliability({"ce": {"count": [1]}})
    with pytest.raises(ValueError, match="bins dict"):
        reliability_diagram(42)


@pytest.mark.slow
def test_per_task_grid(tmp_path):
    g = torch.Generator().manual_seed(4)
    z, y = torch.randn(200, 5, generator=g), torch.randint(0, 2, (200, 5), generator=g)
    path = tmp_path / "tasks.svg"
    fig = plot_reliability_per_task((z, y), path, n_bins=10, task_names=list("abcde"), ncols=3)
    assert path.exists()
    visible = [a for a in fig.axes if a.get_visible()]
    assert [a.get_title() for a in visible] == list("abcde") and len(fig.axes) == 6
    with pytest.raises(ValueError, match="names"):
        plot_reliability_per_task((z, y), task_names=["a"])
    with pytest.raises(ValueError, match=r"\(T, B\)"):
        plot_reliability_per_task(reliability_bins(*_pair(), n_bins=10))


@pytest.mark.slow
def test_diagrams_do_not_touch_pyplot():
    code = (
        "import sys, torch; from cogcal.report import plot_reliability;"
        "plot_reliability({'a': (torch.randn(20, 3), torch.randint(0, 3, (20,)))});"
        "assert 'matplotlib.pyplot' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.slow
def test_multilabel_results_are_pooled_over_tasks():
    g = torch.Generator().manual_seed(0)
    z, y = torch.randn(40, 3, generator=g), torch.randint(0, 2, (40, 3), generator=g)
    fig = plot_reliability({"ce": (z, y)}, task="multilabel", n_bins=10)
    counts = [p.get_height() for p in fig.axes[1].patches]
    assert sum(counts) == 120  # every (sample, task) pair once
    # pooled bins = bins of the flattened binary problem
    flat = reliability_bins(z.reshape(-1), y.reshape(-1), task="binary", n_bins=10)
    assert counts == pytest.approx(flat["count"].tolist())
    legend = fig.axes[0].get_legend().get_texts()[0].get_text()
    ece = np.nansum(flat["count"] * np.abs(flat["accuracy"] - flat["confidence"])) / 120
    assert f"{100 * ece:.2f}%" in legend
