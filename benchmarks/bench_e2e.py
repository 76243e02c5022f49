"""End to end over HTTP: Ferry's placements against Ray Serve peers, on two image corpora.

    python benchmarks/bench_e2e.py [--systems ferry,rayserve_expert_8,...] [--corpus chelsea,photos]
        [--clients 1,16,64,256,512,1024] [--seconds 15] [--set executor.max_in_flight=4 ...]
        [--out benchmarks/results/e2e.json]

Systems (``SYSTEMS``): Ferry's placements -- ``ferry`` (the whole pipeline in each of 8
replicas of one deployment sharing the GPU), ``ferry_split`` (ingress replicas, one Serve
hop to GPU inference replicas), ``ferry_4stage`` (four deployments, JPEGs decoded on CPU
threads), ``ferry_naive`` (``ferry`` in the executor's naive mode) -- and the peers: the
usual Ray Serve app (``rayserve_batch_*``, ``benchmarks/peers/rayserve_batch.py``) and the
expert one (``rayserve_expert_{4,8,12}``, N replicas, ``benchmarks/peers/rayserve_expert.py``).
``--set section.key=value`` (repeatable; the value is YAML) changes the pipeline config of
every Ferry system in the run, for experiments; such rows are named ``system[key=value,...]``
so they never replace the plain system's.

Every system is started with ``serve run`` as its own Ray cluster on this machine, warmed,
then driven by the same closed-loop load generator (``benchmarks/loadgen.py``: aiohttp over
several processes; its own CPU use is recorded beside every row) with each corpus in turn
(``loadtest.corpus``: ``chelsea``, one 451x300 photo; ``photos``, 16 real photos of
640x480 to 1920x1080 cycled per request) at each concurrency, one system after the other.
Rows are merged into the output file by (system, corpus), so systems can be measured in
several commands on one machine. For Ferry the answers' per-stage timings are averaged too.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import loadgen  # noqa: E402
from benchmarks.common import commit, machine, today, write_json  # noqa: E402
from benchmarks.mps import mps_server  # noqa: E402
from loadtest.cores import busiest, busy_cores_since, run_cpu_s, thread_cpu_s  # noqa: E402
from loadtest.corpus import Corpus, corpus  # noqa: E402
from loadtest.run import end_local_ray, start_app, wait_ok  # noqa: E402

JPEG = {"content-type": "image/jpeg"}
CONFIGS = os.path.join(ROOT, "benchmarks", "configs")
# HAProxy in front of the replicas; Serve's throughput-optimized mode: gRPC between
# deployments and user code on the replica's own event loop (on the 2-core machine: 17-23%
# more img/s, a third less ingress CPU per request; RESULTS.md)
FERRY_ENV = {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"}
HAPROXY = {"RAY_SERVE_ENABLE_HA_PROXY": "1"}


def _ferry(config: str, naive: bool = False) -> dict[str, Any]:
    return {
        "kind": "ferry",
        "env": FERRY_ENV,
        "config": os.path.join(CONFIGS, config),
        "naive": naive,
    }


def _peer(
    module: str, replicas: int, env: dict[str, str], startup_s: float = 300, **args: Any
) -> dict[str, Any]:
    """A peer app: ``args`` go to its ``build_app`` beside ``replicas``."""
    return {
        "kind": "peer",
        "module": module,
        "replicas": replicas,
        "env": env,
        "startup_s": startup_s,
        "args": {"replicas": replicas, **args},
    }


SYSTEMS: dict[str, dict[str, Any]] = {
    "ferry": _ferry("ferry_e2e.yaml"),
    "ferry_split": _ferry("ferry_e2e_split.yaml"),
    "ferry_4stage": _ferry("ferry_e2e_4stage.yaml"),
    "ferry_naive": _ferry("ferry_e2e.yaml", naive=True),
    "rayserve_batch_1rep": _peer("rayserve_batch", 1, {}),
    "rayserve_batch_4rep": _peer("rayserve_batch", 4, {}),
    "rayserve_batch_haproxy_4rep": _peer("rayserve_batch", 4, HAPROXY),
    "rayserve_batch_haproxy_8rep": _peer("rayserve_batch", 8, HAPROXY),
    # HAProxy and Serve's throughput mode, as Ferry gets; torch.compile takes minutes to start
    **{f"rayserve_expert_{n}": _peer("rayserve_expert", n, FERRY_ENV, 600) for n in (4, 8, 12)},
    # the same with one torch CPU thread a replica, and a sleeping wait for each batch
    **{
        f"rayserve_expert_{n}_t1": _peer("rayserve_expert", n, FERRY_ENV, 600, threads=1)
        for n in (4, 8, 12)
    },
    **{
        f"rayserve_expert_{n}_t1_block": _peer(
            "rayserve_expert", n, FERRY_ENV, 600, threads=1, blocking=True
        )
        for n in (4, 8, 12)
    },
}


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``["executor.max_in_flight=4", ...]`` -> ``{"executor.max_in_flight": 4}`` (values YAML)."""
    import yaml

    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or key.startswith(".") or key.endswith("."):
            raise ValueError(f"--set wants section.key=value, got {item!r}")
        out[key] = yaml.safe_load(value)
    return out


def apply_sets(pipeline: dict[str, Any], sets: dict[str, Any]) -> dict[str, Any]:
    """``pipeline`` (a Ferry config dict) with each dotted key set; missing sections made."""
    for key, value in sets.items():
        *path, leaf = key.split(".")
        node = pipeline
        for part in path:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"--set {key}: {part} is not a section")
        node[leaf] = value
    return pipeline


def row_name(name: str, spec: dict[str, Any], sets: dict[str, Any], mps: bool = False) -> str:
    """The system's row name: ``--set``s in brackets (Ferry's), ``+mps`` under CUDA MPS."""
    tail = "+mps" if mps else ""
    if spec["kind"] != "ferry" or not sets:
        return name + tail
    return f"{name}[{','.join(f'{k}={v}' for k, v in sets.items())}]{tail}"


def serve_config(name: str, spec: dict[str, Any], sets: dict[str, Any] | None = None) -> str:
    """The file ``serve run`` gets for ``spec``: a temporary YAML, for the caller to delete."""
    import yaml

    if spec["kind"] == "ferry":
        with open(spec["config"]) as f:
            cfg = yaml.safe_load(f)
        pipeline = cfg["applications"][0]["args"]["config"]
        if spec.get("naive"):
            pipeline["executor"]["mode"] = "naive"
        apply_sets(pipeline, sets or {})
    else:
        cfg = {
            "proxy_location": "EveryNode",
            "http_options": {"host": "0.0.0.0", "port": 8000},
            "logging_config": {"encoding": "TEXT", "log_level": "WARNING"},
            "applications": [
                {
                    "name": "peer",
                    "route_prefix": "/classify",
                    "import_path": f"benchmarks.peers.{spec['module']}:build_app",
                    "args": spec["args"],
                }
            ],
        }
    fd, path = tempfile.mkstemp(prefix=f"{name}_", suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(cfg, f)
    return path


def url_of(spec: dict[str, Any]) -> str:
    return (
        "http://127.0.0.1:8000/v1/models/resnet50/classify"
        if spec["kind"] == "ferry"
        else "http://127.0.0.1:8000/classify"
    )


def stop(proc: subprocess.Popen | None) -> None:
    end_local_ray(proc, timeout=45)
    time.sleep(3)


def port_taken(port: int = 8000) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _exit_on_term(signum: int, frame: Any) -> None:
    # `timeout` sends SIGTERM: leave through the `finally` that stops the system under test,
    # or it keeps answering on port 8000 and the next run measures it instead of its own
    raise SystemExit(128 + signum)


def measure(
    system: str,
    url: str,
    c: Corpus,
    n: int,
    args: argparse.Namespace,
    collect: bool,
    run_id: str,
    replicas: int | None = None,
) -> tuple[dict[str, Any], dict[str, float] | None]:
    """One load level: its row, and Ferry's mean per-stage timings when ``collect``.
    ``run_id``: the system's ``serve run`` (its processes' CPU is the server's)."""
    mark, _ = busy_cores_since()
    cpu0, threads0, t0 = run_cpu_s(run_id), thread_cpu_s(run_id), time.monotonic()
    r = loadgen.run(
        url, c.bodies, "image/jpeg", n, args.seconds, warmup=args.warmup, collect_timings=collect
    )
    # warm-up included: the level's whole span, its rate taken as the measured one
    wall_s = max(time.monotonic() - t0, 1e-9)
    server_cores = (run_cpu_s(run_id) - cpu0) / wall_s
    threads = busiest(threads0, thread_cpu_s(run_id), wall_s)
    _, busy = busy_cores_since(mark)
    row = {
        "system": system,
        "corpus": c.name,
        "replicas": replicas,
        "mps": args.mps,
        "clients": n,
        "img_s": r["img_s"],
        "p50_ms": r["p50_ms"],
        "p99_ms": r["p99_ms"],
        "errors": r["errors"],
        "loadgen_procs": r["loadgen_procs"],
        "loadgen_cpu_per_proc": r["loadgen_cpu_per_proc"],
        "machine_busy_cores": busy,
        "server_cores": round(server_cores, 2),
        # the server's CPU per answered image: every process of its `serve run` (Ray, Serve,
        # HAProxy, replicas), the load generator excluded
        "server_cpu_ms_per_img": round(server_cores / r["img_s"] * 1e3, 3) if r["img_s"] else None,
        # where those cores went: the busiest (process kind, thread name) pairs
        "server_threads": threads,
    }
    print(
        f"   {c.name:>7} {n:>5} clients: {r['img_s']:8.1f} img/s  p50 {r['p50_ms']} ms  "
        f"p99 {r['p99_ms']} ms  errors {r['errors']}  loadgen cpu {r['loadgen_cpu_per_proc']}  "
        f"busy cores {busy}  server cpu {row['server_cpu_ms_per_img']} ms/img",
        flush=True,
    )
    for t in threads[:6]:
        print(f"      {t['cores']:6.2f} cores  {t['process']} / {t['thread']}", flush=True)
    return row, r.get("mean_timings_ms")


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--systems", default="ferry,ferry_naive,rayserve_batch_haproxy_8rep,rayserve_expert_8"
    )
    ap.add_argument("--corpus", default="chelsea,photos", help="corpora, each at every level")
    ap.add_argument("--clients", default="1,16,64,256,512,1024")
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--warmup", type=float, default=2)
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    ap.add_argument("--out", default="benchmarks/results/e2e.json")
    ap.add_argument("--log-dir", default=None)
    ap.add_argument(
        "--mps",
        action="store_true",
        help="run every system as clients of one CUDA MPS server (rows named system+mps)",
    )
    args = ap.parse_args()
    sets = parse_sets(args.set)
    names = [s for s in args.systems.split(",") if s]
    unknown = [s for s in names if s not in SYSTEMS]
    if unknown:
        ap.error(f"unknown systems {unknown}; known: {', '.join(SYSTEMS)}")
    corpora = [corpus(c) for c in args.corpus.split(",") if c]
    levels = [int(c) for c in args.clients.split(",")]
    log_dir = args.log_dir or os.path.dirname(os.path.abspath(args.out))
    os.makedirs(log_dir, exist_ok=True)
    previous = json.load(open(args.out)) if os.path.exists(args.out) else {}
    measuring = {(row_name(s, SYSTEMS[s], sets, args.mps), c.name) for s in names for c in corpora}
    rows = [r for r in previous.get("rows", []) if (r["system"], r["corpus"]) not in measuring]
    breakdown = {
        k: v
        for k, v in previous.get("ferry_breakdown", {}).items()
        if tuple(k.split("@")[:2]) not in measuring
    }
    described = {**previous.get("corpora", {}), **{c.name: c.description for c in corpora}}
    runs = dict(previous.get("runs", {}))
    runs[f"run{len(runs) + 1}"] = (
        f"{today()}, commit {commit()}: {', '.join(names)} on {', '.join(c.name for c in corpora)}"
        + (f", with {sets}" if sets else "")
    )
    signal.signal(signal.SIGTERM, _exit_on_term)
    with mps_server(args.mps):
        for name in names:
            run_system(
                name,
                corpora,
                levels,
                args,
                sets,
                log_dir,
                rows,
                breakdown,
                save=lambda: _write(args, described, runs, rows, breakdown),
            )
    _write(args, described, runs, rows, breakdown)
    try:
        from loadtest.run import plot

        png = os.path.splitext(args.out)[0] + ".png"
        plot(rows, png, "ResNet-50 over HTTP, by corpus", split_by="corpus")
    except Exception as exc:  # a plot must not lose the numbers
        print(f"plot failed: {exc}")
    return 0


def run_system(
    name: str,
    corpora: list[Corpus],
    levels: list[int],
    args: argparse.Namespace,
    sets: dict[str, Any],
    log_dir: str,
    rows: list[dict[str, Any]],
    breakdown: dict[str, Any],
    save: Any,
) -> None:
    """Start ``name``, measure it on every corpus at every level into ``rows`` (and Ferry's
    per-stage timings into ``breakdown``), ``save()`` after each level, and stop it by PID."""
    spec, system = SYSTEMS[name], row_name(name, SYSTEMS[name], sets, args.mps)
    print(f"== {system}", flush=True)
    if port_taken():  # something left from an earlier run would answer for this system
        stop(None)
        if port_taken():
            print(f"{name} not run: port 8000 is taken by another process", flush=True)
            return
    t0 = time.time()
    config = serve_config(name, spec, sets)
    proc = start_app(config, os.path.join(log_dir, f"serve_{name}.log"), spec["env"])
    try:
        url = url_of(spec)
        first = corpora[0].bodies[0]
        up = wait_ok(url, spec.get("startup_s", 300), body=first, headers=JPEG, request_timeout=10)
        if not up:
            print(f"{name} did not come up; see serve_{name}.log", flush=True)
            return
        print(f"   up in {time.time() - t0:.0f} s", flush=True)
        for c in corpora:
            loadgen.run(url, c.bodies, "image/jpeg", 32, 4, warmup=1)  # warm every path
            for n in levels:
                row, timings = measure(
                    system,
                    url,
                    c,
                    n,
                    args,
                    spec["kind"] == "ferry",
                    proc.ferry_run_id,
                    spec.get("replicas"),
                )
                rows.append(row)
                if timings:
                    breakdown[f"{system}@{c.name}@{n}"] = timings
                save()  # a run cut off keeps every level it measured
    finally:
        stop(proc)
        os.unlink(config)


def _write(
    args: argparse.Namespace, corpora: dict[str, str], runs: dict, rows: list, breakdown: dict
) -> None:
    out = {
        "machine": machine(),
        "date": today(),
        "corpora": corpora,
        "runs": runs,
        "method": f"closed-loop clients, {args.seconds:.0f} s per level after {args.warmup:.0f} s warm-up, "
        "aiohttp load generator in several processes (benchmarks/loadgen.py), one system after the other",
        "rows": rows,
        "ferry_breakdown": breakdown,
    }
    write_json(args.out, out)


if __name__ == "__main__":
    sys.exit(main())
