"""The model benchmark's Ferry harness on the CPU backend: the rows it times carry the
host's cost per batch, the driving thread's share of the process's CPU time, and a
warmed-up executor captures and runs nothing eagerly beyond its steps."""

from __future__ import annotations

import numpy as np

from benchmarks import bench_models_harness as H
from pipeline.config import ExecutorConfig
from pipeline.executor import GpuExecutor


def test_ferry_rows_carry_the_host_cost_per_batch():
    ex = GpuExecutor(ExecutorConfig(backend="numpy", buckets=(4,), max_in_flight=H.IN_FLIGHT))
    ex.load_model("digits", "digits")
    ex.warmup()
    drivers = {}
    facts = {}
    for label, kw in {"staged": {}, "copy": {"staged": False}, "bounded": {"bounded": True}}.items():
        drivers[label], facts[label] = H.ferry_driver(ex, "digits", 4, **kw)
    before = ex.stats()["batches"]
    out = H.interleaved(drivers, 4, 0.3)
    assert set(out) == set(drivers)
    for label, t in out.items():
        assert t["img_s"] > 0 and t["spread"] >= 0
        host, cpu = t["host_us_per_batch"], t["cpu_us_per_batch"]
        assert 0 < host <= cpu * 1.001 + 1.0, (label, host, cpu)  # one thread of the process
        f = facts[label]()
        assert f["eager_runs_timed"] > 0 and f["captures_timed"] == 0  # numpy: no graphs
    assert ex.stats()["batches"] > before and ex.stats()["in_flight"] == 0
    assert ex.pool.stats().bytes_in_use == 0 and ex.ring.available() == ex.ring.slots
    ex.close()


def test_a_driver_without_a_host_clock_reports_none():
    n = [0]
    d = H.Driver(lambda: n.__setitem__(0, n[0] + 1), lambda: None)
    t = H.timed(d, 1, 0.06)
    assert t["host_us_per_batch"] is None and t["cpu_us_per_batch"] > 0 and n[0] > 0
    assert np.isfinite(t["img_s"])
