"""``executor.arenas: kept`` on numpy: every batch of a model gets one of the arenas its model
keeps (sized for its largest bucket), so after the warm-up the arenas' addresses -- which a
CUDA graph is bound to -- never change; there are never more than the batches in flight;
the answers are the pooled executor's; a failed commit and an unloaded model give them back."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from pipeline.config import ExecutorConfig
from pipeline.errors import InvalidInput
from pipeline.executor import GpuExecutor
from pipeline.models import digits
from tests.threads import all_at_once

BUCKETS = (1, 2, 4, 8, 16)


def _executor(arenas: str) -> GpuExecutor:
    ex = GpuExecutor(
        ExecutorConfig(backend="numpy", buckets=BUCKETS, max_in_flight=4, arenas=arenas)
    )
    ex.load_model("digits", "digits")
    ex.warmup()
    return ex


@pytest.fixture
def kept():
    ex = _executor("kept")
    yield ex
    ex.close()


def test_threads_get_the_pooled_answers_from_at_most_max_in_flight_fixed_arenas(kept):
    pooled = _executor("pooled")
    _, _, xte, _ = digits.load_split()
    chunks = [xte[i : i + 1 + i % 16] for i in range(0, 400, 10)]  # every bucket
    want = [pooled.infer("digits", c) for c in chunks]
    pooled.close()
    largest = kept.models["digits"].engine.plan(BUCKETS[-1], "image").arena_bytes
    seen: set[int] = set()
    got: dict[int, np.ndarray] = {}
    lock = threading.Lock()

    def worker(k: int) -> None:
        for i in range(k, len(chunks), 8):
            p = kept.prepare("digits", len(chunks[i]))
            assert p.reservation.nbytes >= largest  # sized for the largest bucket
            with lock:
                seen.add(p.reservation.ptr)
            got[i] = kept.commit(p, chunks[i]).wait(30)

    all_at_once(8, worker)
    for i, w in enumerate(want):
        np.testing.assert_array_equal(got[i], w)
    n = kept.mode.kept.count("digits", "image")
    assert 1 <= n <= kept.ring.slots and len(seen) <= n  # no address past the kept ones
    # idle: the kept arenas stay held (counted in use), the staging slots all free
    assert kept.pool.stats().bytes_in_use >= n * largest
    assert kept.ring.available() == kept.ring.slots


def test_one_batch_at_a_time_reuses_one_arena(kept):
    _, _, xte, _ = digits.load_split()
    ptrs = set()
    for n in (1, 3, 16, 7, 2, 16, 1):
        p = kept.prepare("digits", n)
        ptrs.add(p.reservation.ptr)
        kept.commit(p, xte[:n]).wait(30)
    assert len(ptrs) == 1


def test_a_failed_commit_and_an_unloaded_model_give_the_arenas_back(kept):
    in_use = kept.pool.stats().bytes_in_use
    p = kept.prepare("digits", 3)
    with pytest.raises(InvalidInput):
        kept.commit(p, np.zeros((3, 8, 8, 3), np.uint8))  # wrong channel count
    assert p.reservation.released and p.reservation.release() is False  # once only
    assert kept.pool.stats().bytes_in_use == in_use  # lent back, still kept
    held = kept.prepare("digits", 2)  # lent while the model is unloaded
    kept.unload("digits")
    assert kept.mode.kept.count("digits", "image") == 0
    held.release()  # its model is gone: back to the pool
    assert kept.pool.stats().bytes_in_use == 0


def test_pooled_is_the_default():
    assert ExecutorConfig().arenas == "pooled"
