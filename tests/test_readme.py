"""The README's examples run as written, and so do those of the pages its sections moved to
(the home page, getting started and the user guide: docs/index.md, docs/getting-started.md,
docs/calibrate.md, docs/already-trained.md, docs/your-data.md): every Python block, and the
command-line examples of "Your data" (train, predict, report) on a small image folder and a
small CSV table. A block shown on several pages runs once."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import numpy as np
import pytest

from cogcal.cli import main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [
    README,
    *(
        ROOT / "docs" / name
        for name in (
            "index.md",
            "getting-started.md",
            "calibrate.md",
            "already-trained.md",
            "your-data.md",
        )
    ),
]


def _blocks(language: str) -> list[tuple[str, str]]:
    """(where, source) of every distinct ```language block of the pages, in order."""
    seen, blocks = set(), []
    for page in PAGES:
        found = re.findall(rf"```{language}\n(.*?)```", page.read_text(), flags=re.S)
        for i, code in enumerate(found):
            if code not in seen:
                seen.add(code)
                blocks.append((f"{page.relative_to(ROOT)} {language} block {i}", code))
    return blocks


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
        for _, block in _blocks("bash")
        if "folder:photos" in block
        for line in block.splitlines()
        if line.startswith("cogcal ")
    ]
    assert len(commands) == 5, "the README and docs/your-data.md show the same five commands"
    for line in commands:
        assert main([*shlex.split(line)[1:], "--no-progress"] if "train" in line else
                    shlex.split(line)[1:]) == 0, line  # fmt: skip
    assert (tmp_path / "runs" / "table" / "report.html").is_file()
    header, *rows = (tmp_path / "predictions.csv").read_text().splitlines()
    assert header == "prediction,no,yes" and len(rows) == 300
    header, *rows = (tmp_path / "cats.csv").read_text().splitlines()
    assert header == "file,prediction,cat,dog,owl" and len(rows) == 30
    python = _blocks("python")
    assert len(python) >= 8
    assert any("CalibratedModel(net" in code for where, code in python if "README" in where)
    for i, (where, code) in enumerate(python):
        exec(compile(code, where, "exec"), {"__name__": f"readme{i}"})
    out = capsys.readouterr().out
    assert "stratified 20% of train_data (400 samples" in out
    assert "['no', 'yes']" in out and (tmp_path / "table.onnx").is_file()
