"""The fields code reads of an error are typed attributes that survive pickling (Ray pickles
exceptions across a Serve hop): ``reason`` of QueueFull / DeadlineExceeded / Unavailable,
read by the inference stage's rejection metric, and ``InvalidInput.node``, read by the ONNX
importer's load-time refusal."""

from __future__ import annotations

import asyncio
import pickle

import numpy as np
import pytest

from pipeline import queue_budget
from pipeline.config import PipelineConfig
from pipeline.errors import DeadlineExceeded, InvalidInput, ModelRefused, QueueFull, Unavailable
from pipeline.graph import Graph
from pipeline.ops import NORMALIZE
from pipeline.queue_budget import RateMeter
from pipeline.stages import inference
from pipeline.stages.build import build_inference
from pipeline.stages.messages import HostRows, RequestMeta


def _hop(e):
    return pickle.loads(pickle.dumps(e))


def test_reason_is_typed_and_survives_pickling():
    budget = None
    try:
        queue_budget.admit(0.0, 100, RateMeter(rate=10.0, samples=3), None, 1.0, 2.0, "r", "gpu")
    except QueueFull as exc:
        budget = exc
    assert budget is not None
    late = queue_budget.timed_out(2.0, 1.0, 3.0, "r2", "ingress")
    for err, reason in ((budget, "queue_budget"), (late, "queue_timeout")):
        back = _hop(err)
        assert back == err and back.reason == reason and back.fields["reason"] == reason
        assert back.retry_after_s == err.retry_after_s
    # a plain full queue: the metric's label, and the detail as it was (no reason field)
    full = _hop(QueueFull("inference queue is full", queue_depth=4, retry_after_s=2.0))
    assert full.reason == "queue_full" and "reason" not in full.fields
    assert list(full.fields) == ["retry_after_s", "queue_depth"]
    dead = _hop(DeadlineExceeded("late", request_id="r", waited_ms=1.0))
    assert dead.reason == "deadline" and dead.fields == {"waited_ms": 1.0, "request_id": "r"}
    drain = _hop(Unavailable("draining", reason="device error: x", retry_after_s=4.0))
    assert drain.reason == "device error: x" and drain.retry_after_s == 4.0
    assert Unavailable("draining").reason is None


def test_node_is_typed_named_once_and_survives_pickling():
    bad = Graph("bad", "image", (8, 8, 5), "uint8")  # five channels: not an image
    bad.set_outputs(bad.add(NORMALIZE, ["image"], "normalize"))
    with pytest.raises(InvalidInput) as info:
        bad.prepare(1)
    back = _hop(info.value)
    assert back.node == "normalize" and back.fields["node"] == "normalize"
    back.at_node("outer")  # the innermost node named stays
    assert back.node == "normalize"
    assert InvalidInput("x").node is None and "node" not in InvalidInput("x").fields
    refused = _hop(ModelRefused("no", node="conv1", op="Conv"))
    assert refused.node == "conv1" and refused.fields == {"node": "conv1", "op": "Conv"}


def _stage(**batching) -> inference.InferenceStage:
    return build_inference(
        PipelineConfig.model_validate(
            {
                "placement": "four_stage",
                "models": [{"name": "digits", "arch": "digits"}],
                "executor": {"backend": "numpy", "buckets": [1, 8], "max_in_flight": 2},
                "batching": {"max_wait_ms": 5, **batching},
            }
        )
    )


def test_the_stage_counts_each_refusal_by_its_typed_reason(monkeypatch):
    counted: list[str] = []
    monkeypatch.setattr(inference.metrics, "count_rejected", counted.append)
    stage = _stage(queue_policy={"timeout_ms": 1000})
    stage.scheduler.queue.rates["digits"] = RateMeter(rate=10.0, samples=3)
    rows = HostRows(2, [0] * 20 + [1] * 20, data=np.zeros((40, 8, 8, 1), np.uint8))
    meta = [RequestMeta("a"), RequestMeta("b")]
    out = asyncio.run(stage.logits("digits", rows, meta))
    assert set(out.errors) == {1} and counted == ["queue_budget"]

    counted.clear()
    stage = _stage(max_queue=2)
    rows = HostRows(3, [0, 1, 2], data=np.zeros((3, 8, 8, 1), np.uint8))
    meta = [RequestMeta("a"), RequestMeta("b"), RequestMeta("c")]
    out = asyncio.run(stage.logits("digits", rows, meta))
    assert set(out.errors) == {2} and counted == ["queue_full"]

    counted.clear()
    stage = _stage()
    rows = HostRows(1, [0], data=np.zeros((1, 8, 8, 1), np.uint8))
    gone = [RequestMeta("late", deadline=0.0)]  # (epoch 0: long past when it is queued)
    out = asyncio.run(stage.logits("digits", rows, gone))
    assert isinstance(out.errors[0], DeadlineExceeded) and counted == ["deadline"]
