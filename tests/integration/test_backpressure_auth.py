"""Back-pressure (503 fast, every admitted request served) and the bearer token."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from pipeline.imaging import encode_png
from pipeline.models import digits
from tests.integration.helpers import BASE, cpu_config, deploy, undeploy

pytestmark = pytest.mark.integration
TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def app(ray_cluster):
    cfg = cpu_config(
        models=[{"name": "digits", "arch": "digits"}],
        ingress={"coalesce_window_ms": 0.0, "max_coalesce": 1},
        # the ingress takes 2 requests at a time and queues 2 more; Serve refuses the rest
        ingress_deployment={
            "max_ongoing_requests": 2,
            "max_queued_requests": 2,
            "env_vars": {"FERRY_AUTH_TOKEN": TOKEN},
        },
        batching={"max_wait_ms": 50},
    )
    deploy(cfg, name="ferry-bp")
    yield BASE
    undeploy("ferry-bp")


AUTH = {"authorization": f"Bearer {TOKEN}"}


def test_a_burst_beyond_the_queue_gets_503_quickly_and_admitted_requests_succeed(app):
    png = encode_png(digits.load_split()[2][0])

    async def main():
        async with httpx.AsyncClient(base_url=BASE, timeout=60) as c:

            async def one():
                t0 = time.perf_counter()
                r = await c.post(
                    "/v1/models/digits/classify",
                    content=png,
                    headers={"content-type": "image/png", **AUTH},
                )
                return r, time.perf_counter() - t0

            return await asyncio.gather(*(one() for _ in range(40)))

    results = asyncio.run(main())
    codes = [r.status_code for r, _ in results]
    assert set(codes) <= {200, 503}, codes
    assert codes.count(503) > 0 and codes.count(200) >= 2, codes
    for r, dt in results:
        if r.status_code == 503:
            assert dt < 1.0
        else:
            assert r.json()["top_k"][0]["label"] == "2"


def test_bearer_token_guards_every_route_but_health(app):
    assert httpx.get(BASE + "/v2/health/live", timeout=10).status_code == 200
    assert httpx.get(BASE + "/v2/health/ready", timeout=10).status_code == 200
    for path in ("/v1/models", "/v2/models/digits", "/openapi.json"):
        r = httpx.get(BASE + path, timeout=10)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", path
        assert (
            httpx.get(
                BASE + path, headers={"authorization": "Bearer wrong"}, timeout=10
            ).status_code
            == 401
        )
        assert httpx.get(BASE + path, headers=AUTH, timeout=10).status_code == 200
