"""Run locust headless as its own process, level by level, and write CSVs, a JSON summary
and plots (throughput and p50/p99 against concurrency, one line per system).

    python -m loadtest.run --url http://127.0.0.1:8000 --users 1,16,64 --seconds 20
    python -m loadtest.run --config serve_config.yaml --users 1,8 --seconds 10   # starts the app itself
    python -m loadtest.run --plot-only loadtest/results/*/summary.json --out loadtest/results/all

Locust is never imported here: it runs as a subprocess (gevent and a process that already
imported ssl do not mix), so this runner can be called from anywhere, Ray included.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from loadtest import procs
from loadtest.plots import plot

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def parse_stats_csv(path: str, seconds: float | None = None) -> dict[str, Any]:
    """The ``Aggregated`` row of a locust ``*_stats.csv`` as our row fields."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    agg = next((r for r in rows if r.get("Name") == "Aggregated"), None)
    if agg is None:
        raise ValueError(f"{path} has no Aggregated row")

    def num(k: str) -> float:
        v = agg.get(k, "") or "0"
        return float(v) if v not in ("N/A", "") else 0.0

    reqs, fails = int(num("Request Count")), int(num("Failure Count"))
    ok = reqs - fails
    rps = ok / seconds if seconds else num("Requests/s") * (ok / reqs if reqs else 0)
    return {
        "requests": reqs,
        "errors": fails,
        "img_s": round(rps, 2),
        "p50_ms": num("50%"),
        "p99_ms": num("99%"),
    }


def write_summary(
    rows: list[dict[str, Any]], out_dir: str, meta: dict[str, Any] | None = None
) -> str:
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "summary.json")
    with open(path, "w") as f:
        json.dump({**(meta or {}), "rows": rows}, f, indent=2)
        f.write("\n")
    return path


def subprocess_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment for a child that starts its own Ray: no RAY_ADDRESS inherited, the
    checkout importable."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(extra or {})
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def wait_ready(url: str, timeout: float, proc: subprocess.Popen | None = None) -> bool:
    """Poll ``/v2/health/ready`` until it answers 200, ``timeout`` passes or ``proc`` exits."""
    return wait_ok(url + "/v2/health/ready", timeout, proc)


def wait_ok(
    url: str,
    timeout: float,
    proc: subprocess.Popen | None = None,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    request_timeout: float = 2.0,
    failed: Callable[[], str | None] | None = None,
) -> bool:
    """Request ``url`` (GET, or POST of ``body``) every 2 s until it answers 200 (True), or
    ``timeout`` passes, ``proc`` exits or ``failed`` says why it never will (False; that
    reason printed: ``serve_failure`` for a Serve app whose deployment failed)."""
    import urllib.request

    end = time.time() + timeout
    while time.time() < end and (proc is None or proc.poll() is None):
        why = failed() if failed is not None else None
        if why:
            print(f"   not waiting any longer: {why}", flush=True)
            return False
        try:
            req = urllib.request.Request(url, data=body, headers=headers or {})
            with urllib.request.urlopen(req, timeout=request_timeout) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(2)
    return False


def serve_apps(dashboard: str = "http://127.0.0.1:8265") -> dict[str, Any] | None:
    """The Serve applications on this machine as the dashboard's REST API gives them
    (``{name: {"status", "message", "deployments": ...}}``), or None where it does not answer."""
    import urllib.request

    token = os.environ.get("RAY_AUTH_TOKEN")
    path = os.path.expanduser("~/.ray/auth_token")  # where a local Ray writes the one it made
    if not token and os.path.exists(path):
        with open(path) as f:
            token = f.read().strip()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    req = urllib.request.Request(f"{dashboard}/api/serve/applications/", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=2) as r:
            return json.loads(r.read()).get("applications") or {}
    except (OSError, ValueError):
        return None


def serve_failure(dashboard: str = "http://127.0.0.1:8265") -> str | None:
    """Why a Serve app on this machine failed to deploy (an application in DEPLOY_FAILED: its
    message, the replicas' constructor error among it), or None -- also where the dashboard
    does not answer yet. Serve gives a deployment up after its replicas' constructors failed
    a bounded number of times; until then a broken config looks like a slow start."""
    for name, app in (serve_apps(dashboard) or {}).items():
        if (app or {}).get("status") == "DEPLOY_FAILED":
            msg = " ".join(str(app.get("message") or "").split())
            return f"app {name!r} DEPLOY_FAILED: {msg[:1500]}"
    return None


def serve_starting(dashboard: str = "http://127.0.0.1:8265") -> list[str] | None:
    """The deployments of this machine's Serve apps whose replicas are not all up yet
    (``"app/deployment: STATUS"``; [] once every one is HEALTHY), or None where the dashboard
    does not answer. An app answers requests as soon as one replica of each deployment runs:
    a benchmark that starts then measures a part of it (a torch model's replicas compile one
    after another, for minutes)."""
    apps = serve_apps(dashboard)
    if apps is None:
        return None
    return [
        f"{a}/{d}: {(dep or {}).get('status')}"
        for a, app in apps.items()
        for d, dep in ((app or {}).get("deployments") or {}).items()
        if (dep or {}).get("status") != "HEALTHY"
    ]


def wait_settled(
    timeout: float,
    proc: subprocess.Popen | None = None,
    dashboard: str = "http://127.0.0.1:8265",
) -> list[str] | None:
    """Wait (every 2 s, at most ``timeout``) until every deployment of this machine's Serve
    apps is HEALTHY; what was still starting at the end ([] when all came up; None where
    the dashboard never answered: a reading that fails is waited past, as one that says
    "starting" is). A deployment that failed or turned unhealthy ends the wait at once: it
    will not come up by waiting, and a device call's minutes are few."""
    end, left = time.time() + timeout, serve_starting(dashboard)
    while left != [] and time.time() < end and (proc is None or proc.poll() is None):
        if left and any(s.endswith((": DEPLOY_FAILED", ": UNHEALTHY")) for s in left):
            break
        time.sleep(2)
        reading = serve_starting(dashboard)
        left = left if reading is None else reading  # (a failed reading keeps the last one)
    return left


def venv_bin(name: str) -> str:
    """The command ``name`` installed beside this interpreter (its venv's), else from PATH."""
    path = os.path.join(os.path.dirname(sys.executable), name)
    return path if os.path.exists(path) else name


def start_app(
    config: str, log_path: str, extra_env: dict[str, str] | None = None
) -> subprocess.Popen:
    """`serve run CONFIG` as its own process group (a fresh local Ray), logging to a file.
    Its environment carries a run id of its own (``loadtest.procs``): ``stop_app`` ends,
    by PID, whatever it started, the HAProxy and Ray daemons that outlive it included."""
    run_id = procs.new_run_id("serve")
    # RAY_ADDRESS=local: a Ray of its own, even where another runs on the machine (serve run
    # with no address joins the newest one it finds: a benchmark redeployed a test's app)
    env = subprocess_env({"RAY_ADDRESS": "local", **(extra_env or {}), procs.MARK: run_id})
    proc = subprocess.Popen(
        [venv_bin("serve"), "run", config],
        cwd=ROOT,
        env=env,
        stdout=open(log_path, "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    proc.ferry_run_id = run_id  # type: ignore[attr-defined]
    return proc


def stop_app(proc: subprocess.Popen, timeout: float = 60) -> dict[int, str]:
    """Ctrl-C to the group (Serve shuts down and so does its Ray), a kill if it hangs, then
    SIGTERM/SIGKILL by PID to what it left behind (Serve's HAProxy outlives ``ray stop``);
    those leftovers, pid -> command line."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    run_id = getattr(proc, "ferry_run_id", None)
    return procs.stop(run_id) if run_id else {}


def end_local_ray(proc: subprocess.Popen | None, timeout: float = 60) -> None:
    """Stop ``serve run`` (if given) and, by PID, the local Ray and HAProxy it started
    (``stop_app``). Nothing else on the machine is touched: no ``ray stop``, no ``pkill``."""
    if proc is not None:
        stop_app(proc, timeout)


def run_level(
    url: str,
    users: int,
    seconds: float,
    out_dir: str,
    user_class: str,
    model: str,
    shape: str | None = None,
    processes: int = 1,
) -> dict[str, Any]:
    """One locust run: ``users`` clients of ``user_class`` for ``seconds``, or -- with
    ``shape`` (step, pulse, slow) -- that load shape for ``seconds`` (its CSVs then include
    the per-second history, ``{shape}_stats_history.csv``). ``processes`` > 1: locust forks
    that many worker processes (``--processes``), for a load one core cannot send."""
    prefix = os.path.join(out_dir, shape or f"u{users}")
    cmd = [venv_bin("locust"), "-f", os.path.join(HERE, "locustfile.py"), "--headless"]
    if shape is None:
        cmd += ["-u", str(users), "-r", str(users)]
    cmd += ["-t", f"{int(seconds)}s", "--csv", prefix, "--only-summary", "--host", url]
    cmd += ["--stop-timeout", "10", "--loglevel", "WARNING"]
    cmd += ["--processes", str(processes)] if processes > 1 else []
    cmd += ["--csv-full-history"] if shape else [user_class]
    env = {
        **os.environ,
        "FERRY_MODEL": model,
        "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
        procs.MARK: procs.new_run_id("locust"),  # its --processes workers are stopped by it
    }
    env.pop("FERRY_SHAPE", None)
    if shape:
        env["FERRY_SHAPE"] = shape
        env["FERRY_SHAPE_SECONDS"] = str(seconds)
    t0 = time.time()
    with open(prefix + "_locust.log", "wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            el = time.time() - t0
            print(
                f"\r  {users:>5} users: {min(el, seconds):5.0f}/{seconds:.0f} s", end="", flush=True
            )
            time.sleep(1)
    print()
    procs.stop(env[procs.MARK])  # a worker that outlived its master
    if proc.returncode not in (0, 1):  # locust exits 1 when any request failed
        raise RuntimeError(f"locust failed ({proc.returncode}); see {prefix}_locust.log")
    return parse_stats_csv(prefix + "_stats.csv", seconds)


def run_levels(url: str, args: argparse.Namespace) -> list[dict]:
    """The run's rows: one for ``--shape``, else one per ``--users`` level, each printed."""
    rows = []
    if args.shape:
        r = run_level(url, 0, args.seconds, args.out, "", args.model, args.shape)
        rows.append({"system": args.system, "shape": args.shape, **r})
        print(f"  {args.shape}: {r['img_s']:.1f} img/s, errors {r['errors']}; CSVs in {args.out}")
    for n in () if args.shape else (int(u) for u in args.users.split(",")):
        r = {
            "system": args.system,
            "clients": n,
            **run_level(url, n, args.seconds, args.out, args.user_class, args.model),
        }
        rows.append(r)
        print(
            f"  {n:>5} users: {r['img_s']:9.1f} img/s  p50 {r['p50_ms']:8.1f} ms  p99 {r['p99_ms']:8.1f} ms  "
            f"errors {r['errors']}",
            flush=True,
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--url", help="a running Ferry (http://host:port)")
    ap.add_argument("--config", help="start this Serve config with `serve run` and test it")
    ap.add_argument("--users", default="1,16,64")
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--model", default="resnet50")
    ap.add_argument(
        "--user-class", default="ClassifyUser", choices=["ClassifyUser", "V2User", "SlowUploadUser"]
    )
    ap.add_argument(
        "--system", default="ferry", help="the name of this system in the summary and plots"
    )
    ap.add_argument("--out", default=os.path.join(HERE, "results", "run"))
    ap.add_argument("--plot-only", nargs="*", help="merge these summary.json files into one plot")
    ap.add_argument(
        "--shape",
        choices=["step", "pulse", "slow"],
        help="run this load shape for --seconds instead of the --users levels (CSVs, summary)",
    )
    args = ap.parse_args(argv)
    if args.plot_only:
        rows = [r for p in args.plot_only for r in json.load(open(p))["rows"]]
        write_summary(rows, args.out, {"merged": args.plot_only})
        print(plot(rows, os.path.join(args.out, "summary.png")))
        return 0
    if not args.url and not args.config:
        ap.error("give --url or --config")
    os.makedirs(args.out, exist_ok=True)
    proc = None
    url = args.url or "http://127.0.0.1:8000"
    try:
        if args.config:
            print(f"starting {args.config} ...", flush=True)
            proc = start_app(args.config, os.path.join(args.out, "serve.log"))
            if not wait_ready(url, 300, proc):
                raise SystemExit(f"the app did not become ready; see {args.out}/serve.log")
        rows = run_levels(url, args)
    finally:
        if proc is not None:
            stop_app(proc)
    write_summary(
        rows,
        args.out,
        {"url": url, "seconds": args.seconds, "model": args.model, "user_class": args.user_class},
    )
    if not args.shape:  # a shape's time course is in its _stats_history.csv
        print(plot(rows, os.path.join(args.out, "summary.png"), f"{args.system}: {args.model}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
