"""Every ```python block of docs/recipes.md runs as written (so the recipes cannot drift).

Each block runs in a fresh namespace, in its own temporary working directory. A block
whose optional dependency (transformers, timm, onnxruntime, ...) is missing is skipped.
``torch.compile`` runs with ``backend="aot_eager"`` unless the block names a backend: the
same dynamo tracing and ``_orig_mod`` wrapping as the default Inductor backend, without
its C++ code generation (tens of seconds on a small CPU machine); the recipe itself was
checked with Inductor.
"""

from __future__ import annotations

import ast
import functools
import re
import warnings
from pathlib import Path

import pytest
import torch

RECIPES = Path(__file__).resolve().parents[1] / "docs" / "recipes.md"
_FENCE = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
# Imports that are not installed with cogcal itself: a block using one is skipped without it.
_OPTIONAL = {"transformers", "accelerate", "timm", "onnx", "onnxruntime", "onnxscript"}


def _blocks() -> list[tuple[str, int, str]]:
    """(heading, first line, source) of every python block, in order."""
    text = RECIPES.read_text(encoding="utf-8")
    blocks, counts = [], {}
    for match in _FENCE.finditer(text):
        before = text[: match.start()]
        headings = re.findall(r"^## (.+)$", before, flags=re.MULTILINE)
        heading = headings[-1] if headings else "preamble"
        counts[heading] = counts.get(heading, 0) + 1
        label = heading if counts[heading] == 1 else f"{heading} ({counts[heading]})"
        blocks.append((label, before.count("\n") + 2, match.group(1)))
    return blocks


def _imports(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


BLOCKS = _blocks()


def test_the_recipes_are_there():
    headings = {label.split(" (")[0] for label, _, _ in BLOCKS}
    for expected in (
        "PyTorch Lightning",
        "timm",
        "HuggingFace Trainer",
        "OneCycleLR and cosine annealing",
        "torch.compile",
        "A reliability diagram from your own logits",
    ):
        assert expected in headings, expected
    assert "SPEC" not in RECIPES.read_text(encoding="utf-8")


#: The recipes of the fast loop (``pytest -m "not slow"``); the others train with or import a
#: framework (seconds each) and run in the full suite.
FAST = {"Plain PyTorch for reference"}


@pytest.mark.parametrize(
    ("label", "line", "source"),
    [b if b[0] in FAST else pytest.param(*b, marks=pytest.mark.slow) for b in BLOCKS],
    ids=[re.sub(r"\W+", "-", b[0]) for b in BLOCKS],
)
def test_recipe_runs(label, line, source, tmp_path, monkeypatch):
    for module in sorted(_imports(source) & _OPTIONAL):
        pytest.importorskip(module)
    monkeypatch.chdir(tmp_path)
    if "torch.compile(" in source:
        monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    code = compile(source, f"{RECIPES}:{line}", "exec")
    with warnings.catch_warnings():
        # the recipes may print what the libraries say; only errors fail them
        warnings.simplefilter("ignore")
        exec(code, {"__name__": "__recipe__"})  # noqa: S102 - the documentation under test
    if "savefig" in source or ".png" in source:
        assert any(tmp_path.glob("*.png")), "the recipe wrote its figure"
