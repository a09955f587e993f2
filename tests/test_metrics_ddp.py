"""Multi-process metrics: StreamingMetrics.sync(), TemperatureScaledNLL.sync() and the
torchmetrics adapter, 2 CPU processes.

Each process (gloo backend on localhost) sees a different, unequal shard; after ``sync()``
(or torchmetrics' own synchronisation) every process must report the single-process
metrics of the union of the shards.
"""

from __future__ import annotations

import json
import socket
import time

import pytest
import torch
import torch.multiprocessing as mp

from cogcal.metrics import (
    StreamingMetrics,
    TemperatureScaledNLL,
    as_torchmetric,
    evaluate,
    temperature_scaled_nll,
)


def _worker(rank: int, world: int, port: int, out: str) -> None:
    """One process: its own shard, then sync() / torchmetrics' synchronisation."""
    import datetime

    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=30),
    )
    try:
        z, y, zb, yb = _data()
        part = slice(0, CUT) if rank == 0 else slice(CUT, 500)  # unequal shards
        res = {}

        s = StreamingMetrics(n_bins=(10, 15), classwise=True)
        for i in range(part.start, part.stop, 64):
            s.update(z[i : min(i + 64, part.stop)], y[i : min(i + 64, part.stop)])
        res["local"] = s.compute()
        s.sync()
        res["multiclass"] = s.compute()
        s.sync()  # a second call without updates in between changes nothing
        res["multiclass_again"] = s.compute()
        s.unsync()
        res["unsynced"] = s.compute()

        b = StreamingMetrics(task="binary", n_bins=15)
        b.update(zb[part], yb[part])
        b.sync()
        res["binary"] = b.compute()

        ts = TemperatureScaledNLL()
        ts.update(z[part], y[part])
        res["nll_ts"] = ts.sync().compute()
        empty = TemperatureScaledNLL()  # rank 1 sees no sample
        if rank == 0:
            empty.update(z[:CUT], y[:CUT])
        res["nll_ts_rank0_only"] = empty.sync().compute()

        # rank 1 sees no data at all and does not know K: sync() allocates its state
        e = StreamingMetrics(n_bins=15)
        if rank == 0:
            e.update(z[:CUT], y[:CUT])
        e.sync()
        res["rank0_only"] = e.compute()

        t = as_torchmetric(task="multiclass", num_classes=4, n_bins=(10, 15), classwise=True)
        t.update(z[part], y[part])
        res["torchmetrics"] = {k: float(v) for k, v in t.compute().items()}
        tb = as_torchmetric(task="binary", n_bins=15)
        tb.update(zb[part], yb[part])
        res["torchmetrics_binary"] = {k: float(v) for k, v in tb.compute().items()}
        # every rank raises the same error (no rank is left waiting in a collective)
        errors = []
        bad = StreamingMetrics(n_bins=10 if rank == 0 else 15)
        bad.update(z[part], y[part])
        try:
            bad.sync()
        except ValueError as err:
            errors.append(str(err))
        k = 3 if rank == 0 else 4
        other = StreamingMetrics()
        other.update(z[part][:, :k], y[part] % k)
        try:
            other.sync()
        except ValueError as err:
            errors.append(str(err))
        res["errors"] = errors
        dist.barrier()
    finally:
        dist.destroy_process_group()
    with open(out.format(rank), "w") as f:
        json.dump(res, f)


CUT = 321


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _data():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(500, 4, generator=g) * 2
    y = torch.randint(0, 4, (500,), generator=g)
    zb = torch.randn(500, generator=g) * 2
    yb = torch.randint(0, 2, (500,), generator=g)
    return z, y, zb, yb


#: evaluate's keys that need every sample, so the streaming forms do not report them
ONE_SHOT = {"adaece_15", "smece", "aurc", "cwece_15"}


def _close(a: dict, b: dict, tol: float = 1e-12) -> None:
    """Streamed ``a`` equals one-shot ``b`` on every key the streaming form reports."""
    assert set(a) <= set(b)
    assert {k.split("/")[0] for k in set(b) - set(a)} <= ONE_SHOT
    for key in a:
        assert a[key] == pytest.approx(b[key], abs=tol), key


def test_two_processes_give_the_single_process_metrics(tmp_path):
    pytest.importorskip("torchmetrics")
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not available")
    # fork: the children start at once with torch and torchmetrics already imported
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    ctx = mp.start_processes(
        _worker,
        args=(2, _free_port(), str(tmp_path / "r{}.json")),
        nprocs=2,
        join=False,
        start_method=method,
    )
    deadline = time.monotonic() + 120
    try:
        while not ctx.join(timeout=1):
            assert time.monotonic() < deadline, "the two processes did not finish in time"
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    z, y, zb, yb = _data()
    ref = evaluate(z, y, n_bins=(10, 15), classwise=True)
    ref_b = evaluate(zb, yb, task="binary", n_bins=15)
    ref_0 = evaluate(z[:CUT], y[:CUT], n_bins=15)
    for r in range(2):
        res = json.loads((tmp_path / f"r{r}.json").read_text())
        part = slice(0, CUT) if r == 0 else slice(CUT, 500)
        local = evaluate(z[part], y[part], n_bins=(10, 15), classwise=True)
        _close(res["local"], local)
        _close(res["multiclass"], ref)
        _close(res["multiclass_again"], ref)
        _close(res["unsynced"], local)
        _close(res["binary"], ref_b)
        _close(res["rank0_only"], ref_0)
        _close(res["torchmetrics"], ref)
        _close(res["torchmetrics_binary"], ref_b)
        assert res["nll_ts"] == pytest.approx(temperature_scaled_nll(z, y), abs=1e-12)
        assert res["nll_ts_rank0_only"] == pytest.approx(
            temperature_scaled_nll(z[:CUT], y[:CUT]), abs=1e-12
        )
        assert len(res["errors"]) == 2, res["errors"]
        assert "different settings" in res["errors"][0]
        assert "different numbers of classes (3 to 4)" in res["errors"][1]


def test_sync_is_a_no_op_without_torch_distributed():
    z, y, _, _ = _data()
    s = StreamingMetrics(n_bins=15)
    s.update(z, y)
    before = s.compute()
    assert s.sync() is s
    assert s.compute() == before
    s.unsync()  # nothing to undo
    assert s.compute() == before
    StreamingMetrics().sync()  # no data, not initialised: still fine


def test_update_after_sync_continues_the_local_stream():
    # (single process: sync() is a no-op, so this checks the bookkeeping only)
    z, y, _, _ = _data()
    s = StreamingMetrics(n_bins=15)
    s.update(z[:200], y[:200])
    s.sync()
    s.update(z[200:], y[200:])
    _close(s.compute(), evaluate(z, y, n_bins=15))


def test_torchmetric_adapter_single_process():
    torchmetrics = pytest.importorskip("torchmetrics")
    z, y, zb, yb = _data()
    m = as_torchmetric(task="multiclass", num_classes=4, n_bins=(10, 15))
    assert isinstance(m, torchmetrics.Metric)
    for i in range(0, 500, 128):
        m.update(z[i : i + 128], y[i : i + 128])
    out = m.compute()
    assert all(isinstance(v, torch.Tensor) and v.ndim == 0 for v in out.values())
    _close({k: float(v) for k, v in out.items()}, evaluate(z, y, n_bins=(10, 15)))
    m.reset()
    m.update(z[:50], y[:50])
    _close({k: float(v) for k, v in m.compute().items()}, evaluate(z[:50], y[:50], n_bins=(10, 15)))
    # forward() returns the batch's metrics and accumulates
    m.reset()
    batch = m(z[:100], y[:100])
    _close({k: float(v) for k, v in batch.items()}, evaluate(z[:100], y[:100], n_bins=(10, 15)))
    # probabilities, multilabel with names, and the class itself
    from cogcal.metrics import CalibrationMetric

    p = CalibrationMetric(task="binary", n_bins=15, input_type="probs")
    p.update(torch.sigmoid(zb.double()), yb)
    _close({k: float(v) for k, v in p.compute().items()},
           evaluate(zb, yb, task="binary", n_bins=15), tol=1e-9)  # fmt: skip
    ml = CalibrationMetric(task="multilabel", task_names=["a", "b"], n_bins=15)
    zm, ym = torch.stack([zb, -zb], 1), torch.stack([yb, yb], 1)
    ml.update(zm, ym)
    got = {k: float(v) for k, v in ml.compute().items()}
    _close(got, evaluate(zm, ym, task="multilabel", task_names=["a", "b"], n_bins=15))


def test_torchmetric_adapter_needs_fixed_shapes():
    pytest.importorskip("torchmetrics")
    with pytest.raises(ValueError, match="num_classes"):
        as_torchmetric(task="multiclass")
    with pytest.raises(ValueError, match="task_names.*num_tasks|num_tasks.*task_names"):
        as_torchmetric(task="multilabel")
    with pytest.raises(ValueError, match="input_type"):
        as_torchmetric(task="binary", input_type="scores")
    m = as_torchmetric(task="multiclass", num_classes=3)
    with pytest.raises(ValueError, match="4 classes"):
        m.update(torch.randn(5, 4), torch.zeros(5, dtype=torch.long))


def test_streaming_metrics_is_thin_over_evaluate_state():
    # sanity: the streaming class shares evaluate's binned keys (one-shot keys aside)
    z, y, _, _ = _data()
    s = StreamingMetrics(n_bins=15, num_classes=4)
    s.update(z, y)
    assert list(s.compute()) == [k for k in evaluate(z, y, n_bins=15) if k not in ONE_SHOT]
    s = StreamingMetrics(n_bins=15, num_classes=4, classwise=True)
    s.update(z, y)
    one_shot = evaluate(z, y, n_bins=15, classwise=True)
    assert list(s.compute()) == [k for k in one_shot if k not in ONE_SHOT - {"cwece_15"}]
    assert s.compute()["cwece_15"] == pytest.approx(one_shot["cwece_15"], abs=1e-12)
