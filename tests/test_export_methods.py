"""Every method of the registry: a run's export (torch and ONNX) equals its model.

One tiny digits run per method (breast-cancer for the two-class ones; one epoch, ``--lr``
given: no selection), loaded back with :func:`cogcal.load_run`; its model, its export and its
ONNX file must give the logits the run evaluated (``test_logits.npz``), within 1e-5. The methods come from
:func:`cogcal.train.methods.list_methods`, so a method registered later is tested too.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import cogcal
from cogcal.cli import main
from cogcal.runs.methods import get_method, list_methods

TOL = 1e-5


def _applies(method: str) -> str | None:
    """Why ``method`` cannot train a multiclass digits run (None when it can)."""
    spec = get_method(method)
    if getattr(spec, "multilabel_only", False):
        return "multi-label only"
    return None


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("methods")


def _dataset(method: str) -> str:
    return "breast-cancer" if get_method(method).two_class else "digits"


def _run(root, method):
    out = root / method
    if not (out / "metrics.json").is_file():
        argv = ["train", "--dataset", _dataset(method), "--method", method, "--epochs", "1"]
        argv += ["--lr", "1e-2", "--stage2-epochs", "1", "--batch-size", "256"]
        argv += ["--data-root", str(root / "data")]
        assert main([*argv, "--no-progress", "--out", str(out)]) == 0
    return out


@pytest.mark.slow
@pytest.mark.parametrize("method", list_methods())
def test_every_methods_export_equals_its_run(method, root, tmp_path, capsys):
    if (why := _applies(method)) is not None:
        pytest.skip(why)
    ort = pytest.importorskip("onnxruntime")
    from cogcal.data import load_dataset

    out = _run(root, method)
    capsys.readouterr()
    loaded = cogcal.load_run(out)
    x = load_dataset(_dataset(method), root=root / "data").test.x  # raw inputs
    with torch.no_grad():
        model = loaded.model(x)
        exported = loaded.model.export()(x)
        in_pieces = torch.cat([loaded.model(x[i : i + 7]) for i in range(0, len(x), 7)])
    with np.load(out / "test_logits.npz") as f:
        saved = torch.from_numpy(f["logits"])
    # the model predicts what the run evaluated, whatever the batch around an input
    torch.testing.assert_close(model, saved, rtol=TOL, atol=TOL)
    torch.testing.assert_close(in_pieces, model, rtol=TOL, atol=TOL)
    # the export and its ONNX file compute the same logits
    torch.testing.assert_close(exported, model, rtol=TOL, atol=TOL)
    path = loaded.to_onnx(tmp_path / f"{method}.onnx")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, {"x": x.numpy().astype(np.float32)})[0]
    # ONNX Runtime's kernels give the backbone's probabilities ~1e-7 apart from torch's; a
    # non-parametric map (isotonic: steep between near-tied knots) can amplify that to ~1e-4
    # on a few entries. Its own ONNX path equals its torch path to 1e-12 on the same inputs
    # (tests/test_calibrators_nonparametric.py).
    # Dirichlet calibration and SMS map log-probabilities: float32 log p of a tiny
    # probability (log p ~ -40) carries an absolute error ~40 times that of the logits, which
    # the fitted weights carry into the output (1.2e-5 on one of 3,600 entries, fresh-clone CI).
    posthoc = get_method(method).posthoc
    tol = (
        1e-3
        if posthoc in ("isotonic", "histogram")
        else 1e-4
        if posthoc in ("dirichlet", "sms")
        else TOL
    )
    torch.testing.assert_close(torch.from_numpy(got), model, rtol=tol, atol=tol)
