"""The architecture's layering: the core needs torch and numpy only."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("lightning", "pandas", "matplotlib", "sklearn", "scipy", "torchvision", "yaml")


def test_core_imports_only_torch_and_numpy():
    code = (
        "import sys, cogcal, cogcal.calibrators, cogcal.cog, cogcal.losses, cogcal.metrics, cogcal.posthoc\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


@pytest.mark.slow
def test_cli_help_list_and_report_never_import_lightning(tmp_path):
    """`cogcal --help`, `cogcal bench --list` and `cogcal report` (a bench folder and a run
    folder) run without importing Lightning, as does a single-process CPU `cogcal train`."""
    (tmp_path / "bench").mkdir()
    code = f"""
import contextlib, io, sys
import cogcal.cli
out = io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
    with contextlib.suppress(SystemExit):
        cogcal.cli.main(["--help"])
    assert cogcal.cli.main(["bench", "--list"]) == 0
    assert cogcal.cli.main(["report", {str(tmp_path / "bench")!r}]) == 2  # no results.csv
    assert cogcal.cli.main(["train", "--preset", "paper", "--epochs", "1", "--no-progress",
                            "--data-root", {str(tmp_path / "data")!r},
                            "--out", {str(tmp_path / "run")!r}]) == 0
    assert cogcal.cli.main(["report", {str(tmp_path / "run")!r}]) == 0
print([m for m in sys.modules if m == "lightning" or m.startswith(("lightning.", "lightning_fabric"))])
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "[]", res.stdout
