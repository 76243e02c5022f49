"""A request's rows meet the GPU queue's budget as one request (the review's finding R1, GPU
side): row k of a v2 request of N rows must not count the same request's rows 0..k-1 as
queue ahead of it, or a warm queue refuses any request of more rows than budget x rate."""

from __future__ import annotations

import asyncio

import numpy as np

from pipeline.config import PipelineConfig
from pipeline.queue_budget import RateMeter
from pipeline.stages.build import build_inference
from pipeline.stages.inference import InferenceStage
from pipeline.stages.messages import HostRows, Logits, RequestMeta


def _stage(max_wait_ms: float = 5, timeout_ms: float | None = 1000) -> InferenceStage:
    return build_inference(
        PipelineConfig.model_validate(
            {
                "placement": "four_stage",
                "models": [{"name": "digits", "arch": "digits"}],
                "executor": {"backend": "numpy", "buckets": [1, 8], "max_in_flight": 2},
                "batching": {
                    "max_wait_ms": max_wait_ms,
                    "queue_policy": {"timeout_ms": timeout_ms},
                },
            }
        )
    )


def test_a_requests_own_rows_are_not_queue_ahead_of_one_another():
    stage = _stage()
    # a warm queue that drains 10 rows/s: 40 rows ahead would be a 4 s wait
    stage.scheduler.queue.rates["digits"] = RateMeter(rate=10.0, samples=3)
    rows = HostRows(1, [0] * 40, data=np.zeros((40, 8, 8, 1), np.uint8))

    async def go() -> Logits:
        return await stage.logits("digits", rows, [RequestMeta("one")])

    out = asyncio.run(go())
    assert not out.errors, out.errors
    assert out.data is not None and out.data.shape[0] == 40


def test_a_second_request_still_sees_the_first_as_ahead():
    stage = _stage()
    stage.scheduler.queue.rates["digits"] = RateMeter(rate=10.0, samples=3)
    rows = HostRows(2, [0] * 20 + [1] * 20, data=np.zeros((40, 8, 8, 1), np.uint8))

    async def go() -> Logits:
        return await stage.logits("digits", rows, [RequestMeta("a"), RequestMeta("b")])

    out = asyncio.run(go())
    # b arrives behind a's 20 rows (2 s at 10 rows/s): refused at once, a answered whole
    assert set(out.errors) == {1} and out.errors[1].fields["reason"] == "queue_budget"
    assert out.data is not None and out.data.shape[0] == 20


def test_a_lone_request_leaves_at_once_instead_of_waiting_max_wait_ms():
    """The GPU queue's idle dispatch is fixed behaviour (batching.dispatch_when_idle is
    gone): with nothing running, one row leaves at once, not after a 10 s max_wait_ms."""
    stage = _stage(max_wait_ms=10_000, timeout_ms=None)
    reasons: list[str] = []
    on_batch = stage.scheduler.on_batch

    def seen(batch) -> None:
        reasons.append(batch.reason)
        if on_batch:
            on_batch(batch)

    stage.scheduler.on_batch = seen
    rows = HostRows(1, [0], data=np.zeros((1, 8, 8, 1), np.uint8))

    async def go() -> Logits:
        return await asyncio.wait_for(stage.logits("digits", rows, [RequestMeta("a")]), 5.0)

    out = asyncio.run(go())
    assert not out.errors and out.data is not None and out.data.shape[0] == 1
    assert reasons == ["idle"]
