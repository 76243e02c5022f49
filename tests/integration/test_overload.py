"""Overload sheds instead of queueing (issue 17 item 4): a burst far past what ResNet-50 on
numpy serves gets quick 503s with ``Retry-After`` for the excess, and every accepted request
answers within its queue budget plus its own service -- not after the whole burst."""

from __future__ import annotations

import asyncio
import time
import uuid

import httpx
import pytest

from pipeline.imaging import encode_jpeg
from tests.integration.helpers import BASE, cpu_config, deploy, photos, undeploy

pytestmark = pytest.mark.integration
BUDGET_MS = 600.0


@pytest.fixture(scope="module")
def app(ray_cluster):
    cfg = cpu_config(
        models=[{"name": "resnet50", "arch": "resnet50"}],
        batching={"queue_policy": {"timeout_ms": BUDGET_MS}},
        ingress={"max_groups_in_flight": 2, "max_coalesce": 8},
    )
    deploy(cfg, name="ferry-overload")
    yield BASE
    undeploy("ferry-overload")


def _jpeg() -> bytes:
    img = photos()["chelsea"]
    return encode_jpeg(img[::2, ::2].copy(), 85)


async def _classify(c: httpx.AsyncClient, body: bytes) -> tuple[httpx.Response, float, str]:
    rid = uuid.uuid4().hex
    t0 = time.perf_counter()
    r = await c.post(
        "/v1/models/resnet50/classify",
        content=body,
        headers={"content-type": "image/jpeg", "x-request-id": rid},
    )
    return r, time.perf_counter() - t0, rid


def test_a_burst_is_shed_with_quick_503s_and_the_accepted_stay_within_budget(app):
    body = _jpeg()
    cfg = httpx.get(BASE + "/v2/models/resnet50/config", timeout=30).json()
    assert cfg["dynamic_batching"]["default_queue_policy"] == {
        "timeout_action": "REJECT",
        "default_timeout_microseconds": int(BUDGET_MS * 1e3),
        "allow_timeout_override": False,
        "max_queue_size": 2048,
    }

    async def main():
        async with httpx.AsyncClient(base_url=BASE, timeout=120) as c:
            # warm: the stages' first requests; then bursts that queue, so the drain rates
            # are measured (without them the first burst is shed only by age)
            await asyncio.gather(*(_classify(c, body) for _ in range(8)))
            for _ in range(2):
                t0 = time.perf_counter()
                warm = await asyncio.gather(*(_classify(c, body) for _ in range(32)))
                took = time.perf_counter() - t0
            served = sum(r.status_code == 200 for r, _, _ in warm)
            # this machine's service time per request, from the second warm burst
            per_request_s = took / max(served, 1)
            return await asyncio.gather(*(_classify(c, body) for _ in range(120))), per_request_s

    burst, per_request_s = asyncio.run(main())
    codes = [r.status_code for r, _, _ in burst]
    assert set(codes) <= {200, 503}, [
        r.text for r, _, _ in burst if r.status_code not in (200, 503)
    ]
    ok = [r for r, _, _ in burst if r.status_code == 200]
    shed = [(r, dt, rid) for r, dt, rid in burst if r.status_code == 503]
    assert ok and len(shed) >= 30, (len(ok), len(shed))  # ~15 img/s here: 120 is 8 s of work
    reasons = set()
    at_gpu = 0
    # relative to the same burst: a shed request passes at most what an accepted one passes
    # (the ingress, at most a budget in each queue, decoding and the hops for one refused
    # at the GPU queue) without its inference, so it is answered within the slowest
    # accepted answer plus one budget of room for its later place in the burst; one that
    # queued behind the burst instead of being shed waits out 8 s of work
    slowest_ok = max(dt for r, dt, _ in burst if r.status_code == 200)
    for r, dt, rid in shed:
        b = r.json()
        assert b["request_id"] == rid and b["error"].startswith("overloaded"), b
        assert b["detail"]["reason"] in ("queue_budget", "queue_timeout"), b
        assert int(r.headers["retry-after"]) >= 1
        reasons.add((b["detail"]["queue"], b["detail"]["reason"]))
        d = b["detail"]
        if d["reason"] == "queue_budget":  # refused on arrival: its predicted wait passed it
            assert d["predicted_wait_ms"] >= d["budget_ms"] == BUDGET_MS, b
            assert d["queue"] != "ingress" or d["queue_ahead"] > 0, b  # (requests ahead of it)
        else:  # dropped before its batch, having waited past the budget
            assert d["waited_ms"] >= d["budget_ms"] == BUDGET_MS, b
        assert dt < slowest_ok + BUDGET_MS / 1e3, (dt, slowest_ok, b)
        at_gpu += b["detail"]["queue"] == "gpu"
    assert ("ingress", "queue_budget") in reasons, reasons
    assert at_gpu < len(shed) / 2, (at_gpu, len(shed))  # most are refused on arrival
    # an accepted request did not wait the burst out. The exact rule -- at most the budget
    # in each queue at its dispatch check -- is pinned on a fake clock in
    # tests/unit/test_queue_budget.py; here the waits are stamped an event-loop turn after
    # that check, which a loaded machine makes late by an amount no fixed bound can know. So
    # the bound is this machine's own, from the warm burst above: had the 120 been queued
    # instead of shed, the later half would each have waited over half of 120 service times
    # (~8 s on two cores); an accepted request must have waited less than that half.
    queued_s = len(burst) * per_request_s
    for r in ok:
        t = r.json()["timings_ms"]
        assert t["coalesce"] <= t["ingress"], t
        assert t["coalesce"] / 1e3 < queued_s / 2 and t["queue"] / 1e3 < queued_s / 2, (
            t,
            queued_s,
        )
    # and the service is itself again after the burst
    r = httpx.post(
        BASE + "/v1/models/resnet50/classify",
        content=body,
        headers={"content-type": "image/jpeg"},
        timeout=30,
    )
    assert r.status_code == 200
