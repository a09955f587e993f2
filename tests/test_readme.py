"""The README's examples run as written: every Python block, and the command-line examples
of "Your data" (train, predict, report) on a small image folder and a small CSV table."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import numpy as np
import pytest

from cogcal.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), flags=re.S)


def _photos(root: Path) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    for k, name in enumerate(("cat", "dog", "owl")):
        (root / name).mkdir(parents=True)
        for i in range(30):
            pixels = rng.integers(0, 80, (16, 16, 3))
            pixels[..., k] += 150  # one colour channel per class
            Image.fromarray(pixels.astype(np.uint8)).save(root / name / f"{i}.png")


def _table(path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 4))
    label = np.where(x[:, 0] + x[:, 1] > 0, "yes", "no")
    lines = ["f1,f2,f3,f4,label"] + [
        ",".join(f"{v:.4f}" for v in row) + f",{c}" for row, c in zip(x, label, strict=True)
    ]
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.slow
def test_readme_examples_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _photos(tmp_path / "photos")
    _table(tmp_path / "table.csv")
    commands = [
        line
        for block in _blocks("bash")
        if "folder:photos" in block
        for line in block.splitlines()
        if line.startswith("cogcal ")
    ]
    assert len(commands) == 5
    for line in commands:
        assert main([*shlex.split(line)[1:], "--no-progress"] if "train" in line else
                    shlex.split(line)[1:]) == 0, line  # fmt: skip
    assert (tmp_path / "runs" / "table" / "report.html").is_file()
    header, *rows = (tmp_path / "predictions.csv").read_text().splitlines()
    assert header == "prediction,no,yes" and len(rows) == 300
    header, *rows = (tmp_path / "cats.csv").read_text().splitlines()
    assert header == "file,prediction,cat,dog,owl" and len(rows) == 30
    python = _blocks("python")
    assert len(python) >= 6
    for i, code in enumerate(python):
        exec(compile(code, f"README.md python block {i}", "exec"), {"__name__": f"readme{i}"})
    out = capsys.readouterr().out
    assert "stratified 20% of train_data (400 samples" in out
    assert "['no', 'yes']" in out and (tmp_path / "table.onnx").is_file()
