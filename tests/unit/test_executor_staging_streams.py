"""Executor details the torch engine's benchmark rests on (CPU backend): a batch written
straight into its pinned slot (``PreparedBatch.staging``) is committed without a copy and
gives the same answer, and each arena keeps one compute stream (``StreamSet.compute_for``).
And how device rows are grouped into copies (``row_runs``; the copies themselves are run
in tests/gpu/test_executor_gpu.py)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline import executor_commit as executor_mod  # (the real commit path stages)
from pipeline.config import ExecutorConfig
from pipeline.device import Backend, StreamSet
from pipeline.executor import GpuExecutor
from pipeline.executor_batch import row_runs
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

    def counting(dst, x, n, given=None):
        copies.append(x is not None and x.ctypes.data != dst.ctypes.data)
        real(dst, x, n, given)

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


def test_rows_consecutive_in_the_batch_and_in_memory_are_one_copy():
    row = 150528  # a 224 x 224 x 3 uint8 row
    a, b = 1 << 30, 1 << 31  # two fits' batches
    rows = [(0, a), (1, a + row), (2, a + 2 * row), (3, b), (4, b + row), (5, a + 3 * row)]
    assert row_runs(rows, row) == [(0, a, 3), (3, b, 2), (5, a + 3 * row, 1)]


def test_a_gap_in_the_batch_or_in_memory_starts_a_new_copy():
    row = 64
    # index 2 missing (a host row beside device rows), then rows in reverse memory order
    rows = [(0, 1000), (1, 1064), (3, 1128), (4, 2000), (5, 1936)]
    assert row_runs(rows, row) == [(0, 1000, 2), (3, 1128, 1), (4, 2000, 1), (5, 1936, 1)]
    assert row_runs([], row) == []
