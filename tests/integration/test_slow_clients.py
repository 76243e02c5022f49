"""Slow clients cannot block anyone: 1,000 connections that declare a 1,000-byte body and
send 10 bytes (``stallers.py``, a process of its own), opened 40 a second against a real
Serve app over real sockets, while health and classify keep answering -- never held behind
a stalled upload, each stalled upload costing Serve less CPU than one of the probe's own
requests (the same probe, on the same box, just before the stall is the baseline); every
stalled upload is answered (503 + Retry-After at once past the per-replica bound, 408 when
its body stops) and its connection closed.

Why 40 a second: each request, stalled or not, costs Serve's own path -- the proxy, the
actor calls to the ingress replica and back -- CPU (8.7-9 ms a stalled upload on this
2-core machine when the test was written; 15-16.5 ms on 2026-12-06, when the hypervisor
took 15-35% of the cores). Arrivals past what the box can carry are the overload tests'
subject, not stalling: 1,000 opened in 2.6 s delayed the probe's classify by up to 3 s, as
1,000 *complete* requests at that rate did (1.3 s); and at 100 a second on the slower box
the stallers alone asked 1.65 cores, and the probe's classify waited 2-4 s -- refused as a
slow upload (its body not fetched from the proxy within two graces) or timed out (CI 66,
68, 69; alone on the box in 69). At 40 a second they ask about 0.65 of a core there.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import httpx
import numpy as np
import psutil
import pytest

from loadtest import procs
from pipeline.imaging import encode_png
from tests.integration.helpers import BASE, PORT, ROOT, cpu_config, deploy, undeploy

pytestmark = pytest.mark.integration
STALLED = 1000
IDLE_S = 3.0
BASELINE_ROUNDS = 20  # probe rounds (health, then classify) before the stall, ~3 s


@pytest.fixture(scope="module")
def app(ray_cluster):
    deploy(
        cpu_config(
            ingress={"body_idle_timeout_s": IDLE_S, "max_concurrent_uploads": 64},
            ingress_deployment={"max_ongoing_requests": 2048},
        ),
        name="slow",
    )
    yield BASE
    undeploy("slow")


def _serve_cpu_s() -> float:
    """CPU seconds (user + system) so far of what every request, stalled or not, costs:
    this run's Serve proxy and this app's ingress replicas (``procs.marked``: not another
    run's processes on the same machine)."""
    total = 0.0
    for pid, cmd in procs.marked(os.environ[procs.MARK]).items():
        if "ray::ProxyActor" in cmd or "ray::ServeReplica:slow:Ingress" in cmd:
            try:
                t = psutil.Process(pid).cpu_times()
            except psutil.Error:
                continue
            total += t.user + t.system
    return total


async def _probe(
    c: httpx.AsyncClient, png: bytes, stop: asyncio.Event, out: dict, rounds: int | None = None
) -> None:
    while not stop.is_set() and (rounds is None or len(out["health"]) < rounds):
        t0 = time.perf_counter()
        h = await c.get("/v2/health/ready")
        out["health"].append((h.status_code, time.perf_counter() - t0))
        t0 = time.perf_counter()
        r = await c.post(
            "/v1/models/digits/classify", content=png, headers={"content-type": "image/png"}
        )
        out["classify"].append((r.status_code, time.perf_counter() - t0))
        await asyncio.sleep(0.1)


def test_1000_stalled_uploads_do_not_delay_health_or_classify(app):
    png = encode_png(np.zeros((8, 8, 1), np.uint8))

    async def main():
        out: dict = {"health": [], "classify": []}
        base: dict = {"health": [], "classify": []}
        stop = asyncio.Event()
        async with httpx.AsyncClient(base_url=app, timeout=30) as c:
            # the baseline: the same probe on the same box, before any upload stalls (after
            # one round that pays the app's first-request costs)
            await _probe(c, png, stop, {"health": [], "classify": []}, rounds=1)
            cpu0 = _serve_cpu_s()
            await _probe(c, png, stop, base, rounds=BASELINE_ROUNDS)
            cpu1 = _serve_cpu_s()
            probe = asyncio.create_task(_probe(c, png, stop, out))
            stallers = await asyncio.create_subprocess_exec(  # its own process (stallers.py)
                sys.executable,
                "-m",
                "tests.integration.stallers",
                str(PORT),
                str(STALLED),
                str(IDLE_S + 30),
                cwd=ROOT,
                stdout=asyncio.subprocess.PIPE,
            )
            got, _ = await asyncio.wait_for(stallers.communicate(), 120)
            stop.set()
            await probe
            cpu2 = _serve_cpu_s()
        assert stallers.returncode == 0, got
        res = json.loads(got)
        cpu = {"baseline": cpu1 - cpu0, "stall": cpu2 - cpu1}
        return out, base, cpu, [tuple(o) for o in res["outcomes"]], res["opened_s"]

    out, base, cpu, outcomes, opened_s = asyncio.run(main())
    # CPU per request, as the probe's own requests cost it (health and classify, each a
    # request) before the stall; and what each stalled upload cost beyond the probe's
    per_request = cpu["baseline"] / (2 * len(base["health"]))
    per_stalled = (cpu["stall"] - 2 * len(out["health"]) * per_request) / STALLED
    statuses = [s for s, _, _ in outcomes]
    counts = {s: statuses.count(s) for s in set(statuses)}
    worst = {k: max(t for _, t in v) for k, v in out.items()}
    unloaded = {k: max(t for _, t in v) for k, v in base.items()}
    refused = [t for s, t, _ in outcomes if s == 503]
    summary = {
        "stalled_uploads": STALLED,
        "opened_s": round(opened_s, 2),
        "statuses": {str(k): v for k, v in sorted(counts.items())},
        "closed": sum(c for *_, c in outcomes),
        "refused_503_p99_s": round(float(np.percentile(refused, 99)), 3) if refused else None,
        "probe_worst_s": {k: round(v, 3) for k, v in worst.items()},
        "probe_baseline_worst_s": {k: round(v, 3) for k, v in unloaded.items()},
        "probes": {k: len(v) for k, v in out.items()},
        "serve_cpu_ms": {
            "per_request": round(per_request * 1e3, 2),
            "per_stalled_upload": round(per_stalled * 1e3, 2),
        },
    }
    print(json.dumps(summary))
    if os.environ.get("FERRY_SLOW_CLIENT_JSON"):
        with open(os.environ["FERRY_SLOW_CLIENT_JSON"], "w") as f:
            json.dump(summary, f)
    assert set(counts) <= {408, 503}, counts  # every one answered, none hangs
    assert counts.get(408, 0) >= 1 and counts.get(503, 0) >= 1, counts
    assert all(c for *_, c in outcomes)  # and its connection closed
    bad = {k: [(s, round(t, 3)) for s, t in out[k] + base[k] if s != 200] for k in out}
    assert not bad["health"] and not bad["classify"], bad
    assert len(out["health"]) >= 3, out
    # what a stalled upload costs, in CPU seconds rather than the probe's wall clock (which
    # whatever else runs on the box stretches): Serve's proxy and the ingress spend less on
    # one than on one of the probe's own complete requests, measured just before on the same
    # processes. (Measured: 8.7 ms a stalled upload against 21.5 ms a probe request, whose
    # share of the processes' idle work is in it. A stalled read that polled, or work per
    # stalled request such as a78b897's store calls, is what this catches.)
    assert per_stalled < per_request, summary["serve_cpu_ms"]
    # and not held: relative to the same probe just before the stall on this same box, its
    # worst stays under 3x the baseline's worst (the stallers take part of the cores the
    # probe had, and queueing behind them makes it more than 2x) plus IDLE_S, where a probe
    # that waited for a slot a stalled upload holds waits IDLE_S and a grace on top of its
    # own time. (Worst seen: 1.19 s against a baseline's 0.14 s
    # on a box shared with other test runs; 0.12-0.36 s otherwise.)
    for k in ("health", "classify"):
        assert worst[k] < 3 * unloaded[k] + IDLE_S, (k, worst, unloaded)
    r = httpx.get(app + "/v2/health/ready")
    assert r.status_code == 200
