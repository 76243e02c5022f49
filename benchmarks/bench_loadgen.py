"""The two load generators against each other: what each costs the machine per request.

    python benchmarks/bench_loadgen.py [--clients 64] [--seconds 10] [--out benchmarks/results/loadgen.json]

A trivial aiohttp server (its own process: reads the body, answers a small JSON) is driven
in turn by ``benchmarks/loadgen.py`` (aiohttp, one process) and by locust
(``loadtest/locustfile.py``'s ``ClassifyUser``, FastHttpUser, one process), with the same
closed-loop client count and the same body (the chelsea JPEG). For each: requests per
second, and the generator's CPU ms per request. locust's CPU is its process's (children's
rusage), taken as the difference between a long and a short run, so its start-up is not
counted; loadgen's is measured inside its processes around the load itself.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import subprocess
import sys
import tempfile
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import loadgen  # noqa: E402
from benchmarks.common import machine, table, today, write_json  # noqa: E402
from loadtest.corpus import chelsea  # noqa: E402
from loadtest.run import parse_stats_csv, venv_bin, wait_ok  # noqa: E402

SERVER = """
import sys
from aiohttp import web

async def answer(request):
    await request.read()
    return web.json_response({"top_k": [{"label": "tabby", "class": 281, "score": 0.9}]})

app = web.Application(client_max_size=64 << 20)
app.router.add_route("*", "/{tail:.*}", answer)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def locust_run(
    url: str, corpus_dir: str, clients: int, seconds: int, out: str
) -> tuple[float, int]:
    """(CPU seconds, requests answered) of one headless locust run of ``seconds``."""
    prefix = os.path.join(out, f"locust_{seconds}")
    cmd = [
        venv_bin("locust"),
        "-f",
        os.path.join(ROOT, "loadtest", "locustfile.py"),
        "--headless",
        "-u",
        str(clients),
        "-r",
        str(clients),
        "-t",
        f"{seconds}s",
        "--csv",
        prefix,
        "--only-summary",
        "--host",
        url,
        "--loglevel",
        "WARNING",
        "ClassifyUser",
    ]
    env = {**os.environ, "FERRY_CORPUS": corpus_dir, "PYTHONPATH": ROOT}
    before = children_cpu()
    subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, timeout=seconds + 120)
    cpu = children_cpu() - before
    stats = parse_stats_csv(prefix + "_stats.csv")
    return cpu, stats["requests"] - stats["errors"]


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--out", default="benchmarks/results/loadgen.json")
    args = ap.parse_args()
    body = chelsea().bodies[0]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port)])
    rows: list[dict[str, Any]] = []
    try:
        if not wait_ok(url + "/", 30, server, body=b"x"):
            raise SystemExit("the test server did not come up")
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "chelsea.jpg"), "wb") as f:
                f.write(body)
            with open(os.path.join(tmp, "index.json"), "w") as f:
                f.write('[{"file": "chelsea.jpg", "content_type": "image/jpeg"}]')
            short = max(2, args.seconds // 4)
            cpu_s, n_s = locust_run(url, tmp, args.clients, short, tmp)
            cpu_l, n_l = locust_run(url, tmp, args.clients, args.seconds, tmp)
            rows.append(
                {
                    "generator": "locust (FastHttpUser, 1 process)",
                    "req_s": round(n_l / args.seconds, 1),
                    "cpu_ms_per_request": round((cpu_l - cpu_s) * 1e3 / max(n_l - n_s, 1), 3),
                }
            )
        r = loadgen.run(url + "/classify", body, "image/jpeg", args.clients, args.seconds, procs=1)
        rows.append(
            {
                "generator": "benchmarks/loadgen.py (aiohttp, 1 process)",
                "req_s": r["img_s"],
                "cpu_ms_per_request": round(r["loadgen_cpu_per_proc"][0] * 1e3 / r["img_s"], 3),
            }
        )
    finally:
        server.terminate()
        server.wait(10)
    loc, lg = rows
    doc = {
        "machine": machine(),
        "date": today(),
        "method": f"{args.clients} closed-loop clients, {args.seconds} s, one generator process "
        f"each, against a trivial aiohttp server on the same machine; body: "
        f"{chelsea().description}; locust's CPU is the difference between a {args.seconds} s and a "
        f"{max(2, args.seconds // 4)} s run (start-up taken off)",
        "rows": rows,
        "locust_cpu_per_request_vs_loadgen": round(
            loc["cpu_ms_per_request"] / lg["cpu_ms_per_request"], 2
        ),
    }
    write_json(args.out, doc)
    print(table(rows, ["generator", "req_s", "cpu_ms_per_request"]))
    print(f"locust / loadgen CPU per request: {doc['locust_cpu_per_request_vs_loadgen']}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
