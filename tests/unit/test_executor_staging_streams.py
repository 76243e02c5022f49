"""Two executor details the torch engine's benchmark rests on (CPU backend): a batch written
straight into its pinned slot (``PreparedBatch.staging``) is committed without a copy and
gives the same answer, and each arena keeps one compute stream (``StreamSet.compute_for``)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline import executor_commit as executor_mod  # (the real commit path stages)
from pipeline.config import ExecutorConfig
from pipeline.device import Backend, StreamSet
from pipeline.executor import GpuExecutor
from pipeline.models import digits


@pytest.fixture
def ex():
    e = GpuExecutor(ExecutorConfig(backend="numpy", buckets=(1, 4, 8), max_in_flight=3))
    e.load_model("digits", "digits")
    yield e
    e.close()


def test_a_batch_written_into_its_slot_equals_a_copied_one(ex, monkeypatch):
    _, _, xte, _ = digits.load_split()
    rows = xte[:5]
    want = ex.infer("digits", rows)
    copies = []
    real = executor_mod.stage

    def counting(dst, x, n):
        copies.append(x is not None and x.ctypes.data != dst.ctypes.data)
        real(dst, x, n)

    monkeypatch.setattr(executor_mod, "stage", counting)
    p = ex.prepare("digits", len(rows))
    view = p.staging()
    assert view.shape == rows.shape and view.dtype == rows.dtype
    view[:] = rows
    got = ex.commit(p, view).wait(10)
    np.testing.assert_array_equal(got, want)
    assert copies == [False]  # staged in place: no host copy
    # the padding rows of the bucket (5 -> 8) are zeroed even when the caller staged
    p = ex.prepare("digits", 5)
    bucket_rows = p.slot.view(0, p.plan.input_spec.shape, p.plan.input_spec.dtype)
    bucket_rows[:] = 255
    p.staging()[:] = rows
    np.testing.assert_array_equal(ex.commit(p, p.staging()).wait(10), want)
    assert not bucket_rows[5:].any() and (bucket_rows[:5] == rows).all()
    assert ex.pool.stats().bytes_in_use == 0 and ex.ring.available() == ex.ring.slots
    naive = GpuExecutor(ExecutorConfig(backend="numpy", buckets=(8,), mode="naive"))
    naive.load_model("digits", "digits")
    assert naive.prepare("digits", 5).staging() is None
    naive.close()


def test_each_arena_keeps_its_compute_stream_and_arenas_spread_over_streams():
    s = StreamSet(Backend("numpy"), 3)
    first = [s.compute_for(ptr) for ptr in (100, 200, 300)]
    assert len({x.name for x in first}) == 3  # three in-flight arenas, three streams
    for _ in range(5):
        assert [s.compute_for(ptr).name for ptr in (300, 100, 200)] == [
            first[2].name,
            first[0].name,
            first[1].name,
        ]
    assert s.compute_for(400).name == first[0].name  # the fourth wraps round


def test_batch_wait_is_sleep_or_spin_and_spin_answers_as_sleep():
    with pytest.raises(ValueError):
        ExecutorConfig(batch_wait="poll")  # type: ignore[arg-type]
    assert ExecutorConfig().batch_wait == "sleep"
    _, _, xte, _ = digits.load_split()
    got = {}
    for wait in ("sleep", "spin"):
        e = GpuExecutor(ExecutorConfig(backend="numpy", buckets=(1, 8), batch_wait=wait))
        e.load_model("digits", "digits")
        got[wait] = e.commit(e.prepare("digits", 6), xte[:6]).wait()
        e.close()
    np.testing.assert_array_equal(got["sleep"], got["spin"])
