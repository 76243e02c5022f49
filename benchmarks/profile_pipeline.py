"""Where the CPU goes: CPU milliseconds per request in each Serve process under load.

    python benchmarks/profile_pipeline.py [--model digits] [--clients 32] [--seconds 10]
        [--config serve_config.yaml] [--image auto|digit|chelsea] [--set section.key=value ...]

Deploys the config's application on a local Ray cluster, drives it with the closed-loop
load generator, and reads every Ray process's CPU time before and after (by its process
title: ``ray::ServeReplica:ferry:Ingress``, ``ray::ProxyActor``, ...). Dividing by the
requests answered, after taking off what each process burns idle over the same span,
gives CPU ms per request per stage -- the number that decides how many cores a target
rate needs. ``--set`` (repeatable; the value is YAML, as in bench_e2e.py) changes the
config's pipeline for an A/B pair without a second config file. ``--bare`` serves
``peers/serve_floor.py`` instead (the body read, a fixed answer): Serve's own cost per request,
the floor to set Ferry's beside.

Serve runs as the GPU deployments do (docs/deploy.md): HAProxy in front of the replicas and
Serve's throughput mode (``e2e_systems.FERRY_ENV``), unless the shell already sets either
variable (``RAY_SERVE_ENABLE_HA_PROXY=0`` measures Serve's own Python proxy); the result
records what ran (``serve_env``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def ray_processes(run_id: str | None = None) -> dict[int, str]:
    """Ray's processes (by title) and Serve's HAProxy: pid -> kind; with ``run_id``, only
    those a run marked (``loadtest.procs``: other Ray clusters on the machine left out)."""
    import psutil

    from loadtest import procs

    out = {}
    for p in psutil.process_iter(["pid", "cmdline", "name"]):
        try:
            if run_id is not None and p.environ().get(procs.MARK) != run_id:
                continue
            cmd = " ".join(p.info["cmdline"] or [])
        except (psutil.Error, TypeError):
            continue
        if cmd.startswith("ray::"):
            out[p.info["pid"]] = cmd.split()[0].removeprefix("ray::")
        elif "haproxy" in (p.info["name"] or ""):
            out[p.info["pid"]] = "haproxy"
    return out


def cpu_times(pids: dict[int, str]) -> dict[str, float]:
    import psutil

    acc: dict[str, float] = defaultdict(float)
    for pid, name in pids.items():
        try:
            t = psutil.Process(pid).cpu_times()
            acc[name] += t.user + t.system
        except psutil.Error:
            pass
    return acc


def thread_cpu_times(pids: dict[int, str]) -> dict[tuple[str, str], float]:
    """CPU seconds by (process kind, thread name) from /proc: native threads (gRPC's, CUDA's,
    nvImageCodec's) keep the names their libraries gave them, Ferry's pools theirs
    (pipeline/threads.py); every other thread carries the name of the thread that made it --
    Serve's loop and Python's default executor mostly ``ray::IDLE``."""
    acc: dict[tuple[str, str], float] = defaultdict(float)
    tick = os.sysconf("SC_CLK_TCK")
    for pid, kind in pids.items():
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/comm") as f:
                    name = f.read().strip()
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:  # the thread ended
                continue
            # utime and stime are fields 14 and 15 of stat, 12 and 13 after the ")"
            acc[(kind, name.rstrip("0123456789_-") or name)] += (
                int(fields[11]) + int(fields[12])
            ) / tick
    return acc


def per_thread(before: dict, after: dict, n: int, top: int = 8) -> dict[str, dict[str, float]]:
    """CPU ms per request by process kind and thread name: the ``top`` costliest of each kind."""
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for (kind, name), t in after.items():
        out[kind][name] = round((t - before.get((kind, name), 0.0)) * 1e3 / n, 3)
    return {
        kind: dict(sorted(((k, v) for k, v in names.items() if v > 0), key=lambda kv: -kv[1])[:top])
        for kind, names in sorted(out.items())
        if any(v > 0.01 for v in names.values())
    }


def start_spies(
    pids: dict[int, str],
    folder: str,
    seconds: float,
    gil: bool = False,
    native: bool = False,
    prefix: str = "",
) -> list:
    """py-spy record, without pausing them, on two replicas of each deployment and the proxy
    for ``seconds``; ``native``: with the C/C++ frames below Python's (py-spy then pauses
    the process for each sample), ``prefix`` before each file's name."""
    os.makedirs(folder, exist_ok=True)
    procs = []
    seen: dict[str, int] = defaultdict(int)
    for pid, name in sorted(pids.items()):
        if ("ServeReplica" not in name and "ProxyActor" not in name) or seen[name] >= 2:
            continue
        seen[name] += 1
        out = os.path.join(folder, f"{prefix}{name.replace(':', '_')}_{pid}.txt")
        procs.append(py_spy(pid, seconds, out, gil=gil, native=native))
    return procs


def py_spy(
    pid: int, seconds: float, out: str, rate: int = 100, gil: bool = False, native: bool = False
) -> Any:
    """``py-spy record`` of ``pid`` for ``seconds``, raw stacks of every thread to ``out``
    (its ``Popen``); ``gil``: only the thread holding the GIL; ``native``: the C/C++ frames
    too, which makes py-spy pause the process for each sample (else it never pauses it)."""
    import shutil
    import subprocess

    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    cmd = [spy, "record", "-p", str(pid), "-d", str(int(seconds)), "-r", str(rate)]
    cmd += ["-f", "raw", "-t", "-o", out] + (["--gil"] if gil else [])
    cmd += ["--native"] if native else ["--nonblocking"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def image_of(model: str, image: str = "auto") -> str:
    """The body's kind: ``image``, or by model (auto: a digit PNG for digits, else chelsea)."""
    return image if image != "auto" else ("digit" if model == "digits" else "chelsea")


def request_body(image: str) -> tuple[bytes, str]:
    """A request's body and content type: a digit PNG, or chelsea as a 451x300 JPEG."""
    if image == "digit":
        from pipeline.imaging import encode_png
        from pipeline.models.digits import load_split

        return encode_png(load_split()[2][0]), "image/png"
    from loadtest.corpus import chelsea

    return chelsea().bodies[0], "image/jpeg"


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--config", default="serve_config.yaml")
    ap.add_argument("--model", default="digits")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument(
        "--image",
        choices=["auto", "digit", "chelsea"],
        default="auto",
        help="the body: a digit PNG, or chelsea as a 451x300 JPEG (auto: by model); chelsea "
        "to the digits model costs a photo's decode but almost no inference",
    )
    ap.add_argument(
        "--route",
        choices=["classify", "image", "segment", "detect"],
        default="classify",
        help="the v1 route the load posts to (the model must answer that task)",
    )
    ap.add_argument(
        "--out",
        default=None,
        help="add the result to this JSON file (benchmarks/results/profile_pipeline.json "
        "keeps one entry per experiment, each with its runs by --label)",
    )
    ap.add_argument("--experiment", default="default", help="the experiment's name in --out")
    ap.add_argument("--label", default="", help="the run's name within its experiment")
    ap.add_argument(
        "--spy",
        default=None,
        help="also sample every Serve replica with py-spy during the load (raw stacks, one "
        "file per process, in this folder; summarise with scripts/spy_top.py)",
    )
    ap.add_argument(
        "--spy-gil",
        action="store_true",
        help="with --spy: sample only the thread holding the GIL, so a file's samples per "
        "second over the rate is the share of time its GIL was held",
    )
    ap.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="NAME:VALUE",
        help="a header every request of the load carries (repeatable)",
    )
    ap.add_argument(
        "--bare",
        nargs="?",
        const="now",
        choices=("now", "batched"),
        help="serve benchmarks/peers/serve_floor.py (the body read, a fixed small JSON answered) "
        "instead of the config's application, under the config's logging: Serve's own cost per "
        "request on this machine, the floor beside Ferry's; --bare batched: each request "
        "waits for the next 2 ms tick first, as Ferry's wait for their coalesced call",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="change the pipeline config (repeatable; the value is YAML), as bench_e2e.py does",
    )
    args = ap.parse_args()
    import ray
    import yaml
    from ray import serve

    from benchmarks import loadgen
    from benchmarks.e2e_configs import apply_sets, own_port, parse_sets
    from benchmarks.e2e_systems import FERRY_ENV
    from deployments.app import build_app
    from loadtest.cores import busy_cores_since

    with open(args.config) as f:
        raw = yaml.safe_load(f)
    sets = parse_sets(args.set)
    apply_sets(raw["applications"][0]["args"]["config"], sets)
    serve_env = {k: os.environ.setdefault(k, v) for k, v in FERRY_ENV.items()}
    ray.init(include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    if args.bare:
        from benchmarks.peers.serve_floor import BatchedFloor, Floor

        app = (BatchedFloor if args.bare == "batched" else Floor).bind()
    else:
        app = build_app(raw["applications"][0]["args"])
    # with the file's logging_config, as `serve run` applies it
    serve.run(app, name="ferry", route_prefix="/", logging_config=raw.get("logging_config"))
    image = image_of(args.model, args.image)
    body, ct = request_body(image)
    # a config with Ferry's own listener (ingress.direct_port) is driven through it
    direct = None if args.bare else own_port(raw["applications"][0]["args"]["config"])
    port = direct or args.port
    url = f"http://127.0.0.1:{port}/v1/models/{args.model}/{args.route}"
    loadgen.run(url, body, ct, 4, 2, warmup=0.5)  # warm
    pids = ray_processes()
    idle0 = cpu_times(pids)
    time.sleep(args.seconds)  # the same span without load: background CPU to subtract
    idle1 = cpu_times(pids)
    spies = start_spies(pids, args.spy, args.seconds, args.spy_gil) if args.spy else []
    before = cpu_times(pids)
    threads_before = thread_cpu_times(pids)
    mark, _ = busy_cores_since()
    t0 = time.perf_counter()
    extra = dict(h.split(":", 1) for h in args.header)
    res = loadgen.run(url, body, ct, args.clients, args.seconds, warmup=0, extra_headers=extra)
    wall = time.perf_counter() - t0
    _, busy = busy_cores_since(mark)
    for p in spies:
        p.wait()
    after = cpu_times(pids)
    threads_after = thread_cpu_times(pids)
    n = max(res["ok"], 1)
    idle_rate = {k: (idle1[k] - idle0.get(k, 0.0)) / args.seconds for k in idle1}
    per = {
        k: round((after[k] - before.get(k, 0.0) - idle_rate.get(k, 0.0) * wall) * 1e3 / n, 3)
        for k in after
    }
    per = dict(sorted(per.items(), key=lambda kv: -kv[1]))
    result = {
        "config": f"benchmarks/peers/serve_floor.py ({args.bare})" if args.bare else args.config,
        **({"logging_config": raw["logging_config"]} if raw.get("logging_config") else {}),
        "serve_env": serve_env,
        **({"set": sets} if sets else {}),
        **({"headers": extra} if extra else {}),
        "model": args.model,
        "route": args.route,
        "port": port,
        "image": image,
        "load": res,
        "wall_s": round(wall, 2),
        "machine_busy_cores": busy,
        "machine_cores": os.cpu_count(),
        "idle_cpu_cores": {k: round(v, 3) for k, v in idle_rate.items() if v > 0.005},
        "cpu_ms_per_request": per,
        "cpu_ms_per_request_total": round(sum(per.values()), 3),
        # not less each thread's idle rate: the costliest threads under this load, by name
        "cpu_ms_per_request_by_thread": per_thread(threads_before, threads_after, n),
    }
    print(json.dumps(result, indent=2))
    if args.out:
        from benchmarks.common import machine, today, write_json

        doc = json.load(open(args.out)) if os.path.exists(args.out) else {}
        exp = doc.setdefault("experiments", {}).setdefault(args.experiment, {})
        exp.setdefault("machine", machine())
        exp.setdefault("date", today())
        exp.setdefault("results", {})[args.label or args.config] = result
        write_json(args.out, doc)
    serve.shutdown()
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
