"""``deployments.stop`` (issue 17 item 6): stopping an application drains it -- the requests
in flight when the stop begins all finish with 200, also those still between its deployments
(16 resnet50 photos through the four-stage CPU app: without the ingress's drain they ended in
Serve's plain 500) -- and afterwards its routes are gone.
(Serve itself is kept here: the session's other modules share it; ``serve.shutdown`` after
the apps are gone has nothing left in flight to drop.)"""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from tests.integration.helpers import BASE, cpu_config, photos

pytestmark = pytest.mark.integration
APP, PREFIX, IN_FLIGHT = "stopme", "/stopme", 16


def test_stop_drains_the_requests_in_flight_then_the_routes_are_gone(ray_cluster):
    from ray import serve

    from deployments.app import build
    from deployments.stop import stop
    from pipeline.imaging import encode_jpeg

    # (the queue budget off, as in every cpu_config): every refusal here must be the drain's
    cfg = cpu_config()
    serve.run(build(cfg), name=APP, route_prefix=PREFIX)
    url = f"{BASE}{PREFIX}/v1/models/resnet50/classify"
    body = encode_jpeg(photos()["chelsea"])
    ok = httpx.post(url, content=body, headers={"content-type": "image/jpeg"}, timeout=60)
    assert ok.status_code == 200, ok.text
    began = threading.Event()
    stopped: list[float] = []

    def stop_when_in_flight() -> None:
        began.wait(30)
        time.sleep(0.3)  # the requests have reached the replicas
        t0 = time.monotonic()
        stop([APP], keep_serve=True)
        stopped.append(time.monotonic() - t0)

    async def load() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as c:
            sends = [
                c.post(url, content=body, headers={"content-type": "image/jpeg"})
                for _ in range(IN_FLIGHT)
            ]
            tasks = [asyncio.ensure_future(s) for s in sends]
            began.set()
            return await asyncio.gather(*tasks)

    t = threading.Thread(target=stop_when_in_flight)
    t.start()
    answers = asyncio.run(load())
    t.join(120)
    assert stopped, "stop() did not return"
    bad = [(r.status_code, r.text[:200]) for r in answers if r.status_code != 200]
    assert not bad, bad  # every request in flight when the stop began finished
    assert APP not in serve.status().applications
    gone = httpx.post(url, content=body, headers={"content-type": "image/jpeg"}, timeout=30)
    assert gone.status_code == 404, gone.text
