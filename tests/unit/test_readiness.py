"""The ingress's readiness (``deployments/readiness.py``) without Ray: answered within
``ANSWER_S`` whatever the inference deployment does, with why when not ready -- from the
inference replica's load report (``load_board``) while it does not answer."""

from __future__ import annotations

import asyncio

import pytest

from deployments import readiness as rd
from deployments.load_board import LoadBoard, digest, why_of
from pipeline.models.loading import LoadReport, ModelUnavailable
from tests.unit import virtual_time

READY = {"health": {"ready": True, "state": "ready"}, "refused": {}}


class DictKv:
    def __init__(self) -> None:
        self.d: dict[bytes, bytes] = {}

    def get(self, k: bytes) -> bytes | None:
        return self.d.get(k)

    def put(self, k: bytes, v: bytes) -> None:
        self.d[k] = v


def _board(report: LoadReport | None) -> LoadBoard:
    from pipeline.config import PipelineConfig

    board = LoadBoard("app", PipelineConfig(), DictKv())
    if report is not None:
        board.publish(report)
    return board


async def _hangs() -> dict:
    await asyncio.sleep(3600)
    return READY


def test_while_the_inference_replica_loads_readiness_says_how_far_at_once():
    report = LoadReport(["digits", "resnet50"], loaded=["digits"], current="resnet50")
    r = rd.Readiness(_hangs, _board(report).read, lambda: False)

    async def ask():
        out = await r.server()
        return out, r._probe.done()  # answered while the status call still hangs

    (body, code), probe_done = asyncio.run(ask())
    assert code == 503 and not probe_done
    assert body == {"ready": False, "why": "warming: 1 of 2 models loaded; loading resnet50"}


def test_with_no_report_yet_it_says_starting():
    assert why_of(None).startswith("starting:")
    r = rd.Readiness(_hangs, _board(None).read, lambda: False)
    body, code = asyncio.run(r.server())
    assert code == 503 and body["why"].startswith("starting:")


def test_a_replica_that_refuses_every_model_is_not_ready_and_its_models_answer_the_reason():
    report = LoadReport(["my_model"], refused={"my_model": "ModelRefused: TopK"}, phase="failed")

    async def unavailable() -> dict:
        raise RuntimeError("DeploymentUnavailableError")

    r = rd.Readiness(unavailable, _board(report).read, lambda: False)
    body, code = asyncio.run(r.server())
    assert code == 503 and body["refused"] == {"my_model": "ModelRefused: TopK"}
    assert (
        body["why"] == "refused: no model of the config loads: model 'my_model': ModelRefused: TopK"
    )
    with pytest.raises(ModelUnavailable, match="TopK"):
        r.check("my_model")
    body, code = asyncio.run(r.model("my_model", "my_model"))
    assert (code, body["why"]) == (503, "refused: ModelRefused: TopK")


def test_ready_with_a_refused_model_lists_it_and_only_its_route_is_not_ready():
    async def status() -> dict:
        return {**READY, "refused": {"bad": "ModelRefused: TopK"}}

    r = rd.Readiness(status, None, lambda: False)
    # (on the virtual clock, as below: the probe's answer in a few loop turns, never raced
    # against a real ANSWER_S)
    assert virtual_time.run(r.server()) == (
        {"ready": True, "refused": {"bad": "ModelRefused: TopK"}},
        200,
    )
    assert virtual_time.run(r.model("good", "good")) == ({"name": "good", "ready": True}, 200)
    assert virtual_time.run(r.model("bad_encoded", "bad"))[1] == 503
    assert r.state_of("bad") == {"state": "refused", "reason": "ModelRefused: TopK"}
    assert r.state_of("good") == {"state": "ready"}
    r.check("good")


def test_an_unhealthy_replica_and_a_draining_app_say_so():
    async def draining() -> dict:
        return {"health": {"ready": False, "state": "draining", "reason": "device error"}}

    r = rd.Readiness(draining, None, lambda: False)
    assert virtual_time.run(r.server())[0]["why"] == "draining: device error"
    stopping = rd.Readiness(_hangs, None, lambda: True)
    assert virtual_time.run(stopping.answer()) == (
        False,
        "draining: the application is being stopped",
    )


def test_a_lost_replica_under_a_refused_models_request_is_its_refusal():
    from pipeline.errors import Unavailable

    r = rd.Readiness(_hangs, None, lambda: False)
    r.refused = {"bad": "ModelRefused: TopK"}
    lost = Unavailable("a replica stopped under this request; retry")
    assert isinstance(r.explain("bad", lost), ModelUnavailable)
    assert r.explain("good", lost) is lost


def test_the_board_is_keyed_by_the_config():
    from pipeline.config import PipelineConfig

    a, b = PipelineConfig(), PipelineConfig(placement="split")
    assert digest(a) == digest(PipelineConfig()) != digest(b)
    kv = DictKv()
    LoadBoard("app", a, kv).publish(LoadReport(["x"]))
    assert LoadBoard("app", a, kv).read()["models"] == ["x"]
    assert LoadBoard("app", b, kv).read() is None


def test_a_ready_stage_that_stops_answering_is_not_ready_within_unanswered_s(monkeypatch):
    """A node lost under the inference replicas: their status calls hang (Ray tells the
    caller only when it declares the node dead); readiness turns false after UNANSWERED_S,
    not after the probe's own timeout, and true again once a replica answers."""
    clock = [100.0]
    monkeypatch.setattr(rd, "_now", lambda: clock[0])
    answers = [READY]
    hang = asyncio.Event()

    async def status():
        if answers:
            return answers.pop()
        await hang.wait()
        return READY

    r = rd.Readiness(status, None, lambda: False)

    async def main():
        first = await r.server()
        clock[0] += rd.FRESH_S + 0.1  # the ready answer is stale: the next request asks
        asked = await r.server()  # the probe hangs: still ready (a busy replica is slow)
        clock[0] += rd.UNANSWERED_S  # the same probe, unanswered this long
        lost = await r.server()
        hang.set()  # a replica answers again
        await asyncio.sleep(0)
        back = await r.server()
        return first, asked, lost, back

    # on the loop's virtual clock: each ANSWER_S a request waits for the hanging probe is
    # exact, and the probe answering after hang.set() never races a real ANSWER_S (a loaded
    # machine that stalled past it made "back" a 503)
    first, asked, lost, back = virtual_time.run(main())
    assert first == ({"ready": True}, 200) and asked == ({"ready": True}, 200)
    assert lost[1] == 503 and lost[0]["why"].startswith("unavailable: the inference deployment")
    assert back == ({"ready": True}, 200)
