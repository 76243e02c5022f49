"""Live video streams against Ferry: N streams at F fps, at each N of a list
(``loadtest/streams.py`` plays them), with the service started here and stopped by PID.

    python benchmarks/bench_streams.py --config serve_config.yaml --port 8423 \\
        --model digits --streams 1,4,8,16 --fps 10 --seconds 10 --size 64x64 \\
        [--query "task=image&format=jpeg"] [--label "CPU only"] [--out benchmarks/results/streams.json]

``--systems ferry,rayserve_streams_8`` also plays the expert Ray Serve app
(``peers/rayserve_streams.py``: the image workload's U-Net, WebSockets as a strong Serve user
writes them) at the same levels, one system after the other, and sets Ferry against it
level by level (``vs_peer``); Ferry then serves that U-Net too (issue 34's H200 run):

    python benchmarks/bench_streams.py --config benchmarks/configs/ferry_e2e_image.yaml \\
        --systems ferry,rayserve_streams_8 --model unet --query "task=image&format=jpeg" \\
        --streams 1,16,64,256,512 --fps 30 --size 640x360 --procs 8 --label "one H200"

Both systems run under Serve's HAProxy and its throughput mode. The config file is run as
given but on ``--port`` (a copy with its ``http_options.port`` changed), so a benchmark never
takes another service's port. Each level also carries what it cost the server
(``server_cost``: CPU seconds, cores, CPU ms a frame answered, the busiest threads; the load
generator left out). The results file holds the
levels with the machine, the commit, the date and the label -- say what ran (``CPU only``
when no GPU did).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from typing import Any

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.common import Budget, commit, machine, table, today, write_json  # noqa: E402
from benchmarks.e2e_configs import peer_app  # noqa: E402
from benchmarks.e2e_systems import FERRY_ENV  # noqa: E402
from loadtest import streams  # noqa: E402
from loadtest.cores import ServerSpan  # noqa: E402
from loadtest.run import end_local_ray, start_app, wait_ready, wait_settled  # noqa: E402


def config_on_port(path: str, port: int, out_dir: str) -> str:
    """A copy of the Serve config ``path`` answering on ``port``."""
    with open(path) as f:
        doc = yaml.safe_load(f)
    doc.setdefault("http_options", {})["port"] = port
    out = os.path.join(out_dir, os.path.basename(path))
    with open(out, "w") as f:
        yaml.safe_dump(doc, f)
    return out


PEER = "rayserve_streams_"
"""A system named ``rayserve_streams_N``: the expert Ray Serve app, N replicas."""
ENV = FERRY_ENV
"""Both systems run under Serve's HAProxy and its throughput mode (the GPU configs' form)."""


def peer_config(name: str, port: int, model: str, out_dir: str) -> str:
    """The Serve config of the peer ``rayserve_streams_N``: N replicas on the GPU where one
    is visible (else on the CPU, for tests), the U-Net file ``model``."""
    from pipeline.device import cuda_available

    args = {
        "replicas": int(name.removeprefix(PEER)),
        "model": model,
        "device": "cuda" if cuda_available() else "cpu",
    }
    out = os.path.join(out_dir, f"{name}.yaml")
    with open(out, "w") as f:
        yaml.safe_dump(peer_app("rayserve_streams", args, "/", port), f)
    return out


def peer_model(a: argparse.Namespace) -> str:
    """The peer's U-Net file (``--peer-model``, else the image workload's), written first
    where it is missing -- the image workload's Ferry config serves the same file."""
    from benchmarks.image_workload import UNET_PATH, export_unet

    model = a.peer_model or UNET_PATH
    if not os.path.exists(model):
        export_unet(model)
    return model


def server_cost(run_id: str, play: Any) -> dict[str, Any]:
    """``play()``'s level with what it cost the server -- every process of the system's
    ``serve run`` (Ray, Serve, HAProxy, the replicas), the load generator left out: its CPU
    seconds and cores over the level, its CPU ms a frame answered, the machine's busy cores
    and the busiest threads -- as ``bench_e2e``'s rows carry them."""
    span = ServerSpan(run_id)
    level = play()
    span.end(top=8)
    rate = level.get("answers_per_s") or 0.0
    return {
        **level,
        "server_cpu_s": round(span.cores * span.wall_s, 3),
        "server_cores": round(span.cores, 2),
        "server_cpu_ms_per_frame": round(span.cores / rate * 1e3, 3) if rate else None,
        "machine_busy_cores": span.busy,
        "server_threads": span.threads,
    }


STOP_S = 30  # a system's stop, in the budget
UP_S = 600  # the longest a system's start-up is waited for (a U-Net compiles in each replica)


def run_system(
    a: argparse.Namespace,
    name: str,
    frames: list[bytes],
    budget: Budget,
    result: dict[str, Any],
    save: Any,
) -> None:
    """One system started on ``--port``, warmed, played at each level, stopped by PID, into
    ``result`` (``save()`` after each level: a run cut off keeps what it measured). Its
    start-up waits no longer than ``budget`` has left past a level and the stop; a level
    that no longer fits is not played, and the result says so (``cut``)."""
    query = f"fps={a.fps:g}" + (f"&deadline_ms={a.deadline_ms:g}" if a.deadline_ms else "")
    query += f"&{a.query}" if a.query else ""
    url = f"ws://127.0.0.1:{a.port}/v1/streams/{a.model}?{query}"
    with tempfile.TemporaryDirectory() as tmp:
        if name == "ferry":
            config = config_on_port(a.config, a.port, tmp)
            about = {"config": os.path.relpath(os.path.abspath(a.config), ROOT), "model": a.model}
        else:
            model = peer_model(a)
            config = peer_config(name, a.port, model, tmp)
            about = {"config": "benchmarks/peers/rayserve_streams.py", "model": model}
        # a Ray of its own: without an address ``serve run`` joins the newest Ray started
        # on this machine (``ray start``), someone else's service included
        levels: list[dict[str, Any]] = []
        result.update({**about, "query": a.query or None, "levels": levels})
        level_s = a.rest_s + a.seconds + 15  # a level: its rest, its window, its last answers
        t0 = time.time()

        def allowance() -> float:
            return budget.within(UP_S - (time.time() - t0), level_s + STOP_S)

        proc = start_app(config, os.path.join(tmp, "serve.log"), {"RAY_ADDRESS": "local", **ENV})
        try:
            if not wait_ready(f"http://127.0.0.1:{a.port}", allowance(), proc):
                with open(os.path.join(tmp, "serve.log"), errors="replace") as f:
                    tail = f.read()[-3000:]
                print(f"{name} did not become ready:\n{tail}", flush=True)
                result["cut"] = f"did not become ready in {time.time() - t0:.0f} s"
                return
            # every replica up, not only the first (a U-Net compiles in each, one by one)
            result["replicas_starting"] = wait_settled(allowance(), proc)
            result["startup_s"] = round(time.time() - t0, 1)
            zip_ = streams.COMPRESSIONS[a.compression]
            streams.run_level(url, 1, a.fps, 2.0, frames, a.token, 1, zip_)  # warm: first frames
            for n in (int(x) for x in a.streams.split(",")):
                if not budget.fits(level_s + STOP_S):
                    result["cut"] = f"by --budget-s before {n} streams"
                    print(f"   cut by --budget-s before {n} streams", flush=True)
                    break
                time.sleep(a.rest_s)  # the last level's late frames leave admission's window
                levels.append(
                    server_cost(
                        proc.ferry_run_id,  # type: ignore[attr-defined]
                        lambda n=n: streams.run_level(
                            url, n, a.fps, a.seconds, frames, a.token, a.procs, zip_
                        ),
                    )
                )
                print(json.dumps({"system": name, **levels[-1]}), flush=True)
                save()
        finally:
            end_local_ray(proc)


def vs_peer(systems: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per level, Ferry's answers per second over each peer's (the same streams, fps and
    frames, one run), with both p99 latencies."""
    if "ferry" not in systems:
        return []
    out = []
    for name, peer in systems.items():
        if name == "ferry":
            continue
        for f, p in zip(systems["ferry"].get("levels", []), peer.get("levels", []), strict=False):
            rate = p["answers_per_s"]
            out.append(
                {
                    "peer": name,
                    "streams": f["streams"],
                    "answers_per_s_ratio": round(f["answers_per_s"] / rate, 2) if rate else None,
                    "ferry_p99_ms": f["latency_ms"]["p99"],
                    "peer_p99_ms": p["latency_ms"]["p99"],
                    "ferry_dropped_pct": f["dropped_pct"],
                }
            )
    return out


def run(a: argparse.Namespace, save: Any = lambda doc: None) -> dict[str, Any]:
    """Every system of ``--systems`` in turn; ``save(doc)`` after each level, with what has
    been measured so far (a system cut or not started says so: its ``cut``)."""
    w, h = (int(x) for x in a.size.lower().split("x"))
    frames = streams.frames_corpus(w, h)
    if any(name.startswith(PEER) for name in a.systems.split(",")):
        peer_model(a)  # before Ferry starts on it too
    budget = Budget(a.budget_s)
    systems: dict[str, dict[str, Any]] = {}
    head = _head(a, w, h)  # (once: the commit and machine do not change during the run)

    def doc() -> dict[str, Any]:
        return {**head, "systems": systems, "vs_peer": vs_peer(systems)}

    for name in a.systems.split(","):
        if not budget.fits(STOP_S + a.rest_s + a.seconds + 60):  # a start-up, a level, a stop
            print(f"{name} not started: {budget.left():.0f} s left of --budget-s", flush=True)
            systems[name] = {"cut": f"not started: {budget.left():.0f} s left of --budget-s"}
            continue
        systems[name] = {}
        run_system(a, name, frames, budget, systems[name], lambda: save(doc()))
        save(doc())
    return doc()


def plot_levels(doc: dict[str, Any], path: str) -> str:
    """``doc``'s levels drawn against the streams played: frames answered a second, and each
    frame's p50 / p99 latency, one line per system (``path``: the PNG)."""
    from loadtest.plots import plot

    rows = [
        {
            "system": name,
            "clients": lv["streams"],
            "img_s": lv["answers_per_s"],
            "p50_ms": lv["latency_ms"].get("p50"),
            "p99_ms": lv["latency_ms"].get("p99"),
        }
        for name, sysdoc in doc["systems"].items()
        for lv in sysdoc.get("levels", [])
    ]
    title = "live streams, " + str(doc.get("label", "")).split(":")[0]  # (the label's head)
    return plot(rows, path, title, x_label="streams", rate_label="frames / s")


def _head(a: argparse.Namespace, w: int, h: int) -> dict[str, Any]:
    """What the results file says of the run as a whole."""
    return {
        "label": a.label,
        "machine": machine(),
        "commit": commit(),
        "date": today(),
        "frames": f"{w}x{h} JPEG, a pan across scikit-image's astronaut, 30 frames cycled",
        "compression": a.compression,  # permessage-deflate offered by the client, or none
        "deadline_ms": a.deadline_ms or "the service's default (streams.deadline_frames)",
        "rest_s_between_levels": a.rest_s,
        "env": ENV,
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
    ap.add_argument(
        "--compression",
        choices=sorted(streams.COMPRESSIONS),
        default="none",
        help="permessage-deflate offered by the streams (loadtest.streams.COMPRESSIONS)",
    )
    ap.add_argument("--label", default=None, help="what ran: 'CPU only', 'one H200', ...")
    ap.add_argument(
        "--systems",
        default="ferry",
        help="ferry (--config) and/or rayserve_streams_N (the expert Ray Serve app with N "
        "replicas, on the U-Net of benchmarks/image_workload.py: compare it with Ferry serving "
        "that model, --model unet --query 'task=image&format=jpeg'), one after the other",
    )
    ap.add_argument(
        "--peer-model", default=None, help="the peer's U-Net file (default: the image workload's)"
    )
    ap.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="the run's wall-clock allowance: start-ups wait no longer than it leaves, and a "
        "level or system that no longer fits is not begun (what ran is saved after each level)",
    )
    ap.add_argument("--out", default=None, help="the results file; its plot goes beside it (.png)")
    ap.add_argument(
        "--plot-only", default=None, metavar="JSON", help="draw a results file's plot, run nothing"
    )
    a = ap.parse_args()
    if a.plot_only:
        with open(a.plot_only) as f:
            print(plot_levels(json.load(f), os.path.splitext(a.plot_only)[0] + ".png"))
        return
    if not a.label:
        ap.error("--label is required: say what ran ('CPU only', 'one H200', ...)")
    # `timeout` sends SIGTERM: leave through the `finally` that stops the system under test
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    doc = run(a, (lambda d: write_json(a.out, d)) if a.out else (lambda d: None))
    cols = ["streams", "opened", "refused", "answered", "dropped_pct", "answers_per_s"]
    rows = [
        {"system": name, **{k: lv[k] for k in cols}, "p99_ms": lv["latency_ms"]["p99"]}
        for name, sysdoc in doc["systems"].items()
        for lv in sysdoc.get("levels", [])
    ]
    print(table(rows, ["system", *cols, "p99_ms"]))
    if a.out:
        print(plot_levels(doc, os.path.splitext(a.out)[0] + ".png"))


if __name__ == "__main__":
    main()
