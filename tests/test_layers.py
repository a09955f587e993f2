"""The architecture's layering: the core needs torch and numpy only."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("lightning", "pandas", "matplotlib", "sklearn", "scipy", "torchvision", "yaml")


def test_core_imports_only_torch_and_numpy():
    code = (
        "import sys, cogcal, cogcal.calibrators, cogcal.cog, cogcal.losses, cogcal.metrics\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
