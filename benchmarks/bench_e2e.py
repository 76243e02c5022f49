"""End to end over HTTP: Ferry's placements against Ray Serve peers, in two workloads.

    python benchmarks/bench_e2e.py [--workload classify|image] [--systems ferry,rayserve_expert_8,...]
        [--corpus chelsea,photos] [--clients 1,16,64,256,512,1024] [--seconds 15]
        [--set executor.max_in_flight=4 ...] [--out benchmarks/results/e2e.json] [--strict]

Workloads (``--workload``, ``benchmarks/e2e_systems.py``): ``classify`` (the default),
ResNet-50's top 5 of each JPEG, on two corpora (``loadtest.corpus``: ``chelsea``, one 451x300
photo; ``photos``, 16 real photos of 640x480 to 1920x1080 cycled per request); ``image``
(issue 33), a 256x256 U-Net applied to 1280x720 JPEG frames (``frames720``, 16 real photos)
and answered as a JPEG at the frame's size, ``Accept: image/jpeg`` -- an answer counts only
when it is a JPEG of its frame's size (``loadgen.jpeg_size``), and the U-Net is exported
before any system starts (``benchmarks/image_workload.py``). Its rows' ``img_s`` is frames/s.

Systems (``SYSTEMS``), each of one workload: Ferry's placements -- ``ferry`` (the whole
pipeline in each of 8 replicas of one deployment sharing the GPU), ``ferry_split`` (ingress
replicas, one Serve hop to GPU inference replicas), ``ferry_4stage`` (four deployments, JPEGs
decoded on CPU threads), ``ferry_naive`` (``ferry`` in the executor's naive mode) -- and the
peers: the usual Ray Serve app (``rayserve_batch_*``, ``benchmarks/peers/rayserve_batch.py``)
and the expert one (``rayserve_expert_{4,8,12}``, N replicas,
``benchmarks/peers/rayserve_expert.py``); for ``image``, ``ferry_image`` (``ferry``'s
placement, ``configs/ferry_e2e_image.yaml``) and ``rayserve_image_{2,4,8,12}``
(``benchmarks/peers/rayserve_image.py``). ``--set section.key=value`` (repeatable; the value
is YAML) changes the pipeline config of every Ferry system in the run, for experiments; such
rows are named ``system[key=value,...]`` so they never replace the plain system's; a
system named so in ``--systems`` (``ferry_torch_r2[executor.max_in_flight=1]``, several sets
apart by ``;``) is that system with those sets, beside the others of the run.

Every system is started with ``serve run`` as its own Ray cluster on this machine, waited
for until every deployment is HEALTHY (an app answers once one replica is up; a torch.compile
system's replicas come up one by one), warmed, then driven by the same closed-loop load
generator (``benchmarks/loadgen.py``: aiohttp over several processes; its own CPU use is
recorded beside every row) with each corpus in turn
at each concurrency, one system after the other. Rows carry their ``workload`` and are
merged into the output file by (system, corpus), so systems can be measured in several
commands on one machine. Ferry's answers' per-stage timings are averaged too (JSON
``timings_ms``, or an image answer's ``Server-Timing``; the image peer's ``Server-Timing``
says its batch wait and its batch's time). ``--strict`` (smoke runs, ``scripts/gpu_check.sh``)
exits 1 unless every system came up and answered every level without an error.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import loadgen, ray_probe  # noqa: E402
from benchmarks.common import (  # noqa: E402
    Budget,
    gpu_name,
    machine,
    run_no,
    today,
    write_json,
)
from benchmarks.e2e_configs import (  # noqa: E402
    apply_sets,
    direct_port,
    parse_sets,
    row_name,
    serve_config,
    url_of,
)
from benchmarks.e2e_level import measure, precisions  # noqa: E402
from benchmarks.e2e_merge import kept, merged  # noqa: E402
from benchmarks.e2e_systems import SYSTEMS, WORKLOADS, corpus_of, systems_of  # noqa: E402
from benchmarks.image_workload import export_unet  # noqa: E402
from benchmarks.mps import mps_server  # noqa: E402
from benchmarks.mps import servers as mps_servers  # noqa: E402
from loadtest.corpus import Corpus  # noqa: E402
from loadtest.plots import plot  # noqa: E402
from loadtest.run import (  # noqa: E402
    end_local_ray,
    serve_failure,
    start_app,
    wait_ok,
    wait_settled,
)

__all__ = ["SYSTEMS", "WORKLOADS", "apply_sets", "parse_sets", "row_name", "serve_config"]
JPEG = {"content-type": "image/jpeg"}
NOT_READ = ["unknown: the dashboard's REST API did not answer"]  # a row's replicas_starting
STOP_S = 20  # what a system's stop is given in the budget (it takes 5-15 s; stop() allows 48)


def stop(proc: subprocess.Popen | None) -> None:
    end_local_ray(proc, timeout=45)
    time.sleep(3)


def port_taken(*extra: int | None) -> bool:
    """Whether Serve's port 8000, or any of ``extra`` (a system's own listener: the next
    system's replicas would share it, ``SO_REUSEPORT``), answers a connection."""
    for port in (8000, *(p for p in extra if p)):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
    return False


def _exit_on_term(signum: int, frame: Any) -> None:
    # `timeout` sends SIGTERM: leave through the `finally` that stops the system under test,
    # or it keeps answering on port 8000 and the next run measures it instead of its own
    raise SystemExit(128 + signum)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with ``--systems`` and ``--corpus`` defaulting to the workload's and
    every system checked to serve it."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="classify")
    ap.add_argument("--systems", default=None, help="default: the workload's (e2e_systems.py)")
    ap.add_argument(
        "--corpus", default=None, help="corpora, each at every level (default: the workload's)"
    )
    ap.add_argument(
        "--clients",
        default="1,16,64,256,512,1024",
        help="the levels, in order; a level given again is measured again with the system "
        "still up (64,256,64,256: its rows' repeat 2, listed apart in RESULTS.md)",
    )
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
    ap.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="the run's wall-clock allowance: a system is not started, and a level not begun, "
        "unless it fits in what is left (a system's usual start-up, e2e_systems' up_s, and one "
        "level), so a run under a time limit ends by itself with what it measured saved; what "
        "was left out is said in the run's note",
    )
    ap.add_argument(
        "--spy",
        default=None,
        metavar="DIR",
        help="sample two replicas of each system with py-spy over the levels of --spy-clients "
        "(raw stacks, every thread, a file a process and level in DIR; summarise with "
        "scripts/spy_top.py)",
    )
    ap.add_argument("--spy-clients", type=int, default=256, help="the level --spy samples")
    ap.add_argument(
        "--spy-native",
        action="store_true",
        help="with --spy: the C/C++ frames too (nvImageCodec's, CUDA's); py-spy then pauses "
        "the process for each sample, so that level's figures are not the system's",
    )
    ap.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 unless every system came up and answered every level without an error "
        "(a smoke run's check; a measurement keeps its errors as figures)",
    )
    args = ap.parse_args(argv)
    w = WORKLOADS[args.workload]
    args.systems = args.systems or w.systems
    args.corpus = args.corpus or w.corpora
    try:
        names = [variant(s) for s in args.systems.split(",") if s]
    except ValueError as exc:
        ap.error(str(exc))
    unknown = [s for s in names if s not in SYSTEMS]
    if unknown:
        ap.error(f"unknown systems {unknown}; known: {', '.join(SYSTEMS)}")
    other = [s for s in names if SYSTEMS[s]["workload"] != w.name]
    if other:
        ap.error(
            f"{other} serve another workload than {w.name!r}; its systems: "
            f"{', '.join(systems_of(w.name))}"
        )
    try:
        args.sets = parse_sets(args.set)
    except ValueError as exc:
        ap.error(str(exc))
    args.names = names
    return args


def variant(name: str) -> str:
    """A system named ``base[key=value;key=value]`` (in ``--systems``): Ferry's ``base`` with
    those sets besides its own, registered in ``SYSTEMS`` under its row name
    (``base[key=value,...]``), so two forms of one system are measured in one run -- where
    ``--set`` changes every Ferry system of the run. Any other name as it is."""
    base, bracket, rest = name.partition("[")
    if not bracket:
        return name
    if not rest.endswith("]") or base not in SYSTEMS or SYSTEMS[base]["kind"] != "ferry":
        raise ValueError(f"{name!r}: want FERRY_SYSTEM[section.key=value;...]")
    spec = SYSTEMS[base]
    sets = parse_sets([s for s in rest[:-1].split(";") if s])
    full = row_name(base, spec, sets)
    SYSTEMS[full] = {**spec, "sets": {**spec["sets"], **sets}}
    return full


def setup(args: argparse.Namespace) -> None:
    """What the workload needs before any system starts: the image workload's U-Net file."""
    if args.workload == "image":
        t0 = time.time()
        path = export_unet()
        print(f"== {WORKLOADS['image'].model}: {path} ({time.time() - t0:.0f} s)", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.gpu = gpu_name()
    corpora = [corpus_of(c) for c in args.corpus.split(",") if c]
    levels = [int(c) for c in args.clients.split(",")]
    log_dir = args.log_dir or os.path.dirname(os.path.abspath(args.out))
    os.makedirs(log_dir, exist_ok=True)
    rows, breakdown, described, runs, extra, displaced = kept(args, corpora)
    signal.signal(signal.SIGTERM, _exit_on_term)
    setup(args)

    budget, this_run, cuts = Budget(args.budget_s), max(runs, key=run_no), []
    earlier = len(rows)  # the rows kept from the file; this run's are appended after them
    note = runs[this_run]

    def save() -> None:
        runs[this_run] = note + "".join(f"; {c}" for c in cuts)
        for r in rows[earlier:]:  # this run's rows say so: a ratio is read within one run
            r["run"] = this_run
        new = {(r["system"], r["corpus"]) for r in rows[earlier:]}
        rows_out, breakdown_out, runs_out, extra_out = merged(
            rows, breakdown, runs, extra, displaced, new
        )
        _write(args, described, runs_out, rows_out, breakdown_out, extra_out)

    failed: list[str] = []
    with mps_server(args.mps):
        for name in args.names:
            start = len(rows)
            status = run_system(name, corpora, levels, args, log_dir, rows, breakdown, save, budget)
            if status != "ok":
                failed.append(f"{name}: {status}")
            if status.startswith(("not started", "not run", "cut")):
                cuts.append(f"{name} {status}")
            failed += [
                f"{r['system']} at {r['clients']} clients on {r['corpus']}: "
                f"{r['img_s']} answers/s, errors {r['errors_by_status']}"
                for r in rows[start:]
                if not r["img_s"] or r["errors"]
            ]
    save()
    try:
        png = os.path.splitext(args.out)[0] + ".png"
        image = any(r.get("workload") == "image" for r in rows)
        title = "ResNet-50 over HTTP, by corpus" + (
            " (frames720: the U-Net image workload, frames/s)" if image else ""
        )
        plot(rows, png, title, split_by="corpus")
    except Exception as exc:  # a plot must not lose the numbers
        print(f"plot failed: {exc}")
    if args.strict and failed:
        print("FAILED (--strict):\n  " + "\n  ".join(failed), flush=True)
        return 1
    return 0


def run_system(
    name: str,
    corpora: list[Corpus],
    levels: list[int],
    args: argparse.Namespace,
    log_dir: str,
    rows: list[dict[str, Any]],
    breakdown: dict[str, Any],
    save: Any,
    budget: Budget | None = None,
) -> str:
    """Start ``name``, measure it on every corpus at every level into ``rows`` (and its
    per-stage timings into ``breakdown``), ``save()`` after each level, and stop it by PID.
    Returns ``ok``, ``did not come up``, or, where ``budget`` ran short, ``not started ...``
    or ``cut ...`` (the levels it measured are in ``rows``)."""
    spec, system = SYSTEMS[name], row_name(name, SYSTEMS[name], args.sets, args.mps)
    w = WORKLOADS[spec["workload"]]
    budget = budget or Budget(None)
    # a level: its warm-up, its window, the wait for the replicas' export and the reads
    level_s = args.warmup + args.seconds + ray_probe.EXPORT_WAIT_S + 3
    print(f"== {system}", flush=True)
    if not budget.fits(spec["up_s"] + STOP_S + level_s):  # its start-up, a level, its stop
        print(f"   not started: {budget.left():.0f} s left of --budget-s", flush=True)
        return f"not started ({budget.left():.0f} s of the budget left)"
    own_port = direct_port(spec, args.sets)
    if port_taken(own_port):  # something left from an earlier run would answer for this system
        stop(None)
        deadline = time.time() + 60  # a run cut by `timeout` may still be shutting down
        while port_taken(own_port) and time.time() < deadline:
            time.sleep(2)
        if port_taken(own_port):
            print(f"{name} not run: port 8000 or {own_port} still taken after 60 s", flush=True)
            return "not run: its ports still taken after 60 s"
    t0 = time.time()
    config = serve_config(name, spec, args.sets)
    log = os.path.join(log_dir, f"serve_{name}.log")
    proc = start_app(config, log, {**spec["env"], **ray_probe.EXPORT_ENV})  # (every system)
    collect = spec["kind"] == "ferry" or w.answers_jpeg  # the image peer times its batches
    try:
        url, first = url_of(spec, args.sets), corpora[0].bodies[0]
        own = spec.get("headers") or {}  # the system's own request headers (``_nowatch``)
        headers = {**JPEG, **w.headers(), **own}

        # the start-up waits: the system's own allowance, within what the budget has left
        # past one level and the stop
        def allowance() -> float:
            return budget.within(spec["startup_s"] - (time.time() - t0), level_s + STOP_S)

        up = wait_ok(
            url, allowance(), proc, first, headers, request_timeout=10, failed=serve_failure
        )
        if not up:
            print(f"{name} did not come up; see serve_{name}.log", flush=True)
            return "did not come up"
        first_s = round(time.time() - t0, 1)
        starting = wait_settled(allowance(), proc)
        settled = round(time.time() - t0, 1) if starting == [] else None  # (None: not seen)
        startup = {"first_answer": first_s, "all_replicas": settled}
        print(f"   up in {startup} s; still starting: {starting}", flush=True)
        mps = mps_servers() if args.mps else None  # [] under --mps: no client connected
        if mps is not None:
            print(f"   MPS servers: {mps or 'none: the replicas are not its clients'}", flush=True)
        dtypes = precisions() if spec["kind"] == "ferry" else {}
        if dtypes:
            print(f"   precision: {dtypes}", flush=True)
        for c in corpora:
            loadgen.run(url, c.bodies, "image/jpeg", 32, 4, warmup=1, extra_headers=headers)
            seen: dict[int, int] = {}  # a level given again (--clients 64,256,64): its repeat
            for n in levels:
                seen[n] = seen.get(n, 0) + 1
                if not budget.fits(level_s + STOP_S):  # the level and the system's stop
                    print(f"   cut by --budget-s before {c.name} at {n} clients", flush=True)
                    return f"cut before {c.name} at {n} clients (--budget-s)"
                row, timings = measure(
                    system, url, c, n, args, collect, proc.ferry_run_id, spec.get("replicas"), own
                )
                if dtypes:
                    row["precision"] = dtypes
                row["startup_s"] = startup
                if mps is not None:
                    row["mps_servers"] = mps
                if starting != []:  # the level may have measured part of the app: say so
                    row["replicas_starting"] = starting or NOT_READ
                if seen[n] > 1:  # the same system, up all along, at this level again (its
                    row["repeat"] = seen[n]  # stage times in the row's stage_totals only)
                rows.append(row)
                if timings and seen[n] == 1:
                    breakdown[f"{system}@{c.name}@{n}"] = timings
                save()  # a run cut off keeps every level it measured
    finally:
        stop(proc)  # (the session's logs stay: its replicas' warnings are kept below)
        ray_probe.keep_replica_lines(os.path.join(log_dir, f"replicas_{name}.log"))
        os.unlink(config)
    return "ok"


def _write(
    args: argparse.Namespace,
    corpora: dict[str, str],
    runs: dict,
    rows: list,
    breakdown: dict,
    extra: dict[str, Any] | None = None,
) -> None:
    """The output file: what this script measures (``WRITTEN``), then ``extra`` -- the
    earlier file's other top-level keys, as ``kept`` carried them."""
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
    out.update({k: v for k, v in (extra or {}).items() if k not in out})
    write_json(args.out, out)


if __name__ == "__main__":
    sys.exit(main())
