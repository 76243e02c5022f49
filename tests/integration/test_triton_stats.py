"""The statistics extension over two ingress replicas: successive snapshots (each GET on
whichever replica Serve picks) never go backwards -- perf_analyzer subtracts them in
unsigned integers -- and the queue time a request is plausible."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from tests.integration.helpers import BASE, cpu_config, deploy, undeploy

pytestmark = pytest.mark.integration
APP = "triton_stats"


@pytest.fixture(scope="module")
def two_ingresses(ray_cluster):
    deploy(cpu_config(ingress_deployment={"num_replicas": 2}), name=APP)
    yield
    undeploy(APP)


def _infer(c: httpx.Client, seed: int) -> float:
    """One inference; the seconds it took as this client saw it."""
    x = np.random.default_rng(seed).integers(0, 256, (1, 8, 8, 1), dtype=np.uint8)
    body = {
        "inputs": [
            {
                "name": "image",
                "shape": [1, 8, 8, 1],
                "datatype": "UINT8",
                "data": x.ravel().tolist(),
            }
        ]
    }
    t0 = time.perf_counter()
    r = c.post(f"{BASE}/v2/models/digits/infer", json=body, timeout=30)
    took = time.perf_counter() - t0
    assert r.status_code == 200, r.text
    return took


def _snapshot() -> tuple[int, int, int]:
    with httpx.Client() as c:  # a new connection each time: any replica answers
        r = c.get(f"{BASE}/v2/models/digits/stats", timeout=10)
    assert r.status_code == 200
    s = r.json()["model_stats"][0]["inference_stats"]
    return s["success"]["count"], s["queue"]["count"], s["queue"]["ns"]


def test_snapshots_over_two_replicas_never_go_backwards(two_ingresses):
    first = _snapshot()
    snaps, n = [first], 240

    def client(k: int) -> float:
        with httpx.Client() as c:
            return sum(_infer(c, k * 1000 + i) for i in range(n // 8))

    with ThreadPoolExecutor(8) as pool:
        futs = [pool.submit(client, k) for k in range(8)]
        while not all(f.done() for f in futs):
            snaps.append(_snapshot())
            time.sleep(0.02)
        client_s = sum(f.result() for f in futs)  # the requests' whole time, client-side
    # every replica publishes its last requests within 2 * publish_every_s on an idle box:
    # wait for that event (its count), not a fixed time; 30 s is a hang guard
    deadline = time.monotonic() + 30
    while True:
        last = _snapshot()
        snaps.append(last)
        if last[0] - first[0] >= n or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for a, b in zip(snaps, snaps[1:], strict=False):
        assert all(y >= x for x, y in zip(a, b, strict=True)), (a, b)
    assert last[0] - first[0] == n and last[1] - first[1] == n
    # plausible, relative to the same requests: the queue time a request is counted is a
    # part of its time as its client saw it (the client's clock starts before the request
    # is sent and stops after the answer), so the mean is at most the clients' mean -- a
    # unit slip that inflates it (us or ms counted as ns) or a wrapped counter is orders of
    # magnitude above that
    per_request_ms = (last[2] - first[2]) / n / 1e6
    client_mean_ms = client_s / n * 1e3
    assert 0.0 <= per_request_ms <= client_mean_ms, (per_request_ms, client_mean_ms)
