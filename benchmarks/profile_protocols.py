"""Where a v2 request's CPU goes over HTTP and over gRPC: CPU ms per request in each process
of one Ferry app, the same perf_analyzer load over each protocol in turn.

    python benchmarks/profile_protocols.py [--config serve_config.yaml] [--model digits]
        [--concurrency 8] [--window-ms 4000] [--rounds 2] [--no-haproxy]
        [--protocols http,grpc,grpc_stream] [--ports 8000,9000] [--out FILE] [--spy DIR]

Starts the config with ``serve run`` on a Ray of its own (``bench_perf_analyzer``'s way,
``--ports`` for other ports), then per round runs ``perf_analyzer -i http``, ``-i grpc``
and (``grpc_stream``) ``-i grpc --streaming`` against the model, and reads the CPU time of this run's own processes -- the
proxy or HAProxy, each replica, by kind and by thread (``profile_pipeline``'s readers; other
Ray clusters on the machine are left out by their run id) -- before and after. The requests
are the app's own count (the statistics extension's successes), so each process's CPU ms
per request is exact whatever perf_analyzer's windows did; the background each process
burns idle, measured once over ``--idle-s``, is taken off. This is what says whether a
protocol's difference is Ferry's code, Serve's request path or gRPC's own threads
(``event_engine``, ``grpc_global_tim``). Each row also has the ingress's calls downstream
over the run and their ``mean_group`` (requests a call), from Ray's metrics endpoint
(``ray_ferry_ingress_groups_total``): fewer requests a call is more Serve calls, in the
ingress and in every stage after it, for the same requests.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import httpx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import ray_probe  # noqa: E402
from benchmarks.bench_perf_analyzer import (  # noqa: E402
    config_on_ports,
    pa_interface,
    perf_analyzer,
    stop,
)
from benchmarks.common import commit, machine, today, write_json  # noqa: E402
from benchmarks.e2e_systems import FERRY_ENV  # noqa: E402
from benchmarks.profile_pipeline import (  # noqa: E402
    cpu_times,
    per_thread,
    ray_processes,
    start_spies,
    thread_cpu_times,
)
from loadtest.run import start_app, wait_ok  # noqa: E402


def answered(base: str, model: str) -> int:
    """The app's successful requests of ``model`` so far (the statistics extension)."""
    stats = httpx.get(f"{base}/v2/models/{model}/stats", timeout=30).json()
    return int(stats["model_stats"][0]["inference_stats"]["success"]["count"])


def one_run(
    pa: str, protocol: str, args: argparse.Namespace, pids: dict, idle: dict, label: str = ""
) -> dict:
    """perf_analyzer over ``protocol``; each process's CPU ms per request answered (with
    ``--spy``, py-spy's raw stacks of the replicas over its first ``--spy-s`` seconds, in
    ``SPY/label``)."""
    base = f"http://127.0.0.1:{args.http_port}"
    port = args.http_port if protocol == "http" else args.grpc_port
    out = os.path.join(tempfile.mkdtemp(prefix="profile_protocols_"), "pa.csv")
    cmd = [pa, "-m", args.model, "-u", f"127.0.0.1:{port}", *pa_interface(protocol)]
    cmd += ["--concurrency-range", str(args.concurrency), "-p", str(args.window_ms)]
    cmd += ["-s", "100", "-r", "10", "-f", out]
    g0 = ray_probe.ingress_groups()
    n0, cpu0, th0 = answered(base, args.model), cpu_times(pids), thread_cpu_times(pids)
    t0 = time.perf_counter()
    spies = start_spies(pids, os.path.join(args.spy, label), args.spy_s) if args.spy else []
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    for s in spies:
        s.wait()
    wall = time.perf_counter() - t0
    n, cpu1, th1 = answered(base, args.model) - n0, cpu_times(pids), thread_cpu_times(pids)
    row: dict[str, Any] = {"protocol": protocol, "requests": n, "wall_s": round(wall, 1)}
    if r.returncode == 0 and os.path.exists(out):
        with open(out) as f:
            line = f.read().splitlines()[1]
        row["pa_infer_s"] = round(float(line.split(",")[1]), 1)
    else:
        row["pa_error"] = (r.stdout[-400:] + r.stderr[-400:]).strip()
    n = max(n, 1)
    row["cpu_ms_per_request"] = {
        k: round((cpu1[k] - cpu0.get(k, 0.0) - idle.get(k, 0.0) * wall) * 1e3 / n, 3)
        for k in sorted(cpu1, key=lambda k: -(cpu1[k] - cpu0.get(k, 0.0)))
    }
    row["threads_ms_per_request"] = per_thread(th0, th1, n)
    # the ingress's calls downstream over the run: a request of perf_analyzer's is one item
    g1 = ray_probe.ingress_groups_after(g0, n)
    if g1 is not None and g1[0] > g0[0]:
        row["ingress_calls"] = round(g1[0] - g0[0])
        row["mean_group"] = round((g1[1] - g0[1]) / (g1[0] - g0[0]), 2)
    return row


def arguments() -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--config", default="serve_config.yaml")
    ap.add_argument("--model", default="digits", help="a model of tensors (perf_analyzer's input)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--window-ms", type=int, default=4000, help="perf_analyzer's -p")
    ap.add_argument("--rounds", type=int, default=2, help="the protocols in turn, this many times")
    ap.add_argument(
        "--protocols",
        default="http,grpc",
        help="of http, grpc, grpc_stream (-i grpc --streaming: one ModelStreamInfer stream a "
        "client)",
    )
    ap.add_argument("--idle-s", type=float, default=5.0)
    ap.add_argument("--no-haproxy", action="store_true", help="Serve's own Python proxy")
    ap.add_argument("--ports", default="8000,9000", help="HTTP,gRPC")
    ap.add_argument("--out", default=None, help="write the result to this JSON file")
    ap.add_argument(
        "--spy",
        default=None,
        help="also sample the replicas with py-spy during each run (raw stacks in this "
        "folder, a subfolder a run; summarise with scripts/spy_top.py)",
    )
    ap.add_argument("--spy-s", type=float, default=8.0, help="seconds sampled a run")
    args = ap.parse_args()
    args.http_port, args.grpc_port = (int(p) for p in args.ports.split(","))
    return args


def main() -> int:
    args = arguments()
    pa = perf_analyzer()
    tmp = tempfile.mkdtemp(prefix="profile_protocols_")
    config = config_on_ports(os.path.join(ROOT, args.config), args.http_port, args.grpc_port, tmp)
    env = {"RAY_ADDRESS": "local", **({} if args.no_haproxy else FERRY_ENV)}
    proc = start_app(config, os.path.join(tmp, "serve.log"), env)
    rows = []
    try:
        if not wait_ok(f"http://127.0.0.1:{args.http_port}/v2/health/ready", 600, proc):
            print(open(os.path.join(tmp, "serve.log")).read()[-3000:])
            return 1
        pids = ray_processes(proc.ferry_run_id)
        idle0 = cpu_times(pids)
        time.sleep(args.idle_s)  # what each process burns without load, taken off below
        idle = {k: (v - idle0.get(k, 0.0)) / args.idle_s for k, v in cpu_times(pids).items()}
        for i in range(args.rounds):
            for protocol in args.protocols.split(","):
                rows.append(one_run(pa, protocol, args, pids, idle, f"{protocol}{i + 1}"))
                print(json.dumps(rows[-1]), flush=True)
    finally:
        stop(proc)
    result = {
        "benchmark": "CPU ms per v2 request by process and thread, HTTP and gRPC, perf_analyzer",
        "date": today(),
        "commit": commit(),
        "machine": machine(),
        "load_average": [round(x, 1) for x in os.getloadavg()],
        "config": args.config,
        "proxy": "Serve's Python proxy" if args.no_haproxy else "HAProxy (direct ingress)",
        "model": args.model,
        "concurrency": args.concurrency,
        "rows": rows,
    }
    if args.out:
        write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
