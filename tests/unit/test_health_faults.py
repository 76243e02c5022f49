"""Fault injection (pipeline/faults.py) and replica health (pipeline/health.py) on the
executor's CPU path: what each injected fault does to the batch it hits, to the pool and to
the replica's health."""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from pipeline.config import ExecutorConfig, PipelineConfig
from pipeline.errors import DeviceError, ResourceExhausted, Unavailable
from pipeline.executor import GpuExecutor
from pipeline.faults import FaultConfig, resolve
from pipeline.health import HealthConfig, ReplicaHealth, as_ferry_error


def _executor(*faults: dict, clock=None, **extra) -> GpuExecutor:
    cfg = ExecutorConfig(
        backend="numpy",
        buckets=(1, 2, 4),
        max_in_flight=2,
        pool_limit_bytes=64 << 20,
        faults={"faults": list(faults), **extra},
    )
    ex = GpuExecutor(cfg) if clock is None else GpuExecutor(cfg, clock=clock)
    ex.load_model("digits", "digits")
    ex.warmup()
    return ex


def _batch(n: int = 3) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 255, (n, 8, 8, 1), dtype=np.uint8)


def _run(ex: GpuExecutor, n: int = 3):
    return ex.commit(ex.prepare("digits", n), _batch(n)).wait(10)


def test_no_fault_by_default():
    assert not PipelineConfig().executor.faults.enabled
    ex = _executor()
    for _ in range(5):
        assert _run(ex).shape == (3, 10)
    assert ex.device_error is None and ex.faults.injected == {}


def test_oom_in_the_middle_of_a_batch_fails_only_that_batch_and_returns_the_pool():
    ex = _executor({"kind": "oom_commit", "at_batch": 2})
    baseline = ex.pool.bytes_in_use
    slots = ex.ring.available()
    good = _run(ex)
    with pytest.raises(ResourceExhausted) as info:
        _run(ex)
    assert "injected" in info.value.fields["detail"]
    assert ex.pool.bytes_in_use == baseline and ex.ring.available() == slots
    np.testing.assert_array_equal(_run(ex), good)  # the next batch is served as before
    assert ex.device_error is None  # out of memory does not poison the device
    assert ex.stats()["failed"] == 1


def test_oom_on_reservation_fails_before_any_work():
    ex = _executor({"kind": "oom_reserve", "at_batch": 1, "times": 2})
    baseline, slots = ex.pool.bytes_in_use, ex.ring.available()
    for _ in range(2):
        with pytest.raises(ResourceExhausted):
            ex.prepare("digits", 3)
        assert ex.pool.bytes_in_use == baseline and ex.ring.available() == slots
    assert _run(ex).shape == (3, 10)
    # warm-up ran the smallest bucket (on the CPU the other two are only planned), then _run
    assert ex.stats()["batches"] == 1 + 1


def test_device_error_poisons_the_executor_and_fails_health():
    ex = _executor({"kind": "device_error", "at_batch": 2})
    health = ReplicaHealth(HealthConfig(), ex)
    health.set_ready()
    baseline = ex.pool.bytes_in_use
    _run(ex)
    health.check()
    assert health.ready
    for _ in range(3):  # sticky, as a lost CUDA context is
        with pytest.raises(DeviceError):
            _run(ex)
    assert ex.pool.bytes_in_use == baseline
    with pytest.raises(DeviceError):
        ex.probe()
    assert not health.ready
    with pytest.raises(Unavailable) as info:
        health.check()
    assert "device error" in info.value.fields["reason"]
    with pytest.raises(Unavailable) as info:
        health.admit()
    assert info.value.http_status == 503 and info.value.fields["retry_after_s"] == 1.0


def test_a_stalled_batch_wedges_the_scheduler_and_fails_health(clock, monkeypatch):
    """On a fake clock shared by the executor and the health (real sleeps against a 0.5 s
    stall_after_s raced a loaded machine), and with the injected hang held until the test
    lets it go (the real 1.5 s one had to outlast the checks)."""
    from pipeline import executor_commit

    stalled, release = threading.Event(), threading.Event()

    def hang(seconds: float) -> None:  # the stall fault's sleep: hung until released
        assert seconds == 1.5
        stalled.set()
        release.wait(10)

    monkeypatch.setattr(executor_commit, "time", SimpleNamespace(sleep=hang))
    ex = _executor({"kind": "stall", "at_batch": 1, "stall_s": 1.5}, clock=clock)
    queued = [0]
    health = ReplicaHealth(HealthConfig(stall_after_s=0.5), ex, lambda: queued[0], clock=clock)
    health.set_ready()
    clock.advance(0.6)  # idle for longer than stall_after_s: not a stall
    health.check()
    t = threading.Thread(target=_run, args=(ex,))
    t.start()  # the CPU path finishes inline: this thread holds the stalled batch
    try:
        assert stalled.wait(10) and ex.in_flight == 1
        clock.advance(0.2)
        queued[0] = 5
        health.check()  # 0.2 s without progress: still healthy
        clock.advance(0.6)
        with pytest.raises(Unavailable) as info:
            health.check()
        assert "wedged" in info.value.fields["reason"]
    finally:
        release.set()
        t.join(5)
    assert not t.is_alive()
    assert health.state == "draining"  # a drain is for good: Serve replaces the replica


def test_busy_but_progressing_is_healthy(clock):
    """Batches keep finishing, 0.1 s apart, for 0.8 s with work always queued: healthy
    under a 0.3 s stall_after_s -- on a fake clock shared by the executor and the health
    (with real sleeps a loaded machine could stretch a gap past 0.3 s)."""
    ex = _executor(clock=clock)
    health = ReplicaHealth(HealthConfig(stall_after_s=0.3), ex, lambda: 7, clock=clock)
    health.set_ready()
    for _ in range(8):
        _run(ex)
        assert ex.last_progress == clock()  # a batch finished now: progress
        health.check()
        clock.advance(0.1)
    assert health.ready
    clock.advance(0.3)  # (the same replica with no batch for longer: wedged)
    assert not health.ready


def test_not_ready_while_warming_then_ready():
    ex = _executor()
    health = ReplicaHealth(HealthConfig(), ex)
    assert not health.ready and health.state == "warming"
    health.check()  # warming is not a failure: Serve's start waits on the constructor
    health.set_ready()
    assert health.ready
    health.drain("told to")
    assert not health.ready
    with pytest.raises(Unavailable):
        health.admit()


def test_warmup_delay_and_the_environment_override():
    ex = _executor(warmup_delay_s=0.3)
    t0 = time.perf_counter()
    ex.warmup()
    assert time.perf_counter() - t0 >= 0.3
    env = json.dumps({"faults": [{"kind": "stall", "at_batch": 4}]})
    assert resolve(FaultConfig(), env).faults[0].at_batch == 4
    assert resolve(FaultConfig(), None) == FaultConfig()


def test_failures_are_classified():
    assert isinstance(as_ferry_error(MemoryError("x")), ResourceExhausted)

    class OutOfMemoryError(Exception):  # cupy's name
        pass

    assert isinstance(as_ferry_error(OutOfMemoryError("y")), ResourceExhausted)
    assert isinstance(
        as_ferry_error(RuntimeError("cudaErrorMemoryAllocation: out of memory")), ResourceExhausted
    )
    assert isinstance(as_ferry_error(RuntimeError("cudaErrorIllegalAddress")), DeviceError)


def test_a_replica_lost_under_a_call_is_a_retryable_503():
    from ray.exceptions import ActorDiedError
    from ray.serve.exceptions import RayServeException

    from deployments.http_errors import unwrap

    wrapped = RayServeException("an upstream actor died")  # how Serve wraps a chained call's
    wrapped.__cause__ = ActorDiedError()
    for exc in (ActorDiedError(), wrapped):
        err = unwrap(exc)
        assert isinstance(err, Unavailable) and err.fields["retry_after_s"] == 1
    assert not isinstance(unwrap(RuntimeError("x")), Unavailable)


def test_serve_health_and_shutdown_options_pass_through():
    from pipeline.config import DeploymentOptions

    opts = DeploymentOptions(health_check_period_s=1, graceful_shutdown_timeout_s=5).serve_options()
    assert opts["health_check_period_s"] == 1 and opts["graceful_shutdown_timeout_s"] == 5
    assert "health_check_timeout_s" not in DeploymentOptions().serve_options()
