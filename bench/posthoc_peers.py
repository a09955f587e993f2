"""cogcal's post-hoc calibrators against the peers' versions of the same methods, on the same
saved logits, scored by one metric function, in one run.

    python bench/posthoc_peers.py [--repeats 3] [--sets mnist1d,gauss100,digits] [--first-fit]
                                  [--cv-seconds]

The peers (probmetrics, torch-uncertainty, netcal) are the optional extra ``peers``
(``pip install 'cogcal[peers]'``); a peer that is not installed is left out of the table.
The script makes three sets of logits itself and caches them under ``--cache``:

* ``mnist1d``: an MLP on mnist1d (4,000 samples; 2,400 train, 800 validation, 800 test);
* ``gauss100``: an MLP on 100 Gaussian classes in 32 dimensions, 25 validation samples per
  class (100 train, 25 validation, 100 test per class);
* ``digits``: a small CNN on scikit-learn's 8x8 digits (real MNIST cannot be downloaded
  here; 1,000 train, 400 validation, 397 test);
* ``cancer``: an MLP on scikit-learn's breast cancer table, two classes, trained long
  enough to be over-confident (300 train, 135 validation, 134 test): the set on which the
  two-class calibrators (``platt``, ``beta``) run; they are left out of the others.

Every calibrator is fitted on the validation logits and scored on the test logits by
:func:`cogcal.metrics.evaluate` on its probabilities (clipped at 1e-12 for the NLL, so a
zero probability costs 27.6 nats, not infinity). Fit seconds are wall-clock on one thread,
the median of ``--repeats`` fits after one warm-up fit per method; ``ratio`` divides by the
fastest peer of the same method fitting the same model, and for ``ms``, ``dirichlet`` and
``auto`` (which choose their penalty, or the method, by cross-validation) by probmetrics'
structured matrix scaling (``SMSCalibrator``), marked ``/sms``. The rows ``cogcal one-vs-rest`` are the
paper's one-vs-rest BBQ (``BBQ(multiclass="one-vs-rest")``), beside cogcal's default,
which keeps each row's top label. The row ``torch-uncertainty (no bias)`` under ``vs`` is
torch-uncertainty's ``VectorScaler``, ``z * w`` with K per-class inverse temperatures and no
bias: a smaller model than vector scaling's ``w * z + b`` (Guo et al. 2017; cogcal's and
probmetrics'), shown for users who would pick it, its ratio to probmetrics' VS, and not
the denominator of the ``vs`` ratios. ``--first-fit`` also times, in a fresh
process, the first and a second temperature-scaling fit. ``--cv-seconds`` also prints,
for each of cogcal's calibrators that cross-validate their penalty, the seconds its
folds' fits took at each strength of the walk (``cv_seconds_``, one warm fit) beside the
pooled held-out NLL there: where the fit's time goes.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

import cogcal
from cogcal.calibrators import BBQ, KINDS, make_calibrator
from cogcal.data.tabular import make_mnist1d
from cogcal.metrics import evaluate

#: (fit(z, y) -> fitted object, predict(fitted, z) -> probabilities) of one calibrator
Entry = tuple[
    Callable[[np.ndarray, np.ndarray], object], Callable[[object, np.ndarray], np.ndarray]
]
#: the peer whose fit the cross-validated methods are compared with
_SMS = ("probmetrics", "sms")
#: torch-uncertainty's ``VectorScaler``: ``z * w``, K per-class inverse temperatures without
#: vector scaling's bias (Guo et al. 2017: ``w * z + b``, 2K parameters; cogcal's and
#: probmetrics' VS): a smaller model, shown beside VS but not the denominator of its ratio
_NO_BIAS = "torch-uncertainty (no bias)"
#: peers' rows that fit another model than the method's own (see _NO_BIAS)
_OTHER_MODELS = (_NO_BIAS,)
_CV_METHODS = ("ms", "dirichlet", "auto")


# -- the three sets of logits ----------------------------------------------------------------
def _train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, seed: int) -> None:
    torch.manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=1e-4)
    for _ in range(epochs):
        for idx in torch.randperm(x.shape[0]).split(64):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()


def _logits_of(
    model: nn.Module, x: np.ndarray, y: np.ndarray, n_train: int, n_val: int, epochs: int
) -> dict[str, np.ndarray]:
    xt, yt = torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.long)
    _train(model, xt[:n_train], yt[:n_train], epochs, seed=0)
    with torch.no_grad():
        z = model.eval()(xt).double().numpy()
    val, test = slice(n_train, n_train + n_val), slice(n_train + n_val, None)
    return {"zv": z[val], "yv": y[val], "zt": z[test], "yt": y[test]}


def _mlp(d: int, k: int, width: int = 256) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(d, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, k)
    )


def _mnist1d() -> dict[str, np.ndarray]:
    data = make_mnist1d(num_samples=4000)
    return _logits_of(_mlp(40, 10), data["x"], data["y"], 2400, 800, epochs=60)


def _gauss100() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    k, d, per = 100, 32, (100, 25, 100)
    means = rng.normal(size=(k, d)) * 0.62
    parts = []
    for count in per:  # train, validation, test, each ordered at random
        y = np.repeat(np.arange(k), count)
        rng.shuffle(y)
        parts.append((means[y] + rng.normal(size=(y.size, d)), y))
    x, y = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    return _logits_of(_mlp(d, k), x, y, per[0] * k, per[1] * k, epochs=40)


def _digits() -> dict[str, np.ndarray]:
    from sklearn.datasets import load_digits  # scikit-learn: only this set needs it

    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(y.size)
    x, y = (x[order] / 16.0).reshape(-1, 1, 8, 8), y[order]
    torch.manual_seed(0)
    cnn = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 16, 10),
    )  # fmt: skip
    return _logits_of(cnn, x, y, 1000, 400, epochs=30)


def _cancer() -> dict[str, np.ndarray]:
    from sklearn.datasets import load_breast_cancer  # scikit-learn: only this set needs it

    x, y = load_breast_cancer(return_X_y=True)
    order = np.random.default_rng(0).permutation(y.size)
    x, y = x[order], y[order]
    x = (x - x[:300].mean(0)) / x[:300].std(0)  # standardised on the training rows
    return _logits_of(_mlp(30, 2), x, y, 300, 135, epochs=100)


SETS = {"mnist1d": _mnist1d, "gauss100": _gauss100, "digits": _digits, "cancer": _cancer}


def load_set(name: str, cache: Path) -> dict[str, np.ndarray]:
    path = cache / f"{name}.npz"
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        np.savez(path, **SETS[name]())
    with np.load(path) as f:
        return {key: f[key] for key in f.files}


# -- the calibrators -------------------------------------------------------------------------
def _cogcal(method: str) -> Entry:
    def fit(z: np.ndarray, y: np.ndarray) -> object:
        if method == "auto":
            return cogcal.calibrate(z, y, method="auto")
        return make_calibrator(method).fit(z, y)

    return fit, lambda cal, z: cal.predict_proba(z)


def _probmetrics(name: str) -> Entry:
    import probmetrics.calibrators as pc  # optional peer
    from probmetrics.distributions import CategoricalLogits

    def fit(z: np.ndarray, y: np.ndarray) -> object:
        cal = getattr(pc, name)()
        return cal.fit_torch(CategoricalLogits(torch.tensor(z)), torch.tensor(y))

    def predict(cal: object, z: np.ndarray) -> np.ndarray:
        return cal.predict_proba_torch(CategoricalLogits(torch.tensor(z))).get_probs().numpy()

    return fit, predict


def _torch_uncertainty(name: str) -> Entry:
    import torch_uncertainty.post_processing as tp  # optional peer
    from torch.utils.data import DataLoader, TensorDataset

    def fit(z: np.ndarray, y: np.ndarray) -> object:
        zt = torch.tensor(z, dtype=torch.float32)
        scaler = getattr(tp, name)
        cal = scaler(z.shape[1]) if name in ("VectorScaler", "MatrixScaler") else scaler()
        cal.fit(DataLoader(TensorDataset(zt, torch.tensor(y)), batch_size=len(y)), progress=False)
        return cal

    def predict(cal: object, z: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return torch.softmax(cal(torch.tensor(z, dtype=torch.float32)).double(), 1).numpy()

    return fit, predict


def _netcal(module: str, name: str, **kwargs: object) -> Entry:
    cls = getattr(importlib.import_module(f"netcal.{module}"), name)

    def fit(z: np.ndarray, y: np.ndarray) -> object:
        p = torch.softmax(torch.tensor(z), 1).numpy()
        return cls(**kwargs).fit(p, y)

    def predict(cal: object, z: np.ndarray) -> np.ndarray:
        q = np.asarray(cal.transform(torch.softmax(torch.tensor(z), 1).numpy()), np.float64)
        if q.ndim == 1:  # two classes: netcal returns the positive class's probability
            q = np.stack([1.0 - q, q], axis=1)
        return q / q.sum(1, keepdims=True)

    return fit, predict


#: method -> library -> the peer's version of it
PEERS: dict[str, dict[str, Callable[[], Entry]]] = {
    "ts": {
        "probmetrics": lambda: _probmetrics("TemperatureScalingCalibrator"),
        "torch-uncertainty": lambda: _torch_uncertainty("TemperatureScaler"),
        "netcal": lambda: _netcal("scaling", "TemperatureScaling"),
    },
    "vs": {
        "probmetrics": lambda: _probmetrics("VectorScalingCalibrator"),
        _NO_BIAS: lambda: _torch_uncertainty("VectorScaler"),
    },
    "ms": {
        "probmetrics": lambda: _probmetrics("MatrixScalingCalibrator"),
        "torch-uncertainty": lambda: _torch_uncertainty("MatrixScaler"),
    },
    "svs": {"probmetrics": lambda: _probmetrics("SVSCalibrator")},
    "sms": {"probmetrics": lambda: _probmetrics("SMSCalibrator")},
    "isotonic": {
        "torch-uncertainty": lambda: _torch_uncertainty("IsotonicRegressionScaler"),
        "netcal": lambda: _netcal("binning", "IsotonicRegression"),
    },
    "histogram": {
        "torch-uncertainty": lambda: _torch_uncertainty("HistogramBinningScaler"),
        "netcal": lambda: _netcal("binning", "HistogramBinning", bins=15),
    },
    "bbq": {
        "torch-uncertainty": lambda: _torch_uncertainty("BBQScaler"),
        "netcal": lambda: _netcal("binning", "BBQ"),
    },
    "platt": {"netcal": lambda: _netcal("scaling", "LogisticCalibration")},
    "beta": {"netcal": lambda: _netcal("scaling", "BetaCalibration")},
}


#: cogcal's other forms of a method, shown beside it: the paper's one-vs-rest BBQ (cogcal's
#: keeps each row's top label for K > 2; the same map for two classes, so left out there)
VARIANTS: dict[str, dict[str, Callable[[], object]]] = {
    "bbq": {"cogcal one-vs-rest": lambda: BBQ(multiclass="one-vs-rest")},
}


def _variant(make: Callable[[], object]) -> Entry:
    return lambda z, y: make().fit(z, y), lambda cal, z: cal.predict_proba(z)


def _entries(method: str, k: int) -> dict[str, Entry]:
    entries = {"cogcal": _cogcal(method)}
    if k > 2:
        entries.update({name: _variant(make) for name, make in VARIANTS.get(method, {}).items()})
    for library, make in PEERS.get(method, {}).items():
        try:
            entries[library] = make()
        except ImportError:  # a peer that is not installed: left out
            continue
    return entries


# -- timing and scoring ----------------------------------------------------------------------
def _timed(entry: Entry, data: dict[str, np.ndarray], repeats: int) -> tuple[object, float]:
    fit = entry[0]
    times, cal = [], None
    for _ in range(repeats + 1):  # the first fit warms up (caches, first calls); 0: only it
        start = time.perf_counter()
        cal = fit(data["zv"], data["yv"])
        times.append(time.perf_counter() - start)
    return cal, statistics.median(times[1:] or times)


def _score(entry: Entry, cal: object, data: dict[str, np.ndarray]) -> dict[str, float]:
    q = np.asarray(entry[1](cal, data["zt"]), dtype=np.float64)
    q = np.clip(q, 1e-12, None)
    m = evaluate(probs=q / q.sum(1, keepdims=True), labels=data["yt"], n_bins=15)
    return {key: m[key] for key in ("nll", "ece_15", "brier", "acc")}


def run_set(name: str, data: dict[str, np.ndarray], methods: list[str], repeats: int) -> list:
    rows = []
    base = evaluate(logits=data["zt"], labels=data["yt"], n_bins=15)
    rows.append((name, "none", "-", base["nll"], base["ece_15"], base["brier"], base["acc"], 0.0))
    sms_seconds = None
    k = data["zv"].shape[1]
    for method in methods:
        if method in KINDS and KINDS.get(method).two_class and k != 2:
            continue  # a two-class calibrator: only on two-class sets
        for library, entry in _entries(method, k).items():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cal, seconds = _timed(entry, data, repeats)
                m = _score(entry, cal, data)
            rows.append(
                (name, method, library, m["nll"], m["ece_15"], m["brier"], m["acc"], seconds)
            )
            if (library, method) == _SMS:
                sms_seconds = seconds
    if sms_seconds is None and set(methods) & set(_CV_METHODS):
        try:
            sms = PEERS["sms"]["probmetrics"]()
        except ImportError:  # no probmetrics: no ratio to it
            sms = None
        sms_seconds = _timed(sms, data, repeats)[1] if sms else None
    return _with_ratios(rows, sms_seconds)


def _with_ratios(rows: list, sms_seconds: float | None) -> list:
    out = []
    for row in rows:
        name, method, library, *_, seconds = row
        peers = [
            r[-1] for r in rows
            if r[1] == method and not r[2].startswith(("cogcal", "-", *_OTHER_MODELS))
        ]  # fmt: skip
        if method in _CV_METHODS and sms_seconds:
            ratio = f"{seconds / sms_seconds:.1f}/sms"
        elif peers and library != "-":
            ratio = f"{seconds / min(peers):.1f}"
        else:
            ratio = "-"
        out.append((*row, ratio))
    return out


def cv_seconds(name: str, data: dict[str, np.ndarray], methods: list[str]) -> list[str]:
    """Table rows: per cross-validated cogcal calibrator of ``methods``, the seconds of each
    strength the walk visited and its pooled held-out NLL (one fit after a warm-up)."""
    rows = []
    for method in methods:
        if method not in KINDS or (KINDS.get(method).two_class and data["zv"].shape[1] != 2):
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            make_calibrator(method).fit(data["zv"], data["yv"])
            cal = make_calibrator(method).fit(data["zv"], data["yv"])
        seconds = getattr(cal, "cv_seconds_", None)
        if seconds is None:
            continue
        for l2, s, score in zip(cal.l2_grid_, seconds, cal.cv_scores_, strict=True):
            if np.isfinite(s):
                chosen = " (chosen)" if l2 == cal.l2_ else ""
                rows.append(f"| {name} | {method} | {l2:g}{chosen} | {s:.3f} | {score:.4f} |")
    return rows


def first_fit() -> str:
    """The first and a second ``Temperature().fit`` of a fresh process, in seconds."""
    code = (
        "import time, numpy as np\n"
        "t0 = time.perf_counter()\n"
        "from cogcal.calibrators import Temperature\n"
        "t1 = time.perf_counter()\n"
        "rng = np.random.default_rng(0); y = rng.integers(0, 10, 1000)\n"
        "z = 3 * (rng.normal(size=(1000, 10)) + 2 * np.eye(10)[y])\n"
        "s = time.perf_counter(); Temperature().fit(z, y); a = time.perf_counter() - s\n"
        "s = time.perf_counter(); Temperature().fit(z, y); b = time.perf_counter() - s\n"
        "print(f'import {t1 - t0:.2f} s, first TS fit {a:.3f} s, second {b:.3f} s')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sets", default=",".join(SETS))
    parser.add_argument("--methods", default=None, help="default: every kind, then auto")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/cogcal-posthoc-peers"))
    parser.add_argument("--first-fit", action="store_true")
    parser.add_argument("--cv-seconds", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    methods = args.methods.split(",") if args.methods else [*KINDS.names(), "auto"]
    header = ("set", "method", "library", "NLL", "ECE-15", "Brier", "acc", "fit s", "ratio")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for name in args.sets.split(","):
        for row in run_set(name, load_set(name, args.cache), methods, args.repeats):
            cells = [*row[:3], *(f"{v:.4f}" for v in row[3:7]), f"{row[7]:.3f}", row[8]]
            print("| " + " | ".join(map(str, cells)) + " |", flush=True)
    if args.cv_seconds:
        print("\n| set | method | strength | seconds | pooled held-out NLL |")
        print("|---|---|---|---|---|")
        for name in args.sets.split(","):
            for line in cv_seconds(name, load_set(name, args.cache), methods):
                print(line, flush=True)
    if args.first_fit:
        print(first_fit())


if __name__ == "__main__":
    main()
