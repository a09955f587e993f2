"""Every Python example of docs/metrics.md runs as written (in a temporary directory)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_examples_exist():
    assert len(BLOCKS) >= 4
    assert any("plot_reliability_per_task" in b for b in BLOCKS)


@pytest.mark.parametrize(
    "i",
    [  # the figures and the bootstrap intervals take seconds: the full suite runs them
        pytest.param(i, marks=pytest.mark.slow)
        if "plot_reliability" in b or "intervals" in b
        else i
        for i, b in enumerate(BLOCKS)
    ],
)
def test_example_runs(i, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    if "as_torchmetric" in BLOCKS[i]:
        pytest.importorskip("torchmetrics")
    monkeypatch.chdir(tmp_path)
    exec(compile(BLOCKS[i], f"{DOC.name}[python block {i}]", "exec"), {"__name__": "__doc__"})
    if "plot_reliability" in BLOCKS[i]:
        written = {p.name for p in tmp_path.rglob("*") if p.is_file()}
        assert written == {"reliability.png", "methods.png", "from_probs.svg", "tasks.pdf"}
