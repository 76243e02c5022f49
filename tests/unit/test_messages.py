"""The typed messages between the stages (``pipeline.stages.messages``): the stamps a request
gathers on its way survive the pickling of a Serve hop, the answer's ``timings_ms`` has the
keys it always had (``hop_in``/``hop_out`` only where a Serve call reached the replica that
answered), and host rows and device rows say what they carry."""

from __future__ import annotations

import asyncio
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deployments.replica import stamp_hops
from pipeline.config import PipelineConfig
from pipeline.device import Backend
from pipeline.errors import InvalidInput, TransportError
from pipeline.imaging import encode_png
from pipeline.models.repository import model_card
from pipeline.preprocess_gpu.stage import PreprocessGpuCore
from pipeline.stages.build import build_inference
from pipeline.stages.decode import PreprocessStage
from pipeline.stages.messages import (
    Answer,
    DeviceRows,
    Encoded,
    Hop,
    HostRows,
    Logits,
    PostSpec,
    RequestMeta,
    RowTimes,
    SendTo,
    Timings,
)
from pipeline.stages.postprocess import PostprocessStage
from pipeline.transport.base import Envelope

STAGE_KEYS = ["preprocess", "queue", "gpu", "postprocess"]


def _config(placement: str = "one_process") -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "placement": placement,
            "models": [{"name": "digits", "arch": "digits"}],
            "executor": {"backend": "numpy", "buckets": [1, 8], "max_in_flight": 2},
            "batching": {"max_wait_ms": 2},
        }
    )


def _hop(x):
    return pickle.loads(pickle.dumps(x))


def test_report_without_a_hop_has_no_hop_keys():
    t = Timings(preprocess=1.0, queue=2.0, gpu=3.0, postprocess=0.5, left_coalescer=1004.0)
    got = t.report(arrived=1000.0, queued=1001.5, now=1020.0, now_wall=5e12)
    assert list(got) == [*STAGE_KEYS, "ingress", "coalesce", "hops", "total"]
    assert got["ingress"] == 4.0 and got["coalesce"] == 2.5 and got["total"] == 20.0
    assert got["hops"] == pytest.approx(20.0 - 4.0 - 6.5)
    # a hop the replica stamped but the ingress did not send (no ``sent``): not split
    t.hop = Hop(arrived=10.0, left=11.0)
    assert "hop_in" not in t.report(1000.0, 1000.0, 1020.0, 12.0)


def test_report_of_a_hop_splits_it_and_rounds():
    t = Timings(queue=2.0004, gpu=3.0, postprocess=0.5, left_coalescer=1001.0)
    t.hop = Hop(arrived=5002.5, left=5010.0, sent=5001.0)
    got = t.report(arrived=1000.0, queued=1000.5, now=1020.0, now_wall=5012.25)
    assert list(got) == [
        "queue",
        "gpu",
        "postprocess",
        "ingress",
        "coalesce",
        "hop_in",
        "hop_out",
        "hops",
        "total",
    ]
    assert (got["hop_in"], got["hop_out"], got["queue"]) == (1.5, 2.25, 2.0)
    assert got["hops"] == pytest.approx(20.0 - 1.0 - 2.0004 - 3.5, abs=1e-3)
    t.hop = Hop(arrived=4990.0, left=5020.0, sent=5001.0)  # clocks apart: never negative
    got = t.report(1000.0, 1002.0, 1020.0, 5012.0)  # (and queued after it left: 0)
    assert got["hop_in"] == 0.0 and got["hop_out"] == 0.0 and got["coalesce"] == 0.0


def test_an_answer_keeps_every_stamp_through_pickling():
    a = Answer(
        Timings(1.0, 2.0, 3.0, 4.0, left_coalescer=5.0, hop=Hop(6.0, 7.0, 8.0)),
        batch_size=3,
        random_weights=True,
        top_k=[{"label": "2", "class": 2, "score": 0.5}],
    )
    back = _hop(a)
    assert back == a and back.timings.hop == Hop(6.0, 7.0, 8.0)
    assert back.timings.report(0.0, 1.0, 30.0, 9.0) == a.timings.report(0.0, 1.0, 30.0, 9.0)
    body = back.body({"total": 1.0})
    assert list(body) == ["top_k", "timings_ms", "batch_size", "random_weights"]
    v2 = Answer(Timings(), outputs={"logits": np.zeros((1, 10), np.float32)}).body({})
    assert list(v2) == ["outputs", "timings_ms", "batch_size", "random_weights"]


def test_rows_say_where_their_data_is():
    env = Envelope("c", "object_store", 1, (2, 8, 8, 1), "uint8")
    sent = DeviceRows(3, [0, 2], {1: InvalidInput("bad")}, 4.5, envelope=env)
    back = _hop(sent)  # what PreprocessGPU's answer is after the Serve call
    assert back.envelope == env and back.data is None and back.preprocess_ms == 4.5
    host = back.received(np.zeros((2, 8, 8, 1), np.uint8))  # object store to a numpy executor
    assert isinstance(host, HostRows) and host.data.shape == (2, 8, 8, 1)
    assert (host.owner, list(host.errors), host.preprocess_ms) == ([0, 2], [1], 4.5)
    views = back.received([object(), object()])  # (device arrays stand in: any non-numpy)
    assert isinstance(views, DeviceRows) and views.envelope is None and len(views.data) == 2
    assert HostRows(2, [0, 0, 1]).rows_by_request() == {0: [0, 1], 1: [2]}


def _items(n: int) -> list[Encoded]:
    target = model_card(_config().models[0]).target()
    rng = np.random.default_rng(0)
    imgs = [rng.integers(0, 255, (8, 8, 1), np.uint8) for _ in range(n)]
    return [Encoded.checked(encode_png(i), "image/png", target, 1 << 20, 1 << 26) for i in imgs]


def test_the_stages_fill_every_timing_and_a_replica_stamps_its_hop():
    # as one_process builds it: decoding and answering in this process
    stage = build_inference(_config(), decode_here=True, answer_here=True)
    meta = [RequestMeta(f"r{i}") for i in range(3)]
    specs = [PostSpec("classify", top_k=3)] * 3
    out = asyncio.run(stage.encoded("digits", _items(3), meta, specs))
    assert all(isinstance(a, Answer) for a in out)
    for a in out:
        t = a.timings
        assert all(getattr(t, k) is not None and getattr(t, k) >= 0 for k in STAGE_KEYS)
        assert t.hop is None and t.left_coalescer is None and 1 <= a.batch_size <= 3
        assert len(a.top_k) == 3 and a.outputs is None
    arrived = 1.7e12
    stamped = _hop(stamp_hops(out, arrived))  # as the inference replica sends them back
    for a in stamped:
        assert a.timings.hop.arrived == arrived and a.timings.hop.left >= arrived
        assert a.timings.hop.sent is None  # the ingress stamps that
    assert stamped[0].timings.hop is not stamped[1].timings.hop  # each answer its own


def test_v2_tensors_answer_outputs_with_queue_and_gpu_but_no_decode():
    stage = build_inference(_config("four_stage"))  # as four_stage: logits only
    rows = HostRows(2, [0, 1, 1], data=np.zeros((3, 8, 8, 1), np.uint8))
    logits = asyncio.run(stage.logits("digits", rows, [RequestMeta("a"), RequestMeta("b")]))
    assert isinstance(logits, Logits) and logits.data.shape == (3, 10)
    rt = logits.row_times
    assert len(rt.queue) == len(rt.gpu) == len(rt.batch_size) == 3
    assert all(isinstance(b, int) and b >= 1 for b in rt.batch_size)
    logits = _hop(logits)  # Inference -> Postprocess
    spec = PostSpec("v2", outputs=("probabilities", "logits"), names=("logits",))
    out = PostprocessStage(_config("four_stage")).run("digits", logits, [spec, spec])
    a, b = out
    assert a.top_k is None and a.outputs["logits"].shape == (1, 10)
    assert b.outputs["probabilities"].shape == (2, 10)
    assert a.timings.preprocess is None and a.timings.gpu is not None
    assert b.timings.queue == max(rt.queue[1], rt.queue[2])
    assert "preprocess" not in b.timings.report(0.0, 0.0, 50.0, 0.0)


def test_a_logit_rows_request_that_failed_answers_its_error():
    err = InvalidInput("bad image")
    logits = Logits(
        2,
        [1],
        {0: err},
        1.0,
        data=np.zeros((1, 10), np.float32),
        row_times=RowTimes([1.0], [2.0], [1]),
    )
    out = PostprocessStage(_config()).run("digits", logits, [PostSpec("classify")] * 2)
    assert out[0] is err and isinstance(out[1], Answer) and out[1].timings.gpu == 2.0


def test_a_request_whose_output_is_not_finite_gets_an_error_never_a_nan_score():
    """fp16 overflow (or any NaN/inf the model computes) reaches no answer: that request gets
    a NonFiniteOutput naming the model and the dtype; its neighbours are answered."""
    import json

    from deployments.http_errors import error_response
    from pipeline.errors import NonFiniteOutput

    data = np.zeros((3, 10), np.float32)
    data[1, 4] = np.inf  # request 1's only row
    data[2, 0] = np.nan  # request 2's only row
    logits = Logits(
        3, [0, 1, 2], {}, 1.0, data=data, row_times=RowTimes([1.0] * 3, [2.0] * 3, [3] * 3)
    )
    specs = [
        PostSpec("classify"),
        PostSpec("classify"),
        PostSpec("v2", outputs=("logits",), names=("logits",)),
    ]
    ok, inf, nan = PostprocessStage(_config()).run("digits", logits, specs)
    assert isinstance(ok, Answer) and len(ok.top_k) == 5
    for err in (inf, nan):
        assert isinstance(err, NonFiniteOutput) and err.fields["model"] == "digits"
        assert err.retryable is False
    r = error_response(inf, "rid-1")
    body = json.loads(r.body)
    assert r.status_code == 500 and body["type"] == "NonFiniteOutput"
    assert body["detail"]["model"] == "digits" and "float32" in body["detail"]["fix"]
    assert "retry-after" not in r.headers


ms = st.floats(0.0, 1e4, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(
    stages=st.lists(st.one_of(st.none(), ms), min_size=4, max_size=4),
    waits=st.tuples(ms, ms, ms),
    hop=st.one_of(st.none(), st.tuples(ms, ms, st.one_of(st.none(), ms))),
)
def test_report_accounts_for_the_whole_total(stages, waits, hop):
    """Whatever the stamps: ``hops`` is what the stages leave of the total (never below
    0), no time is negative, and a hop is split only when both ends stamped it."""
    queued, left, rest = waits
    t = Timings(*stages, left_coalescer=left, hop=None if hop is None else Hop(*hop))
    got = t.report(0.0, min(queued, left), left + rest + sum(s or 0.0 for s in stages), 2e4)
    assert all(v >= 0.0 for v in got.values())
    assert got["coalesce"] <= got["ingress"] + 1e-3
    split = hop is not None and hop[2] is not None
    assert ("hop_in" in got) == ("hop_out" in got) == split
    accounted = got["ingress"] + sum(got.get(k, 0.0) for k in STAGE_KEYS) + got["hops"]
    assert accounted == pytest.approx(got["total"], abs=1e-2)
    assert [k for k in STAGE_KEYS if k in got] == [
        k for k, s in zip(STAGE_KEYS, stages, strict=True) if s is not None
    ]


def test_preprocess_gpu_sends_where_send_to_says():
    cfg = _config("four_stage")
    cpu = PreprocessStage(cfg, fitted=False)
    core = PreprocessGpuCore(cfg, cpu, local=False, backend=Backend("numpy"))
    try:
        to = _hop(SendTo("nccl", "inference-1", "GPU-0"))  # (it rides in the Serve call)
        assert (to.transport, to.endpoint, to.gpu) == ("nccl", "inference-1", "GPU-0")
        assert core.senders.sender(SendTo("object_store")) is core.senders.os_tx
        with pytest.raises(TransportError):  # no NCCL endpoint on the numpy backend
            core.senders.sender(to)
        with pytest.raises(InvalidInput) as e:
            core.senders.sender(SendTo("pigeon"))
        assert e.value.fields["transport"] == "pigeon"
    finally:
        core.close()


def test_an_answers_timings_name_the_stages_it_passed_in_order_and_add_up():
    """``Timings.report`` (its stages spelled out for speed) follows ``STAGES``: the stages
    passed, in that order, then ingress, coalesce, hops and total; hops is what no stage
    took, never below zero."""
    from pipeline.stages.messages import STAGES

    full = Timings(1.0, 2.0, 3.0, 0.5, left_coalescer=10.0).report(5.0, 6.0, 20.0, 1e3)
    assert list(full)[:4] == list(STAGES)
    assert list(full)[4:] == ["ingress", "coalesce", "hops", "total"]
    assert full["hops"] == pytest.approx(20.0 - 5.0 - (5.0 + 1.0 + 2.0 + 3.0 + 0.5))
    part = Timings(queue=2.0, gpu=3.0).report(5.0, 5.0, 6.0, 1e3)
    assert list(part)[:2] == ["queue", "gpu"] and part["hops"] == 0.0 and part["total"] == 1.0
