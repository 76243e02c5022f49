"""Triton's perf_analyzer against Ferry over HTTP and gRPC side by side, beside Ferry's own
load generator, same requests, same concurrency.

    python benchmarks/bench_perf_analyzer.py [--config serve_config.gpu.yaml]
        [--concurrency 16,64] [--seconds 4] [--protocols http,grpc,grpc_stream]
        [--ports 8000,9000] [--out benchmarks/results/perf_analyzer.json] [--key cpu_default]

Starts the config with ``serve run`` on a Ray of its own (HAProxy and Serve's
throughput-optimized mode, as bench_e2e; ``--ports`` runs a copy of the config on other HTTP
and gRPC ports), then for each workload and concurrency runs ``perf_analyzer`` exactly as a
Triton user would, once per protocol (``-i http``, ``-i grpc``, and ``grpc_stream``:
``-i grpc --streaming``, each client's requests on one ``ModelStreamInfer`` stream; one row
each, with its ``protocol``, taken one after the other at the same level), and over HTTP
``benchmarks/loadgen.py`` (aiohttp, closed loop) sending the same v2 request body. A gRPC
row's ``vs_http`` is its inferences/s over the HTTP row's of the same level:

* ``digits``: ``perf_analyzer -m digits -i http`` with its default random input (one UINT8
  8x8x1 tensor a request, binary); loadgen posts that request, binary.
* ``resnet50_encoded``: one JPEG (loadtest's ``chelsea``, 451x300) a request as a BYTES
  tensor, ``--input-data`` the base64 of the serialised element as Triton documents it;
  loadgen posts the same binary request. Beside it, loadgen's ``/v1/models/resnet50/classify``
  with that JPEG as the raw body: Ferry's own route for the same work.

An HTTP row has both figures and ``ratio`` = perf_analyzer's inferences/s over loadgen's. The
binary: ``$FERRY_PERF_ANALYZER``, else ``~/.cache/perf-analyzer/pa``, else the packed copy
in ``.pa/`` (``bash scripts/pack_perf_analyzer.sh``: xz'd, with libcudart and libb64)
unpacked to /tmp.
"""

from __future__ import annotations

import argparse
import base64
import csv
import json
import lzma
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import loadgen  # noqa: E402
from benchmarks.common import commit, machine, today, write_json  # noqa: E402
from benchmarks.e2e_systems import FERRY_ENV  # noqa: E402
from benchmarks.report_protocols import PROTOCOL_ORDER, perf_analyzer_section  # noqa: E402
from loadtest.corpus import corpus  # noqa: E402
from loadtest.run import start_app, stop_app, wait_ok  # noqa: E402

HTTP_PORT, GRPC_PORT = 8000, 9000  # the shipped configs' (--ports: others)
PROTOCOLS = tuple(PROTOCOL_ORDER)  # http, grpc, grpc_stream, in RESULTS.md's order


def pa_interface(protocol: str) -> list[str]:
    """perf_analyzer's arguments for ``protocol``: ``-i http``, ``-i grpc``, or for
    ``grpc_stream`` ``-i grpc --streaming`` (each client's requests on one ModelStreamInfer
    stream)."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
    if protocol == "http":
        return ["-i", "http"]
    return ["-i", "grpc", *(["--streaming"] if protocol == "grpc_stream" else [])]


def config_on_ports(config: str, http: int, grpc: int, tmp: str) -> str:
    """``config`` itself where it serves on ``http`` and ``grpc`` already; else a copy of it
    in ``tmp`` that does (the shipped configs carry their pipeline config inline)."""
    raw = yaml.safe_load(open(config))
    grpc_opts = raw.get("grpc_options") or {}
    if raw.get("http_options", {}).get("port") == http and grpc_opts.get("port") == grpc:
        return config
    raw.setdefault("http_options", {})["port"] = http
    raw["grpc_options"] = {**grpc_opts, "port": grpc}
    out = os.path.join(tmp, os.path.basename(config))
    with open(out, "w") as f:
        yaml.safe_dump(raw, f, sort_keys=False)
    return out


def perf_analyzer() -> str:
    """The perf_analyzer command: installed, or unpacked from ``.pa/``."""
    for p in (
        os.environ.get("FERRY_PERF_ANALYZER"),
        os.path.expanduser("~/.cache/perf-analyzer/pa"),
    ):
        if p and os.access(p, os.X_OK):
            return p
    packed = os.path.join(ROOT, ".pa")
    if not os.path.exists(os.path.join(packed, "perf_analyzer.xz")):
        raise SystemExit(
            "no perf_analyzer: set FERRY_PERF_ANALYZER or run scripts/pack_perf_analyzer.sh"
        )
    to = os.path.join(tempfile.gettempdir(), "ferry-pa")
    os.makedirs(os.path.join(to, "lib"), exist_ok=True)
    for name in os.listdir(packed) + [
        os.path.join("lib", n) for n in os.listdir(os.path.join(packed, "lib"))
    ]:
        src = os.path.join(packed, name)
        if os.path.isfile(src):
            dst = os.path.join(to, name[:-3] if name.endswith(".xz") else name)
            with (
                (lzma.open if name.endswith(".xz") else open)(src, "rb") as f,
                open(dst, "wb") as g,
            ):
                shutil.copyfileobj(f, g)
    os.chmod(os.path.join(to, "perf_analyzer"), 0o755)
    wrapper = os.path.join(to, "pa")
    with open(wrapper, "w") as f:
        f.write(
            f"#!/usr/bin/env bash\nLD_LIBRARY_PATH={to}/lib${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}} "
            f'exec {to}/perf_analyzer "$@"\n'
        )
    os.chmod(wrapper, 0o755)
    return wrapper


def stop(proc: subprocess.Popen) -> None:
    """The app this run started, its Ray, and the HAProxy it left on port 8000 (by pid)."""
    stop_app(proc, timeout=45)


def v2_body(
    inputs: list[dict[str, Any]], blobs: list[bytes], outputs: list[str]
) -> tuple[bytes, int]:
    """A binary-extension request: JSON header, then each input's bytes."""
    for t, b in zip(inputs, blobs, strict=True):
        t["parameters"] = {"binary_data_size": len(b)}
    head = json.dumps(
        {
            "inputs": inputs,
            "outputs": [{"name": o, "parameters": {"binary_data": True}} for o in outputs],
        }
    ).encode()
    return head + b"".join(blobs), len(head)


def run_pa(
    pa: str,
    model: str,
    n: int,
    args: argparse.Namespace,
    extra: list[str],
    tmp: str,
    protocol: str = "http",
) -> dict[str, Any]:
    """perf_analyzer at concurrency ``n`` over ``protocol`` (``pa_interface``)."""
    out = os.path.join(tmp, f"{model}_{n}_{protocol}.csv")
    port = args.http_port if protocol == "http" else args.grpc_port
    cmd = [pa, "-m", model, "-u", f"127.0.0.1:{port}", *pa_interface(protocol)]
    cmd += ["--concurrency-range"]
    cmd += [
        str(n),
        "-p",
        str(int(args.pa_window_ms)),
        "-s",
        str(args.pa_stability),
        "-r",
        "8",
        "-f",
        out,
        *extra,
    ]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0 or not os.path.exists(out):
        return {"error": (r.stdout[-800:] + r.stderr[-800:]).strip(), "command": " ".join(cmd[1:])}
    (row,) = list(csv.DictReader(open(out)))
    return {
        "infer_s": round(float(row["Inferences/Second"]), 1),
        "p50_ms": round(float(row["p50 latency"]) / 1e3, 2),
        "p99_ms": round(float(row["p99 latency"]) / 1e3, 2),
        "server_queue_ms": round(float(row["Server Queue"]) / 1e3, 3),
        "server_compute_infer_ms": round(float(row["Server Compute Infer"]) / 1e3, 3),
        "wall_s": round(time.time() - t0, 1),
        "command": " ".join(["perf_analyzer", *cmd[1:]]).replace(tmp + "/", ""),
    }


def run_loadgen(
    url: str, body: bytes, ct: str, n: int, args: argparse.Namespace, hl: int | None
) -> dict[str, Any]:
    headers = {"inference-header-content-length": str(hl)} if hl is not None else None
    r = loadgen.run(url, body, ct, n, args.seconds, warmup=1.0, extra_headers=headers)
    return {k: r[k] for k in ("img_s", "p50_ms", "p99_ms", "errors", "loadgen_procs")}


def workloads(tmp: str) -> dict[str, tuple[list[str], tuple[bytes, int]]]:
    """Each workload's perf_analyzer arguments and loadgen's request (body, header length)."""
    jpeg = corpus("chelsea").bodies[0]
    digits = np.random.default_rng(0).integers(0, 256, 64, dtype=np.uint8).tobytes()
    element = len(jpeg).to_bytes(4, "little") + jpeg  # a BYTES element, serialised
    with open(os.path.join(tmp, "jpeg.json"), "w") as f:
        json.dump({"data": [{"image_bytes": {"b64": base64.b64encode(element).decode()}}]}, f)
    return {
        "digits": (
            [],
            v2_body(
                [{"name": "image", "shape": [1, 8, 8, 1], "datatype": "UINT8"}],
                [digits],
                ["logits", "probabilities"],
            ),
        ),
        "resnet50_encoded": (
            ["--input-data", os.path.join(tmp, "jpeg.json")],
            v2_body(
                [{"name": "image_bytes", "shape": [1, 1], "datatype": "BYTES"}],
                [element],
                ["logits", "probabilities"],
            ),
        ),
    }


def level_rows(
    pa: str, name: str, n: int, work: tuple, args: argparse.Namespace, tmp: str
) -> list[dict[str, Any]]:
    """One workload at one concurrency: a row per protocol, one after the other."""
    extra, (body, hl) = work
    base = f"http://127.0.0.1:{args.http_port}"
    url = f"{base}/v2/models/{name}/infer"
    rows: list[dict[str, Any]] = []
    for protocol in args.protocols.split(","):
        row: dict[str, Any] = {"model": name, "protocol": protocol, "concurrency": n}
        row["perf_analyzer"] = run_pa(pa, name, n, args, extra, tmp, protocol)
        if protocol == "http":
            row["loadgen"] = run_loadgen(url, body, "application/octet-stream", n, args, hl)
            if name == "resnet50_encoded":  # Ferry's own route, the same JPEG
                jpeg = corpus("chelsea").bodies[0]
                row["loadgen_v1_classify"] = run_loadgen(
                    f"{base}/v1/models/resnet50/classify", jpeg, "image/jpeg", n, args, None
                )
            got, ours = row["perf_analyzer"].get("infer_s"), row["loadgen"]["img_s"]
            row["ratio"] = round(got / ours, 3) if got and ours else None
        rows.append(row)
        print(json.dumps(row), flush=True)
    by = {r["protocol"]: r["perf_analyzer"].get("infer_s") for r in rows}
    for r in rows:
        if r["protocol"] != "http" and by.get(r["protocol"]) and by.get("http"):
            r["vs_http"] = round(by[r["protocol"]] / by["http"], 3)
    return rows


def arguments() -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--config", default="serve_config.gpu.yaml")
    ap.add_argument("--concurrency", default="16,64")
    ap.add_argument("--seconds", type=float, default=4.0, help="loadgen's measured seconds a level")
    ap.add_argument("--pa-window-ms", type=float, default=2000, help="perf_analyzer's -p")
    ap.add_argument("--pa-stability", type=int, default=25, help="perf_analyzer's -s (percent)")
    ap.add_argument("--no-haproxy", action="store_true", help="Serve's default proxy")
    ap.add_argument("--workloads", default="digits,resnet50_encoded")
    ap.add_argument("--protocols", default="http,grpc", help="perf_analyzer's -i, in order")
    ap.add_argument("--ports", default=f"{HTTP_PORT},{GRPC_PORT}", help="HTTP,gRPC")
    ap.add_argument("--out", default="benchmarks/results/perf_analyzer.json")
    ap.add_argument(
        "--key",
        default=None,
        help="keep this run under runs.KEY of --out, beside what is there (e.g. cpu_default "
        "beside the H200's run); without it the run replaces the file's headline run",
    )
    args = ap.parse_args()
    args.http_port, args.grpc_port = (int(p) for p in args.ports.split(","))
    if not set(args.protocols.split(",")) <= set(PROTOCOLS):
        ap.error(f"--protocols: of {', '.join(PROTOCOLS)}")
    return args


def main() -> int:
    args = arguments()
    pa = perf_analyzer()
    levels = [int(c) for c in args.concurrency.split(",")]
    tmp = tempfile.mkdtemp(prefix="bench_pa_")
    work = workloads(tmp)
    jpeg = corpus("chelsea").bodies[0]
    base = f"http://127.0.0.1:{args.http_port}"
    config = config_on_ports(os.path.join(ROOT, args.config), args.http_port, args.grpc_port, tmp)
    log = os.path.join(tmp, "serve.log")
    t0 = time.time()
    # a Ray of its own (RAY_ADDRESS=local): never a cluster someone started on this machine
    env = {"RAY_ADDRESS": "local", **({} if args.no_haproxy else FERRY_ENV)}
    proc = start_app(config, log, env)
    rows: list[dict[str, Any]] = []
    try:
        up = wait_ok(
            f"{base}/v1/models/resnet50/classify",
            600,
            proc,
            jpeg,
            {"content-type": "image/jpeg"},
            10,
        )
        if not up:
            print(open(log).read()[-3000:])
            return 1
        startup = round(time.time() - t0, 1)
        print(f"up in {startup} s", flush=True)
        for name in args.workloads.split(","):
            _, (body, hl) = work[name]
            headers = {"inference-header-content-length": str(hl)}
            url = f"{base}/v2/models/{name}/infer"  # warm-up
            loadgen.run(
                url, body, "application/octet-stream", 16, 2, warmup=0.5, extra_headers=headers
            )
            for n in levels:
                rows += level_rows(pa, name, n, work[name], args, tmp)
    finally:
        stop(proc)
    write(args, startup, rows)
    return 0


def write(args: argparse.Namespace, startup: float, rows: list[dict[str, Any]]) -> None:
    try:
        with open(args.out) as f:
            before = json.load(f)
    except (OSError, ValueError):
        before = {}
    doc = {
        "benchmark": "perf_analyzer over HTTP and gRPC against Ferry beside Ferry's loadgen, "
        "same v2 requests",
        "date": today(),
        "commit": commit(),
        "machine": machine(),
        "config": args.config,
        "startup_s": startup,
        "perf_analyzer": "tritonclient 2.34.0's binary, closed loop at each concurrency, "
        "-i http, -i grpc and -i grpc --streaming (each row's protocol: http, grpc, "
        "grpc_stream) one after the other",
        "loadgen": "benchmarks/loadgen.py (aiohttp, HTTP), closed loop, the same request body",
        "ratio": "perf_analyzer inferences/s over loadgen img/s (1 image a request, HTTP)",
        "vs_http": "a gRPC row's perf_analyzer inferences/s over the HTTP row's, same level",
        "rows": rows,
    }
    if args.key:  # beside the headline run and the other kept runs
        out = {**before, "runs": {**before.get("runs", {}), args.key: doc}}
    else:
        out = {**doc, **({"runs": before["runs"]} if "runs" in before else {})}
    write_json(args.out, out)
    print("\n".join(perf_analyzer_section(doc)))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
