"""Ferry's own Python cost a request, without Serve, HTTP or other processes: the ingress of a
``one_process`` config built in this process (its inference stage in it), and ``--clients``
closed-loop callers sending a real image to its ASGI app (``FerryApp``, the route HAProxy's
requests take) in one event loop, under cProfile over ``--seconds``.

    python benchmarks/profile_ingress.py [--config benchmarks/configs/cpu_one_process.yaml]
        [--clients 128] [--seconds 10] [--top 40] [--image auto|digit|chelsea]
    python benchmarks/profile_ingress.py --system ferry_torch_dyn [--set preprocess.threads=2]
    python benchmarks/profile_ingress.py --gpu-path [--config ...]   # the GPU form's rounds, on the CPU

``--system``: a Ferry system of ``bench_e2e.py`` (its config with its sets, and ``--set``s
after them), as one of its replicas runs it -- on the GPU machine, the GPU path's loop.

Prints the answers a second, the event loop thread's CPU a request (``time.thread_time``: the
decode and submit threads are apart), every thread's CPU a request by name (the process's
whole host cost: the decode rounds, the submit and completion threads, nvImageCodec's), every
thread's context switches a request (each a sleep and a wake-up: the hand-offs) and
the functions that took most of the loop's thread. The
loop runs every request's ASGI path, the coalescer, the scheduler's and the completion's
callbacks: what a replica's event loop runs beside Serve's own HTTP and request handling
(``profile_pipeline.py --bare`` measures that floor). cProfile slows every Python call alike:
read the shares; ``--no-profile`` gives the unprofiled CPU a request. ``PROFILE_SORT=cumulative``
lists the functions by their time with their callees (``tottime`` by default);
``PROFILE_CALLERS=<regex>`` adds who called the functions it matches.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import itertools
import os
import pstats
import sys
import time
from typing import Any

import yaml

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.profile_pipeline import image_of, request_body  # noqa: E402


def system_config(name: str, sets: list[str]) -> str:
    """A temporary copy of the Ferry system ``name``'s config (``bench_e2e``'s, its sets and
    ``sets`` applied), for the caller to delete."""
    from benchmarks.e2e_configs import parse_sets, serve_config
    from benchmarks.e2e_systems import SYSTEMS

    spec = SYSTEMS[name]
    if spec["kind"] != "ferry":
        raise SystemExit(f"--system {name}: not a Ferry system (a peer has no Ferry ingress)")
    return serve_config(name, spec, parse_sets(sets))


def threads_cpu_s(switches: bool = False) -> dict[str, float]:
    """CPU seconds so far of this process's threads, by name (``switches``: their context
    switches instead)."""
    from loadtest.cores import process_threads_cpu_s, process_threads_switches

    with open("/proc/self/cmdline", "rb") as f:
        cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
    read = process_threads_switches if switches else process_threads_cpu_s
    return read(os.getpid(), cmd)


def gpu_path_on_cpu() -> None:
    """Build the inference stage's decoder as the GPU one-process form does -- the local GPU
    preprocess core (``pipeline.preprocess_gpu``: each image an item of its scheduler's next
    round, the round on a ``ferry-pre-gpu`` thread, the rows handed to the inference
    scheduler) -- on the executor's CPU backend, its JPEGs decoded on CPU threads (no
    nvImageCodec): the GPU path's hand-offs and loop work, measurable on a machine without
    a GPU."""
    from pipeline.preprocess_gpu.stage import PreprocessGpuCore
    from pipeline.stages import build as stages_build
    from pipeline.stages.decode import PreprocessStage

    class Local:
        def __init__(self, config: Any, executor: Any) -> None:
            cpu = PreprocessStage(config, fitted=False)
            backend, pool = executor.backend, executor.pool
            self.core = PreprocessGpuCore(config, cpu, local=True, pool=pool, backend=backend)

        async def run(self, model: str, items: list) -> Any:
            return await self.core.process(model, items)

        def check_health(self) -> None:
            pass

        def close(self) -> None:
            self.core.close()

    stages_build.local_decoder = Local


def build(config_path: str) -> tuple[Any, str]:
    """The ingress of the config's Ferry app, built here (its inference stage in-process), and
    its first model's name."""
    from deployments.ingress import Ingress
    from deployments.ingress_http import app
    from pipeline.config import PipelineConfig

    with open(config_path) as f:
        doc = yaml.safe_load(f)
    cfg = next(a for a in doc["applications"] if a["import_path"].startswith("deployments"))
    config = PipelineConfig.model_validate(cfg["args"]["config"])
    cls = next(k for k in Ingress.func_or_class.__mro__ if "_coalescer" in k.__dict__)
    ingress = cls.__new__(cls)
    cls.__init__(ingress, config.model_dump(mode="json"), way="in_process")
    ingress.app = app
    app.state.ingress = ingress
    return ingress, config.models[0].name


_IDS = itertools.count()


async def call(app: Any, path: str, body: bytes, ctype: str) -> int:
    """One request through the ASGI app; its status. It carries an ``X-Request-ID``, as
    every request through Serve's HAProxy does (HAProxy sets one where the client did not)."""
    sent = False
    status = 0

    async def receive() -> dict:
        nonlocal sent
        if sent:
            await asyncio.sleep(3600)
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(msg: dict) -> None:
        nonlocal status
        if msg["type"] == "http.response.start":
            status = msg["status"]

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 1),
        "headers": [(b"content-type", ctype.encode()), (b"content-length", str(len(body)).encode()),
                    (b"x-request-id", b"%d" % next(_IDS))],
    }  # fmt: skip
    await app(scope, receive, send)
    return status


async def drive(app: Any, path: str, body: bytes, ctype: str, clients: int, seconds: float) -> dict:
    """``clients`` closed loops for ``seconds`` (after one second of warm-up)."""
    counts = {"ok": 0, "bad": 0}
    stop = time.perf_counter() + 1.0 + seconds
    start = [0.0, 0.0]
    threads0: dict[str, float] = {}
    switches0: dict[str, float] = {}

    async def client() -> None:
        while time.perf_counter() < stop:
            s = await call(app, path, body, ctype)
            if start[0]:
                counts["ok" if s == 200 else "bad"] += 1

    async def clock() -> None:
        await asyncio.sleep(1.0)
        start[0], start[1] = time.perf_counter(), time.thread_time()
        threads0.update(threads_cpu_s())
        switches0.update(threads_cpu_s(switches=True))

    await asyncio.gather(clock(), *(client() for _ in range(clients)))
    wall, cpu = time.perf_counter() - start[0], time.thread_time() - start[1]
    done = counts["ok"] + counts["bad"]
    n = max(done, 1)
    used = {k: v - threads0.get(k, 0.0) for k, v in threads_cpu_s().items()}
    by_thread = {k: round(v * 1e3 / n, 4) for k, v in sorted(used.items(), key=lambda kv: -kv[1])}
    return {
        **counts,
        "per_s": done / wall,
        "loop_cpu_ms_per_request": cpu * 1e3 / n,
        "process_cpu_ms_per_request": sum(used.values()) * 1e3 / n,
        "threads_cpu_ms_per_request": {k: v for k, v in by_thread.items() if v > 0},
        "switches_per_request": {
            k: round((v - switches0.get(k, 0.0)) / n, 3)
            for k, v in sorted(threads_cpu_s(switches=True).items(), key=lambda kv: -kv[1])
            if v - switches0.get(k, 0.0) > 0
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--config", default="benchmarks/configs/cpu_one_process.yaml")
    ap.add_argument("--system", help="a Ferry system of bench_e2e.py instead of --config")
    ap.add_argument("--set", action="append", default=[], help="with --system: key=value")
    ap.add_argument("--clients", type=int, default=128)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--image", default="auto", choices=["auto", "digit", "chelsea"])
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument(
        "--gpu-path",
        action="store_true",
        help="the GPU one-process form's decode rounds and hand-offs on the CPU backend "
        "(gpu_path_on_cpu): its loop and threads' cost a request without a GPU",
    )
    args = ap.parse_args(argv)
    if args.gpu_path:
        gpu_path_on_cpu()
    if args.system:
        config = system_config(args.system, args.set)
        try:
            ingress, model = build(config)
        finally:
            os.unlink(config)
    else:
        ingress, model = build(args.config)
    body, ctype = request_body(image_of(model, args.image))
    path = f"/v1/models/{model}/classify"
    prof = None if args.no_profile else cProfile.Profile()

    async def run() -> dict:
        if prof is not None:
            prof.enable()  # (in the loop's own thread, from inside the loop)
        try:
            return await drive(ingress.app, path, body, ctype, args.clients, args.seconds)
        finally:
            if prof is not None:
                prof.disable()

    out = asyncio.run(run())
    print({k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()})
    if prof is not None:
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(
            os.environ.get("PROFILE_SORT", "tottime")
        ).print_stats(args.top)
        if os.environ.get("PROFILE_CALLERS"):
            pstats.Stats(prof, stream=buf).print_callers(os.environ["PROFILE_CALLERS"])
        print(buf.getvalue())
    return 0 if out["bad"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
