"""Health that tells the truth (issue 17, items 5 and 6) on a real Serve app, CPU backend,
with faults injected into the executor (pipeline/faults.py): a poisoned replica of the
one-deployment form is replaced, a wedged inference replica fails its health check and is
replaced, readiness is false during warm-up, and an out-of-memory in the middle of a batch
fails only that batch's requests and gives the pool back."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from pipeline.imaging import encode_png
from pipeline.models import digits
from tests.integration.helpers import BASE, cpu_config, deploy, undeploy

pytestmark = pytest.mark.integration
DIGITS = [{"name": "digits", "arch": "digits"}]


@pytest.fixture(scope="module")
def png() -> bytes:
    return encode_png(digits.load_split()[2][0])


def classify(png: bytes, timeout: float = 30) -> httpx.Response:
    return httpx.post(
        BASE + "/v1/models/digits/classify",
        content=png,
        headers={"content-type": "image/png"},
        timeout=timeout,
    )


def replicas(deployment: str) -> dict[str, str]:
    """Actor id -> state of this app's replicas of ``deployment``."""
    from ray._private import state

    return {
        aid: a.get("State")
        for aid, a in state.actors().items()
        if (a.get("ActorClassName") or "") == f"ServeReplica:ferry:{deployment}"
    }


def alive(deployment: str) -> set[str]:
    return {a for a, s in replicas(deployment).items() if s == "ALIVE"}


def _gone(old: set[str], deployment: str, within_s: float = 30) -> None:
    """The replaced replicas end (Serve stops them after their graceful shutdown)."""
    t0 = time.monotonic()
    while alive(deployment) & old and time.monotonic() - t0 < within_s:
        time.sleep(0.5)
    assert not (alive(deployment) & old), f"the replaced {deployment} replica is still alive"
    assert all(replicas(deployment)[a] == "DEAD" for a in old)


def test_a_poisoned_replica_of_the_one_deployment_form_is_replaced(ray_cluster, png):
    cfg = cpu_config(
        models=DIGITS,
        executor={"faults": {"faults": [{"kind": "device_error", "at_batch": 3}]}},
        placement="one_process",
        ingress_deployment={"health_check_period_s": 1.0, "graceful_shutdown_timeout_s": 2.0},
    )
    deploy(cfg)
    try:
        first = alive("Ingress")
        assert len(first) == 1
        got = [classify(png) for _ in range(3)]
        assert [r.status_code for r in got[:2]] == [200, 200]
        assert got[2].status_code == 500 and got[2].json()["type"] == "DeviceError"
        statuses, t0 = [], time.monotonic()
        while time.monotonic() - t0 < 60:  # until the new replica answers
            r = classify(png)
            statuses.append(r.status_code)
            if r.status_code == 200 and alive("Ingress") - first:
                break
            if r.status_code == 503:  # draining: refused at once, with Retry-After
                assert r.headers["retry-after"] == "1" and r.json()["type"] == "Unavailable"
            time.sleep(0.2)
        assert statuses[-1] == 200, statuses
        assert set(statuses) <= {200, 500, 503}, statuses
        assert statuses.count(500) == 0  # after the poisoning batch: 503s, never a retry-less 500
        _gone(first, "Ingress")
    finally:
        undeploy()


def test_a_wedged_inference_replica_fails_its_health_check_and_is_replaced(ray_cluster, png):
    cfg = cpu_config(
        models=DIGITS,
        executor={"faults": {"faults": [{"kind": "stall", "at_batch": 2, "stall_s": 300}]}},
        health={"stall_after_s": 2.0},
        inference_deployment={"health_check_period_s": 1.0, "graceful_shutdown_timeout_s": 2.0},
    )
    deploy(cfg)
    try:
        first = alive("Inference")
        assert classify(png).status_code == 200
        t0 = time.monotonic()
        # batch 2 hangs (stall_s: 300) until the replica is replaced; the client's timeout
        # is a hang guard past the ingress's request timeout (60 s), which would answer 504
        stuck = classify(png, timeout=120)
        waited = time.monotonic() - t0
        # replaced, not waited out: the replica was lost under it (503, retry), where no
        # replacement would have been the ingress's 504 after 60 s or the stall's end
        assert stuck.status_code == 503, stuck.text
        assert stuck.json()["type"] == "Unavailable" and stuck.headers["retry-after"]
        assert waited >= 2.0, waited  # not before stall_after_s: the health check found it
        t1, served = time.monotonic(), False
        while time.monotonic() - t1 < 60 and not served:
            served = bool(alive("Inference") - first) and classify(png).status_code == 200
            time.sleep(0.5)
        assert served, "the new inference replica did not serve"
        assert alive("Inference") - first, "no new inference replica"
        _gone(first, "Inference")  # (the new replica served batch 1; its batch 2 would stall too)
    finally:
        undeploy()


def test_readiness_is_false_until_warm_up_ends(ray_cluster):
    delay = 6.0
    cfg = cpu_config(models=DIGITS, executor={"faults": {"warmup_delay_s": delay}})
    seen: list[tuple[float, int]] = []
    t0 = time.monotonic()
    deployer = threading.Thread(target=deploy, args=(cfg,))
    deployer.start()

    async def poll():
        async with httpx.AsyncClient(base_url=BASE, timeout=5) as c:
            while deployer.is_alive() or not seen or seen[-1][1] != 200:
                for path in ("/v2/health/ready", "/v2/models/digits/ready"):
                    try:
                        r = await c.get(path)
                        seen.append((time.monotonic() - t0, r.status_code))
                    except httpx.TransportError:
                        pass
                await asyncio.sleep(0.25)
                if time.monotonic() - t0 > 120:
                    return

    try:
        asyncio.run(poll())
        deployer.join(60)
        assert seen and seen[-1][1] == 200, seen
        oks = [t for t, s in seen if s == 200]
        assert any(s == 503 for _, s in seen), seen  # the ingress up, the model warming
        assert min(oks) >= delay, seen  # never ready before the warm-up ended
    finally:
        deployer.join(60)
        undeploy()


def test_out_of_memory_in_a_batch_fails_only_its_requests_and_returns_the_pool(ray_cluster, png):
    from ray import serve

    cfg = cpu_config(
        models=DIGITS, executor={"faults": {"faults": [{"kind": "oom_commit", "at_batch": 2}]}}
    )
    deploy(cfg)
    try:
        inference = serve.get_deployment_handle("Inference", "ferry")
        assert classify(png).status_code == 200
        before = inference.status.remote().result()
        baseline = before["pool"]["bytes_in_use"]

        async def burst():
            async with httpx.AsyncClient(base_url=BASE, timeout=30) as c:
                return await asyncio.gather(
                    *(
                        c.post(
                            "/v1/models/digits/classify",
                            content=png,
                            headers={"content-type": "image/png"},
                        )
                        for _ in range(6)
                    )
                )

        rs = asyncio.run(burst())
        codes = [r.status_code for r in rs]
        assert set(codes) <= {200, 503}, codes
        failed = [r for r in rs if r.status_code == 503]
        assert failed, codes
        for r in failed:
            assert r.json()["type"] == "ResourceExhausted" and r.headers["retry-after"] == "1"
        after = inference.status.remote().result()
        assert after["faults_injected"] == {"oom_commit": 1}
        assert after["failed"] - before["failed"] == 1  # one batch failed ...
        served = after["items"] - before["items"]  # ... and only its requests
        assert len(failed) == len(rs) - served, (codes, served)
        assert after["pool"]["bytes_in_use"] == baseline
        assert after["health"]["ready"] is True  # out of memory does not poison the device
        assert classify(png).status_code == 200
    finally:
        undeploy()
