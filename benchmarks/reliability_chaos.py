"""Faults survived (issue 17 item 6), into results/reliability.json's ``chaos`` and ``drain``
sections (the file's other sections are kept).

    python benchmarks/reliability_chaos.py                       # CPU test app, ~3 minutes
    python benchmarks/reliability_chaos.py --config serve_config.gpu.yaml --duration 90

chaos: closed-loop clients classify digits PNGs while a replica of the deployment that holds
the executor (Inference, or the one-deployment form's Ingress) is killed (``ray.kill``) every
``--kill-every`` seconds. The client retries what README says is safe to retry (connection
errors, 502, 503 -- honouring Retry-After, capped --, a proxy's 500 or 504, i.e. one without
Ferry's JSON body) within the request's deadline; a request succeeds if an answer of 200
comes before its deadline, and hangs if it takes longer than its deadline plus a second.

drain: the same load without retries while (1) the app is redeployed with a changed config
(what ``serve deploy`` does), (2) Serve shuts down (``serve.shutdown()``, what ``serve
shutdown`` does), and (3) on a fresh Serve, ``python -m deployments.stop`` (the app's
ingress drained, the app deleted, then Serve shut down): every request in flight when each
began is counted,
and each must end in a 200 (a dropped one is counted by its status and why).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from benchmarks.common import read_results, write_results  # noqa: E402

RETRY = {502, 503, 504}
PROXY_RETRY = {500}  # retried only without Ferry's JSON body: Serve's proxy, the replica died


def _pipeline_config(
    path: str | None, models: str | None = None, extra: str = "digits", placement: str = ""
):
    from tests.integration.helpers import cpu_config

    if path is None:
        one = placement == "one_process"  # the executor in the ingress: two of those
        return cpu_config(
            models=[{"name": "digits", "arch": "digits"}]
            + ([{"name": extra, "arch": extra}] if extra != "digits" else []),
            placement=placement or "four_stage",
            inference_deployment={"num_replicas": 2, "graceful_shutdown_timeout_s": 10},
            ingress_deployment={"num_replicas": 2 if one else 1}
            | ({"graceful_shutdown_timeout_s": 10, "num_cpus": 1.0} if one else {}),
        )
    import yaml

    from pipeline.config import PipelineConfig

    with open(path) as f:
        doc = yaml.safe_load(f)
    raw = doc["applications"][0]["args"]["config"]
    if models:  # only these of the file's models (a shorter warm-up for each replacement)
        raw["models"] = [m for m in raw["models"] if m["name"] in models.split(",")]
    return PipelineConfig.model_validate(raw)


def _chelsea():
    import skimage.data

    return skimage.data.chelsea()


def _deploy(cfg) -> None:
    from ray import serve

    from deployments.app import build, place

    serve.run(build(place(cfg)), name="ferry", route_prefix="/")


def _target(cfg) -> str:
    return "Ingress" if cfg.placement_row.executor_in == "ingress" else "Inference"


def _alive(deployment: str) -> list[str]:
    from ray._private import state

    return [
        a["Name"]
        for a in state.actors().values()
        if a.get("State") == "ALIVE"
        and (a.get("ActorClassName") or "") == f"ServeReplica:ferry:{deployment}"
    ]


class Load:
    """``clients`` closed loops of classify; every request's (start, end, status, tries)."""

    def __init__(
        self,
        base: str,
        png: bytes,
        clients: int,
        deadline_s: float,
        retry: bool,
        model: str = "digits",
        content_type: str = "image/png",
    ):
        self.base, self.png, self.clients = base, png, clients
        self.model, self.content_type = model, content_type
        self.deadline_s, self.retry = deadline_s, retry
        self.records: list[tuple[float, float, int, int, str]] = []  # ... why, if not 200
        self.stop = threading.Event()

    async def _one(self, c) -> tuple[int, int, str]:
        t_end = time.monotonic() + self.deadline_s
        tries = 0
        while True:
            tries += 1
            left = t_end - time.monotonic()
            status, wait, why, ferry = 0, 0.2, "", False
            try:
                r = await c.post(
                    f"/v1/models/{self.model}/classify",
                    content=self.png,
                    headers={
                        "content-type": self.content_type,
                        "x-deadline-ms": str(max(1, int(left * 1e3))),
                    },
                    timeout=max(0.1, left),
                )
                status = r.status_code
                ferry = r.headers.get("content-type", "").startswith("application/json")
                why = "" if status == 200 else (r.json().get("error", "") if ferry else r.text)[:80]
                if status == 504 and ferry and "DeadlineExceeded" in r.text:
                    return status, tries, why  # the deadline itself passed: no retry
                wait = min(float(r.headers.get("retry-after", 0.2)), 0.5)
            except Exception as exc:  # connection refused or reset, or no answer in time
                status, why = -1, type(exc).__name__
            retryable = status in RETRY | {-1} or (status in PROXY_RETRY and not ferry)
            if status == 200 or not self.retry or not retryable:
                return status, tries, why
            if time.monotonic() + wait >= t_end:
                return status, tries, why
            await asyncio.sleep(wait * min(tries, 3) / 3)

    async def _client(self) -> None:
        import httpx

        async with httpx.AsyncClient(base_url=self.base) as c:
            while not self.stop.is_set():
                t0 = time.monotonic()
                status, tries, why = await self._one(c)
                self.records.append((t0, time.monotonic(), status, tries, why))

    def run(self) -> threading.Thread:
        async def main():
            await asyncio.gather(*(self._client() for _ in range(self.clients)))

        t = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
        t.start()
        return t

    def summary(self, records=None) -> dict:
        return self.summary_of(self.records if records is None else records, self.deadline_s)

    @staticmethod
    def summary_of(recs, deadline_s: float) -> dict:
        n = len(recs)
        ok = sum(1 for r in recs if r[2] == 200)
        lat = sorted(r[1] - r[0] for r in recs)
        statuses: dict[str, int] = {}
        for r in recs:
            statuses[str(r[2])] = statuses.get(str(r[2]), 0) + 1
        return {
            "requests": n,
            "succeeded": ok,
            "success_rate": round(ok / n, 5) if n else None,
            "retried": sum(1 for r in recs if r[3] > 1),
            "hung_past_deadline": sum(1 for x in lat if x > deadline_s + 1.0),
            "worst_s": round(lat[-1], 3) if lat else None,
            "p99_s": round(lat[int(0.99 * (n - 1))], 3) if lat else None,
            "final_statuses": statuses,
            "failed_as": _failed_as(recs),
        }


def chaos(base, png, cfg, duration, kill_every, clients, deadline_s) -> dict:
    import ray

    target = _target(cfg)
    load = Load(base, png, clients, deadline_s, retry=True)
    thread = load.run()
    kills = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < duration:
        time.sleep(kill_every)
        names = _alive(target)
        if names:
            victim = names[len(kills) % len(names)]
            ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
            kills.append(round(time.monotonic() - t0, 1))
    load.stop.set()
    thread.join(deadline_s + 5)
    return {
        "killed": target,
        "kills_at_s": kills,
        "duration_s": duration,
        "clients": clients,
        "deadline_s": deadline_s,
        **load.summary(),
    }


def _failed_as(records) -> dict[str, int]:
    """The requests that did not end in 200, counted by their status and why (the
    exception, or the error's text)."""
    out: dict[str, int] = {}
    for r in records:
        if r[2] != 200:
            k = f"{r[2]} {r[4]}".strip()
            out[k] = out.get(k, 0) + 1
    return out


def _in_flight_at(records, t) -> list:
    return [r for r in records if r[0] <= t < r[1]]


def _phase(records, t: float, t_end: float) -> dict:
    """The requests in flight at ``t`` (each must end in 200) and those started until
    ``t_end``; a dropped one by its status and why (the exception, or the error's text)."""
    inflight = _in_flight_at(records, t)
    dropped = _failed_as(inflight)
    return {
        "in_flight_at_start": len(inflight),
        "in_flight_finished_200": sum(1 for r in inflight if r[2] == 200),
        "dropped": sum(dropped.values()),
        "dropped_as": dropped,
        "took_s": round(t_end - t, 2),
        "started_during": Load.summary_of([r for r in records if t <= r[0] < t_end], 30.0),
    }


def _under_load(base, png, clients, act, model: str = "digits") -> dict:
    """Run ``act()`` (which returns its phases' (name, start, end)) 5 s into the load;
    stop the load 1 s after."""
    ct = "image/png" if model == "digits" else "image/jpeg"
    load = Load(base, png, clients, 30.0, retry=False, model=model, content_type=ct)
    thread = load.run()
    time.sleep(5)
    marks = act()
    time.sleep(1)
    load.stop.set()
    thread.join(40)
    return {name: _phase(load.records, t, t_end) for name, t, t_end in marks}


def drain(base, png, cfg, clients, port, model: str = "digits") -> dict:
    """redeploy (a changed config), then ``serve.shutdown()`` -- Serve's own stop: it kills
    the HTTP proxies at once --; then, on a fresh Serve, ``deployments.stop``: the app
    deleted first (the proxies still answer while its replicas drain), then Serve."""
    from ray import serve

    def redeploy_then_shutdown():
        changed = cfg.model_copy(deep=True)
        changed.batching.max_wait_ms = cfg.batching.max_wait_ms + 1  # a new version
        t0 = time.monotonic()
        _deploy(changed)
        t1 = time.monotonic()
        time.sleep(5)
        t2 = time.monotonic()
        serve.shutdown()
        return [("redeploy", t0, t1), ("serve_shutdown", t2, time.monotonic())]

    def app_first():  # python -m deployments.stop
        from deployments.stop import stop

        t0 = time.monotonic()
        stop(["ferry"])
        return [("deployments_stop", t0, time.monotonic())]

    out = _under_load(base, png, clients, redeploy_then_shutdown, model)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    _deploy(cfg)
    out.update(_under_load(base, png, clients, app_first, model))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", help="a Serve config file (default: the CPU test app)")
    ap.add_argument("--duration", type=float, default=120)
    ap.add_argument("--kill-every", type=float, default=15)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--deadline-s", type=float, default=10)
    ap.add_argument("--port", type=int, default=8123)
    ap.add_argument("--models", help="with --config: serve only these models (comma-separated)")
    ap.add_argument("--cpus", type=int, default=6, help="the local cluster's logical CPUs")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "reliability.json"))
    ap.add_argument("--drain-only", action="store_true", help="keep the chaos section as it is")
    ap.add_argument("--chaos-only", action="store_true", help="keep the drain section as it is")
    ap.add_argument(
        "--drain-model",
        default="digits",
        choices=("digits", "resnet50"),
        help="the drain's requests: digits PNGs, or resnet50 photos (each in flight longer; "
        "the CPU test app then serves resnet50 too, a --config must)",
    )
    ap.add_argument(
        "--placement",
        choices=("one_process",),
        help="the CPU test app in this form (a replica killed is then the one that holds the "
        "request, as in serve_config.gpu.yaml); its sections are chaos_one_process, ...",
    )
    a = ap.parse_args()
    import ray
    from ray import serve

    from pipeline.imaging import encode_jpeg, encode_png
    from pipeline.models import digits

    png = encode_png(digits.load_split()[2][0])
    ray.init(num_cpus=a.cpus, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": a.port})
    base = f"http://127.0.0.1:{a.port}"
    cfg = _pipeline_config(a.config, a.models, a.drain_model, a.placement)
    _deploy(cfg)
    gpu = "GPU" if cfg.executor.backend == "cupy" else "no GPU"
    doc = read_results(a.out)
    key = "_gpu" if a.config else f"_{a.placement}" if a.placement else ""
    if not a.drain_only:
        doc[f"chaos{key}"] = {
            "machine": f"{platform.node()}: {os.cpu_count()} cores, {gpu}",
            "date": datetime.date.today().isoformat(),
            "config": (
                f"{a.config} (models: {a.models or 'all'})"
                if a.config
                else "CPU test app, one_process: digits, 2 Ingress replicas (each its executor)"
                if a.placement
                else "CPU test app: digits, 2 Inference replicas"
            ),
            "method": __doc__.split("chaos: ")[1].split("\n\n")[0].replace("\n", " "),
            **chaos(base, png, cfg, a.duration, a.kill_every, a.clients, a.deadline_s),
        }
        time.sleep(10)  # the last kill's replacement
    if not a.chaos_only:
        doc[f"drain{key}"] = {
            "date": datetime.date.today().isoformat(),
            "method": __doc__.split("drain: ")[1].split("\n\n")[0].replace("\n", " "),
            "requests": f"{a.drain_model} classify"
            + (" (scikit-image's chelsea, 451x300 JPEG)" if a.drain_model == "resnet50" else ""),
            **drain(
                base,
                encode_jpeg(_chelsea()) if a.drain_model == "resnet50" else png,
                cfg,
                a.clients,
                a.port,
                a.drain_model,
            ),
        }
    write_results(a.out, doc)
    print(json.dumps({k: doc[k] for k in (f"chaos{key}", f"drain{key}") if k in doc}, indent=1))
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
