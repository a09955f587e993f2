"""The claims across datasets (issue #31): the quick and claims suites, per-dataset method
lists, the blobs-100 and breast-cancer datasets, the per-dataset claim verdicts with their
paired intervals and the overall sentence, and the regime statement (ce's test ECE-15 and
whether it is over- or under-confident).

Every report test uses synthetic result frames and run folders (no training); expected
verdicts are recomputed with scipy.stats.ttest_rel and a hand-written Holm step-down.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats as sps

from cogcal._errors import ArgumentError
from cogcal.bench import check_requirements, load_suite
from cogcal.bench.plan import Plan
from cogcal.bench.suites import parse_suite
from cogcal.data import load_dataset
from cogcal.data.procedural import BLOBS100, BlobsSpec, make_blobs
from cogcal.data.robustness import ROBUSTNESS_DATASETS
from cogcal.report.blocks import Link
from cogcal.report.build import build_report
from cogcal.report.claims import (
    FAILS,
    HOLDS,
    MIXED,
    NOT_TESTED,
    UNDECIDED,
    families,
    judge_claims,
    overall,
    per_dataset_table,
    verdict_section,
)
from cogcal.report.frame import normalise_results
from cogcal.report.regime import (
    NEITHER,
    OVER,
    UNDER,
    UNKNOWN,
    confidence_and_accuracy,
    regime_table,
    regimes,
)
from cogcal.runs.columns import RESULT_COLUMNS, RUN_COLUMNS
from cogcal.runs.methods import get_method
from test_bench import TINY, run_bench
from test_report_render import result_row, write_csv, write_run

METRICS = ("acc", "nll", "brier", "ece_15")
SEEDS = 5


def _holm(pvals: dict) -> dict:
    """Holm-adjusted p-values by hand (step-down, running maximum)."""
    order = sorted(pvals, key=pvals.get)
    out, running = {}, 0.0
    for i, key in enumerate(order):
        running = max(running, min(1.0, (len(order) - i) * pvals[key]))
        out[key] = running
    return out


def _text(sentence) -> str:
    return "".join(p.text if isinstance(p, Link) else p for p in sentence)


# --------------------------------------------------------------------------- suites


def test_quick_has_two_datasets_with_something_to_calibrate():
    quick = load_suite("quick")
    assert [e.name for e in quick.datasets] == ["mnist1d", "blobs-100"]
    assert len(quick.seeds) == 5 and quick.protocols == ("fair",)
    mnist1d, blobs = quick.datasets
    assert quick.methods_of(mnist1d) == quick.methods and len(quick.methods) == 10
    assert "sms" in quick.methods  # the strongest post-hoc calibrator there (docs/bench.md)
    # blobs-100 (100 classes): every COG variant with its post-hoc counterpart (C1, C2, C6)
    assert quick.methods_of(blobs) == ("ce", "ts", "ms", "cog-fc", "cog-ts", "cog-ms")
    # its time is measured (test_bench checks README and docs quote it) or said not to be
    assert "time not measured for this version" in quick.description or re.search(
        r"\d+ min \d+ s", quick.description
    )


def test_claims_suite_tests_every_claim(tmp_path):
    suite = load_suite("claims")
    names = [e.name for e in suite.datasets]
    assert len(names) >= 4 and len(suite.seeds) == 5 and suite.protocols == ("fair",)
    info = check_requirements(suite, tmp_path / "data", check_train=False)
    # C5: a multi-task dataset, run with the methods that have a multi-task form only
    mtl = [e for e in suite.datasets if info[e.name]["task"] == "multilabel"]
    assert mtl and all(get_method(m).supports_multilabel for e in mtl for m in suite.methods_of(e))
    assert all({"cog-fc", "ts"} <= set(suite.methods_of(e)) for e in mtl)
    # C6: a dataset with >= 100 classes and both matrix scalings
    many = [e for e in suite.datasets if info[e.name]["num_classes"] >= 100]
    assert many and all({"ms", "cog-ms"} <= set(suite.methods_of(e)) for e in many)
    # C4: OOD sets for some datasets; tabular data among them
    assert {"mnist1d", "digits"} <= set(names) & set(ROBUSTNESS_DATASETS)
    assert "breast-cancer" in names and info["breast-cancer"]["input_shape"] == [30]
    # C1-C3 on every single-task dataset: the counterparts and the ranking field
    for e in suite.datasets:
        if e not in mtl:
            assert {"ce", "ts", "ms", "tst", "cog-fc", "cog-ts", "cog-ms"} <= set(suite.methods_of(e))  # fmt: skip


def test_the_plan_runs_a_dataset_only_with_its_own_methods(tmp_path):
    suite = load_suite("claims")
    queued = []
    plan = Plan(suite, tmp_path / "out", tmp_path / "data", queued.extend)
    groups = {(g.dataset, g.method): g for g in plan.groups}
    assert {m for ds, m in groups if ds == "mnist1d-mtl"} == {"ce", "cog-fc", "cog-ts", "cog-ms"}
    assert groups[("mnist1d-mtl", "ce")].used_by == ["ce", "ts", "ms"]
    posthoc = {"ts", "ms", "dirichlet", "sms", "isotonic"}
    assert set(groups[("digits", "ce")].used_by) == {"ce", *posthoc}
    assert ("mnist1d-mtl", "tst") not in groups and ("breast-cancer", "tst") in groups


def _two_datasets(**digits_mtl) -> dict:
    suite = json.loads(json.dumps(TINY))
    suite["methods"] = ["ce", "ts", "cog-fc"]
    suite["datasets"] = {"digits": {"model": "cnn"}, "digits-mtl": {"model": "cnn", **digits_mtl}}
    return suite


def test_per_dataset_methods_are_a_checked_subset(tmp_path):
    with pytest.raises(ValueError, match=r"datasets.digits-mtl.methods names tst, which the suite"):
        parse_suite(_two_datasets(methods=["ce", "tst"]))
    with pytest.raises(ValueError, match=r"datasets.digits-mtl.methods: unknown method 'cog-xx'"):
        parse_suite(_two_datasets(methods=["ce", "cog-xx"]))
    with pytest.raises(ValueError, match="must be a non-empty list"):
        parse_suite(_two_datasets(methods=[]))
    suite = parse_suite(_two_datasets(methods=["COG-FC", "ce"]))
    mtl = suite.datasets[1]
    assert suite.methods_of(mtl) == ("ce", "cog-fc") and suite.methods_of(suite.datasets[0]) == (
        "ce",
        "ts",
        "cog-fc",
    )
    # a multi-label dataset with a single-task method: refused, naming the way out
    tst = _two_datasets()
    tst["methods"] = ["ce", "tst", "cog-fc"]
    tst["budget"]["paper"]["baselines"]["stage2_epochs"] = 1
    tst["budget"]["fair"]["stage2_epochs"] = 1
    with pytest.raises(ArgumentError, match=r"tst have none.*datasets.digits-mtl.methods"):
        check_requirements(parse_suite(tst), tmp_path / "data", check_train=False)
    tst["datasets"]["digits-mtl"]["methods"] = ["ce", "cog-fc"]
    info = check_requirements(parse_suite(tst), tmp_path / "data", check_train=False)
    assert info["digits-mtl"]["task"] == "multilabel"


def test_bench_results_hold_only_each_datasets_methods(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent))
    suite = _two_datasets(methods=["ce", "cog-fc"])
    suite.update(protocols=["fair"], budget={"fair": suite["budget"]["fair"]}, seeds=2)
    path = tmp_path / "two.yaml"
    path.write_text(json.dumps(suite))
    summary = run_bench(path, out=tmp_path / "out", jobs=1, data_root=tmp_path / "data")
    assert summary.failed == 0
    df = pd.read_csv(tmp_path / "out" / "results.csv")
    got = {ds: set(g["method"]) for ds, g in df.groupby("dataset")}
    assert got == {"digits": {"ce", "ts", "cog-fc"}, "digits-mtl": {"ce", "cog-fc"}}


# --------------------------------------------------------------------------- data


def test_blobs100_is_deterministic_with_cifar100s_validation_ratio():
    a, b = load_dataset("blobs-100"), load_dataset("blobs-100")
    assert torch.equal(a.train.x, b.train.x) and torch.equal(a.test.y, b.test.y)
    k = a.num_classes
    assert k == 100 and a.input_shape == (BLOBS100.features,) and a.default_model == "mlp"
    assert (len(a.train), len(a.val), len(a.test)) == (6000, 2500, 5000)
    # every class has 25 validation samples: 2,500 for K^2 + K = 10,100 matrix-scaling
    # parameters, CIFAR-100's 2,500 validation images (5% of 50,000) for the same K
    assert torch.bincount(a.val.y, minlength=k).tolist() == [25] * k
    assert len(a.val) / (k * k + k) == pytest.approx(2500 / 10100)
    z = a.transform(a.train.x)
    assert z.mean(0).abs().max() < 1e-4 and (z.std(0, unbiased=False) - 1).abs().max() < 1e-4
    assert a.info["generator"]["seed"] == BLOBS100.seed and len(a.info["superclasses"]) == 20


def test_blobs_superclasses_and_parameters():
    spec = BlobsSpec(per_class={"train": 200, "val": 5, "test": 5})
    x, y = make_blobs(spec)["train"]
    # classes of one superclass are closer to each other than to the others: the nearest
    # class mean of most classes lies in its own superclass (CIFAR-100's structure)
    means = np.stack([x[y == c].mean(0) for c in range(spec.classes)])
    dist = ((means[:, None] - means[None]) ** 2).sum(-1) + np.diag([np.inf] * spec.classes)
    same = (dist.argmin(1) // spec.group) == (np.arange(spec.classes) // spec.group)
    assert same.mean() > 0.8
    other = make_blobs(BlobsSpec(seed=101, per_class={"train": 200, "val": 5, "test": 5}))
    assert not np.array_equal(other["train"][0], x)
    flipped = make_blobs(BlobsSpec(flip=0.5, per_class={"train": 200, "val": 5, "test": 5}))
    assert 0.4 < (flipped["train"][1] != y).mean() < 0.55  # same draws, labels redrawn
    for bad in ({"classes": 10, "group": 3}, {"flip": 1.0}, {"informative": 2, "classes": 50}):
        with pytest.raises(ValueError):
            BlobsSpec(**bad)


def test_breast_cancer_is_real_tabular_data():
    ds = load_dataset("breast-cancer")
    assert ds.class_names == ["malignant", "benign"] and ds.input_shape == (30,)
    assert (len(ds.train), len(ds.val), len(ds.test)) == (364, 91, 114)
    for split in (ds.train, ds.val, ds.test):  # stratified: ~37% malignant in each split
        assert abs(split.y.float().mean().item() - 357 / 569) < 0.02
    assert ds.info["source_files"][0].endswith("breast_cancer.csv")


# --------------------------------------------------------------------------- regime


def test_confidence_and_accuracy():
    z = np.array([[2.0, 0.0, 0.0], [0.0, 0.0, 3.0]])
    conf, acc = confidence_and_accuracy(z, np.array([0, 1]))
    p = np.exp([2.0, 3.0]) / (np.exp([2.0, 3.0]) + np.array([2.0, 2.0]))
    assert conf == pytest.approx(p.mean()) and acc == 0.5
    # multi-label: per task p = sigmoid(z), confidence max(p, 1 - p)
    conf, acc = confidence_and_accuracy(np.array([[0.0, 2.0], [-2.0, 0.0]]), np.array([[1, 0], [0, 1]]))  # fmt: skip
    s = 1 / (1 + math.exp(-2))
    assert conf == pytest.approx((0.5 + s + s + 0.5) / 4) and acc == pytest.approx(1 / 4)
    with pytest.raises(ValueError, match="expected"):
        confidence_and_accuracy(np.zeros((3, 2)), np.zeros(2))


def _calibration(gap: float, noise: float, seed: int, diffs=None) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    acc = 0.8 + 0.01 * rng.standard_normal(SEEDS)
    conf = acc + (np.asarray(diffs) if diffs is not None else gap + noise * rng.standard_normal(SEEDS))  # fmt: skip
    return pd.DataFrame({"seed": range(SEEDS), "confidence": conf, "accuracy": acc})


def _ece_frame(datasets, protocol="fair") -> pd.DataFrame:
    rows = [
        result_row(ds, "ce", protocol, s, "test", "ece_15", 0.05 + 0.01 * i + 0.001 * s)
        for i, ds in enumerate(datasets)
        for s in range(SEEDS)
    ]
    df = pd.DataFrame(rows).reindex(columns=RESULT_COLUMNS).astype(object).fillna("").astype(str)
    return normalise_results(df)


def test_regimes_state_the_direction_only_when_decided():
    cal = {
        "over": _calibration(0.08, 0.01, 1),
        "under": _calibration(-0.05, 0.01, 2),
        "flat": _calibration(0.0, 0.02, 3),
        # p = 0.035: decided alone, not after Holm over 4 (third smallest: x 2)
        "tiny": _calibration(0, 0, 4, diffs=[0.01, 0.018, 0.001, 0.015, 0.005]),
    }
    found = regimes(_ece_frame([*cal, "nologits"]), "fair", cal)
    pvals = {ds: sps.ttest_rel(c["confidence"], c["accuracy"]).pvalue for ds, c in cal.items()}
    adjusted = _holm(pvals)
    for ds in cal:
        assert found[ds].gap.p_adj == pytest.approx(adjusted[ds])
        assert found[ds].gap.diff == pytest.approx((cal[ds]["confidence"] - cal[ds]["accuracy"]).mean())  # fmt: skip
    assert pvals["tiny"] < 0.05 <= adjusted["tiny"]
    directions = {ds: r.direction for ds, r in found.items()}
    assert directions == {"over": OVER, "under": UNDER, "flat": NEITHER, "tiny": NEITHER, "nologits": UNKNOWN}  # fmt: skip
    over = found["over"]
    assert over.ece == pytest.approx(0.052) and over.seeds == SEEDS
    assert over.text().startswith("ce's test ECE-15 is 0.052, over-confident (confidence − accuracy Δ +0.0")  # fmt: skip
    assert found["nologits"].text() == f"ce's test ECE-15 is 0.092 ({UNKNOWN})"
    table = regime_table({"fair": found}, {"over": 10, "under": 100})
    rows = {r[1].text: [c.text for c in r] for r in table.rows}
    assert rows["over"][2] == "10" and rows["under"][2] == "100" and rows["flat"][2] == "—"
    bold = {r[1].text: r[-1].bold for r in table.rows}
    assert rows["under"][-1] == UNDER and bold == {"flat": False, "nologits": False, "over": True, "tiny": False, "under": True}  # fmt: skip
    assert rows["nologits"][3:6] == ["—", "—", "—"]
    assert regime_table({"fair": {}}, {}) is None


# --------------------------------------------------------------------------- per-dataset verdicts

#            acc    nll    brier  ece_15
GOOD = {  # COG decided better than every counterpart on NLL / ECE, cog-fc near the top
    "ce": (0.80, 0.60, 0.30, 0.08),
    "ts": (0.80, 0.50, 0.28, 0.04),
    "ms": (0.80, 0.52, 0.29, 0.05),
    "tst": (0.79, 0.55, 0.30, 0.05),
    "cog-fc": (0.80, 0.45, 0.27, 0.03),
    "cog-ts": (0.80, 0.47, 0.27, 0.03),
    "cog-ms": (0.80, 0.46, 0.27, 0.03),
}
BAD = {  # COG decided worse (cog-ms much worse), cog-fc last
    "ce": (0.80, 0.60, 0.30, 0.08),
    "ts": (0.81, 0.40, 0.25, 0.02),
    "ms": (0.81, 0.40, 0.25, 0.02),
    "tst": (0.81, 0.42, 0.26, 0.03),
    "cog-fc": (0.78, 0.70, 0.33, 0.09),
    "cog-ts": (0.81, 0.40, 0.25, 0.02),
    "cog-ms": (0.70, 0.90, 0.40, 0.12),
}
PAIRS = (("cog-fc", "ce"), ("cog-ts", "ts"), ("cog-ms", "ms"))


def _noise(dataset: str, method: str) -> np.ndarray:
    return 0.004 * np.random.default_rng(sum(map(ord, dataset + method))).standard_normal(SEEDS)


def _claims_frame(cells: dict, seeds: int = SEEDS) -> pd.DataFrame:
    rows = []
    for ds, means in cells.items():
        for method, values in means.items():
            for seed, off in enumerate(_noise(ds, method)[:seeds]):
                for metric, mean in zip(METRICS, values, strict=True):
                    rows.append(result_row(ds, method, "fair", seed, "test", metric, mean + off))
    df = pd.DataFrame(rows).reindex(columns=RESULT_COLUMNS).astype(object).fillna("").astype(str)
    return normalise_results(df)


def _reference(cells: dict) -> dict:
    """Every COG-vs-counterpart verdict of the two datasets: scipy, Holm by hand."""
    pvals, diffs = {}, {}
    for ds, means in cells.items():
        for a, b in PAIRS:
            for j, metric in enumerate(METRICS):
                va, vb = means[a][j] + _noise(ds, a), means[b][j] + _noise(ds, b)
                pvals[(ds, a, b, metric)] = sps.ttest_rel(va, vb).pvalue
                diffs[(ds, a, b, metric)] = float(np.mean(va - vb))
    out = {}
    for key, p in _holm(pvals).items():
        good = (diffs[key] > 0) == (key[3] == "acc")
        out[key] = ("better" if good else "worse") if p < 0.05 else "undecided"
    return out


def test_each_claim_names_the_datasets_where_it_holds_and_where_it_does_not():
    cells = {"good": GOOD, "bad": BAD}
    df = _claims_frame(cells)
    fams = families(df, "fair", None)
    verdicts = {(c.dataset, c.a, c.b, c.metric): c.verdict for c in fams["cog"]}
    ref = _reference(cells)
    assert verdicts == ref
    on = {ds: {v for k, v in ref.items() if k[0] == ds} for ds in cells}
    assert "worse" not in on["good"] and "better" in on["good"] and "worse" in on["bad"]
    judged = judge_claims(df, "fair", fams, {"good": 100, "bad": 10})
    c1, c2, c3, c4, c5, c6 = judged
    assert c1.judgement == MIXED
    assert c1.per_dataset["good"][0] == HOLDS and c1.per_dataset["bad"][0] == FAILS
    # the evidence quotes paired intervals: the decided losses where it does not hold
    worse = [c for c in fams["cog"] if c.dataset == "bad" and c.verdict == "worse"]
    worst = min(worse, key=lambda c: c.test.p_adj)  # the most clearly decided comes first
    assert c1.per_dataset["bad"][1].startswith(f"worse: {worst.a} vs {worst.b} ")
    assert worst.test.text() in c1.per_dataset["bad"][1]
    assert c1.per_dataset["bad"][1].endswith(f"; {len(worse) - 2} more")
    assert c1.per_dataset["good"][1].startswith("better: ") and "[" in c1.per_dataset["good"][1]
    where = c1.where()
    assert (
        where.startswith("does not hold on bad (worse: ") and "; holds on good (better: " in where
    )
    # the ranking claim per dataset: cog-fc first on good, sixth on bad (cog-ms last)
    assert c3.judgement == MIXED and c3.per_dataset == {
        "bad": (FAILS, "place 6 of 7"),
        "good": (HOLDS, "place 1 of 7"),
    }
    # many classes: only the dataset with >= 100 classes is judged
    assert set(c6.per_dataset) == {"good"} and c6.judgement == c6.per_dataset["good"][0]
    assert c4.judgement == NOT_TESTED and c5.judgement == NOT_TESTED and not c4.per_dataset
    assert c2.per_dataset and set(c2.per_dataset) <= {"good", "bad"}
    # the verdict: one line per claim naming both datasets, and an overall sentence
    sec = verdict_section(df, {"fair": fams}, {"fair": judged}, ["bad", "good"])
    answers = [_text(i) for i in sec.blocks[0].items]
    bad = "mixed" if "better" in on["bad"] else "no"
    assert answers[0].startswith(f"Does COG help on bad? fair protocol: {bad} — ")
    assert answers[1].startswith("Does COG help on good? fair protocol: yes — ")
    said = {"no": "does not help on bad", "mixed": "is mixed on bad"}[bad]
    assert answers[2].startswith(
        f"Overall, fair protocol: against its post-hoc counterpart COG helps on good and {said} ("
    )
    line = _text(sec.blocks[1].items[0])
    assert line.startswith(
        "fair: “COG variants match or beat their post-hoc counterparts” — mixed: does not hold on bad ("  # fmt: skip
    )
    assert "; holds on good (better: " in line and line.endswith("(Holm); budget-bound (table).")
    table = per_dataset_table(judged, "fair")
    cells_ = {(r[0].text, r[1].text): (r[2].text, r[3].text) for r in table.rows}
    assert cells_[("C1", "bad")][0] == FAILS and cells_[("C3", "good")] == (HOLDS, "place 1 of 7")
    assert ("C5", "good") not in cells_ and "C6: Post-hoc matrix scaling" in table.notes[0]


def test_undecided_and_overall_rules():
    one = _claims_frame({"good": GOOD, "bad": BAD}, seeds=1)
    fams = families(one, "fair", None)
    c1 = judge_claims(one, "fair", fams, {})[0]
    assert c1.judgement == UNDECIDED
    assert c1.per_dataset["good"] == (UNDECIDED, "12 comparisons, none testable")
    # undecided with seeds: the closest comparison is quoted with its Holm p
    close = {k: tuple(v + (0.002 if k.startswith("cog") else 0) for v in vals) for k, vals in GOOD.items()}  # fmt: skip
    close = {k: (v[0] - 0.004, *v[1:]) if k.startswith("cog") else v for k, v in close.items()}
    df = _claims_frame({"close": {**close, **{m: GOOD[m] for m in ("ce", "ts", "ms")}}})
    fams = families(df, "fair", None)
    if all(c.verdict == "undecided" for c in fams["cog"]):
        word, ev = judge_claims(df, "fair", fams, {})[0].per_dataset["close"]
        assert word == UNDECIDED and ev.startswith("none decided of 12; closest ")
        assert "Holm p" in ev and "[" in ev
    assert overall([]) == NOT_TESTED and overall([UNDECIDED]) == UNDECIDED
    assert overall([HOLDS, UNDECIDED]) == HOLDS and overall([FAILS, UNDECIDED]) == FAILS
    assert overall([HOLDS, FAILS, UNDECIDED]) == MIXED


def test_report_states_the_regime_and_the_verdict_per_dataset(tmp_path):
    """A synthetic bench folder: ce over-confident on `good`, under-confident on `bad`
    (saved test logits), the verdict and the regime table say so."""
    out = tmp_path / "bench"
    out.mkdir()
    cells = {"good": GOOD, "bad": BAD}
    df = _claims_frame(cells)
    rows = df.astype({"seed": str, "value": str}).to_dict("records")
    write_csv(out / "results.csv", RESULT_COLUMNS, rows)
    runs, rng = [], np.random.default_rng(0)
    for ds, scale in (("good", 3.0), ("bad", 0.3)):  # sharp logits / flat logits
        for seed in range(SEEDS):
            labels = rng.integers(0, 10, 400)
            right = rng.random(400) < 0.8  # 80% correct whatever the sharpness
            top = np.where(right, labels, (labels + 1) % 10)
            z = scale * (rng.normal(size=(400, 10)) * 0.3 + 4 * np.eye(10)[top])
            run_dir = Path("runs") / "fair" / ds / "ce" / f"seed{seed}"
            config = {"method": "ce", "dataset": ds, "seed": seed, "task": "multiclass"}
            write_run(out / run_dir, config, {"acc": 0.8}, {"acc": 0.8}, logits=(z.astype(np.float32), labels))  # fmt: skip
            runs.append({"dataset": ds, "method": "ce", "protocol": "fair", "seed": seed,
                         "status": "complete", "run_dir": str(run_dir)})  # fmt: skip
    write_csv(out / "runs.csv", RUN_COLUMNS, runs)
    meta = {"datasets": {"good": {"num_classes": 100}, "bad": {"num_classes": 10}}}
    (out / "bench.json").write_text(json.dumps(meta))
    build_report(out)
    md = (out / "report.md").read_text()
    verdict = md.split("## Verdict")[1].split("\n## ")[0]
    assert "Does COG help on good? fair protocol: yes" in verdict
    good = verdict.split("Does COG help on good?")[1].split("\n")[0]
    bad = verdict.split("Does COG help on bad?")[1].split("\n")[0]
    assert re.search(r"ce's test ECE-15 is 0\.0[78]\d, over-confident \(confidence − accuracy Δ \+", good)  # fmt: skip
    assert ", under-confident (confidence − accuracy Δ -" in bad
    assert "Overall, fair protocol: against its post-hoc counterpart COG" in verdict
    assert "**What there was to calibrate**" in verdict and "| fair | good | 100 |" in verdict
    assert "— mixed: does not hold on bad (" in verdict
    claims = md.split("## The paper's claims at this scale")[1].split("\n## ")[0]
    assert "**Claims per dataset, fair protocol**" in claims
    assert '<a id="claims-datasets-fair"></a>' in claims
