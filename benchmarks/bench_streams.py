"""Live video streams against Ferry: N streams at F fps, at each N of a list
(``loadtest/streams.py`` plays them), with the service started here and stopped by PID.

    python benchmarks/bench_streams.py --config serve_config.yaml --port 8423 \\
        --model digits --streams 1,4,8,16 --fps 10 --seconds 10 --size 64x64 \\
        [--query "task=image&format=jpeg"] [--label "CPU only"] [--out benchmarks/results/streams.json]

    # on one H200 (issue 34's goal): serve_config.gpu.yaml, 640x360 JPEG at 30 fps
    python benchmarks/bench_streams.py --config serve_config.gpu.yaml --model resnet50 \\
        --streams 1,16,64,256,512 --fps 30 --size 640x360 --procs 8 --label "one H200"

The config file is run as given but on ``--port`` (a copy with its ``http_options.port``
changed), so a benchmark never takes another service's port. The results file holds the
levels with the machine, the commit, the date and the label -- say what ran (``CPU only``
when no GPU did).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.common import commit, machine, table, today, write_json  # noqa: E402
from loadtest import streams  # noqa: E402
from loadtest.run import end_local_ray, start_app, wait_ready  # noqa: E402


def config_on_port(path: str, port: int, out_dir: str) -> str:
    """A copy of the Serve config ``path`` answering on ``port``."""
    with open(path) as f:
        doc = yaml.safe_load(f)
    doc.setdefault("http_options", {})["port"] = port
    out = os.path.join(out_dir, os.path.basename(path))
    with open(out, "w") as f:
        yaml.safe_dump(doc, f)
    return out


def run(a: argparse.Namespace) -> dict[str, Any]:
    w, h = (int(x) for x in a.size.lower().split("x"))
    frames = streams.frames_corpus(w, h)
    query = f"fps={a.fps:g}" + (f"&deadline_ms={a.deadline_ms:g}" if a.deadline_ms else "")
    query += f"&{a.query}" if a.query else ""
    url = f"ws://127.0.0.1:{a.port}/v1/streams/{a.model}?{query}"
    with tempfile.TemporaryDirectory() as tmp:
        # a Ray of its own: without an address ``serve run`` joins the newest Ray started
        # on this machine (``ray start``), someone else's service included
        proc = start_app(
            config_on_port(a.config, a.port, tmp),
            os.path.join(tmp, "serve.log"),
            {"RAY_ADDRESS": "local"},
        )
        try:
            if not wait_ready(f"http://127.0.0.1:{a.port}", 600, proc):
                with open(os.path.join(tmp, "serve.log"), errors="replace") as f:
                    raise SystemExit("the service did not become ready:\n" + f.read()[-3000:])
            streams.run_level(url, 1, a.fps, 2.0, frames, a.token)  # warm: first frames
            levels = []
            for n in (int(x) for x in a.streams.split(",")):
                time.sleep(a.rest_s)  # the last level's late frames leave admission's window
                levels.append(streams.run_level(url, n, a.fps, a.seconds, frames, a.token, a.procs))
                print(json.dumps(levels[-1]), flush=True)
        finally:
            end_local_ray(proc)
    return {
        "label": a.label,
        "machine": machine(),
        "commit": commit(),
        "date": today(),
        "config": os.path.relpath(os.path.abspath(a.config), ROOT),
        "model": a.model,
        "query": a.query or None,
        "frames": f"{w}x{h} JPEG, a pan across scikit-image's astronaut, 30 frames cycled",
        "deadline_ms": a.deadline_ms or "the service's default (streams.deadline_frames)",
        "rest_s_between_levels": a.rest_s,
        "levels": levels,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=os.path.join(ROOT, "serve_config.yaml"))
    ap.add_argument("--port", type=int, default=8423)
    ap.add_argument("--model", default="digits")
    ap.add_argument("--streams", default="1,4,8,16")
    ap.add_argument("--fps", type=float, default=10.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--size", default="64x64")
    ap.add_argument("--deadline-ms", type=float, default=None)
    ap.add_argument("--query", default="", help="the stream's other terms: task=image&format=jpeg")
    ap.add_argument("--procs", type=int, default=1)
    ap.add_argument(
        "--rest-s", type=float, default=6.0, help="pause before each level (streams.late_window_s)"
    )
    ap.add_argument("--token", default=None)
    ap.add_argument("--label", required=True, help="what ran: 'CPU only', 'one H200', ...")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    doc = run(a)
    cols = ["streams", "opened", "refused", "answered", "dropped_pct", "answers_per_s"]
    print(
        table(
            [
                {k: lv[k] for k in cols} | {"p99_ms": lv["latency_ms"]["p99"]}
                for lv in doc["levels"]
            ],
            [*cols, "p99_ms"],
        )
    )
    if a.out:
        write_json(a.out, doc)


if __name__ == "__main__":
    main()
