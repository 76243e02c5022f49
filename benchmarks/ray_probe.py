"""What a benchmark reads of a running local Ray/Serve from outside it (no ``ray`` import, so
it works beside `serve run` in its own process): Ray's metrics endpoints, found in the
session directory's Prometheus service discovery file, and the Serve processes' RSS, found
by their process titles (``ray::ServeReplica:app:Deployment``, ``ray::ProxyActor``)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import urllib.request
from typing import Any

LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

EXPORT_MS = 2000
"""Ray's metrics report interval in the apps ``bench_e2e`` starts (``EXPORT_ENV``; Ray's own
default is 10 s, longer than a level: a level's reading of the replicas' totals was of the
level before it -- seen on an H100, 2026-12-06). What a replica records reaches the metrics
endpoint within its buffer's flush (0.5 s) and one report interval: ``EXPORT_WAIT_S``."""
EXPORT_ENV = {"RAY_metrics_report_interval_ms": str(EXPORT_MS)}
EXPORT_WAIT_S = EXPORT_MS / 1000 + 1.0  # (0.5 s of flush, 0.5 s of margin)


def session_dir() -> str:
    base = os.environ.get("RAY_TMPDIR", "/tmp") + "/ray"
    return os.path.join(base, "session_latest")


def metrics_targets() -> list[str]:
    """``host:port`` of every node's metrics endpoint of the latest local session."""
    path = os.path.join(session_dir(), "prom_metrics_service_discovery.json")
    with contextlib.suppress(OSError, ValueError), open(path) as f:
        return [t for group in json.load(f) for t in group.get("targets", [])]
    return []


def scrape(
    prefix: str = "ray_ferry_", targets: list[str] | None = None
) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every series whose name starts with ``prefix``, from
    ``targets`` (``host:port``; the latest local session's by default)."""
    out = []
    for t in metrics_targets() if targets is None else targets:
        try:
            text = urllib.request.urlopen(f"http://{t}/metrics", timeout=10).read().decode()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("#") or not line.startswith(prefix):
                continue
            m = LINE.match(line)
            if m:
                with contextlib.suppress(ValueError):
                    out.append(
                        (m.group(1), dict(LABEL.findall(m.group(2) or "")), float(m.group(3)))
                    )
    return out


def rejected() -> dict[str, float]:
    """``ray_ferry_rejected_total`` summed over replicas, by reason."""
    out: dict[str, float] = {}
    for name, lab, v in scrape("ray_ferry_rejected_total"):
        if name == "ray_ferry_rejected_total":
            out[lab.get("reason", "")] = out.get(lab.get("reason", ""), 0.0) + v
    return out


def ingress_groups() -> tuple[float, float]:
    """(calls, items): what the ingress replicas have sent downstream so far, summed over
    replicas and models -- ``ray_ferry_ingress_groups_total`` (each call a coalesced group)
    and ``ray_ferry_ingress_group_items_total`` (their images or tensor rows)."""
    calls = items = 0.0
    for name, _, v in scrape("ray_ferry_ingress_group"):
        if name == "ray_ferry_ingress_groups_total":
            calls += v
        elif name == "ray_ferry_ingress_group_items_total":
            items += v
    return calls, items


def ingress_groups_after(
    before: tuple[float, float], items: float, limit_s: float = 30.0
) -> tuple[float, float] | None:
    """``ingress_groups`` once ``items`` more items than ``before`` have been exported (Ray
    exports each replica's counters on its own period, seconds behind), polled each second;
    None if they are not in by ``limit_s``."""
    import time

    deadline = time.monotonic() + limit_s
    while True:
        now = ingress_groups()
        if now[1] - before[1] >= items:
            return now
        if time.monotonic() > deadline:
            return None
        time.sleep(1.0)


def gauge(series: str) -> dict[str, float]:
    """One gauge per replica, e.g. ``ray_ferry_pool_bytes_in_use``."""
    out = {}
    for name, lab, v in scrape(series):
        if name == series:
            key = lab.get("replica") or lab.get("ReplicaId") or lab.get("WorkerId") or "?"
            out[key] = v
    return out


def pool_bytes() -> dict[str, float]:
    """The device pool's bytes per replica: ``in_use <replica>`` (held by batches in flight,
    so it moves with the load) and ``reserved <replica>`` (held from the driver)."""
    out = {f"in_use {k}": v for k, v in gauge("ray_ferry_pool_bytes_in_use").items()}
    out.update({f"reserved {k}": v for k, v in gauge("ray_ferry_pool_bytes_reserved").items()})
    return out


def serve_rss() -> dict[str, int]:
    """RSS in bytes of every Serve replica and proxy process, by ``title pid``."""
    import psutil

    out = {}
    for p in psutil.process_iter(["pid", "cmdline"]):
        with contextlib.suppress(psutil.Error, IndexError):
            title = (p.info["cmdline"] or [""])[0]
            if title.startswith(("ray::ServeReplica:", "ray::ProxyActor")):
                # (Ray appends the running method to the title: one name per process)
                out[f"{title.split()[0].split('.')[0]} {p.info['pid']}"] = p.memory_info().rss
    return out


def replica_lines(
    pattern: str = r"\b(WARNING|ERROR|CRITICAL)\b", most: int = 400, base: str | None = None
) -> list[str]:
    """The lines of the latest session's Serve replica logs (``logs/serve/replica_*.log``)
    that match ``pattern``, each with its file's name, the last ``most``: what a replica
    said (a model served in float32, a graph not captured, an out-of-memory) where only the
    `serve run` driver's output is kept otherwise."""
    import glob

    rx = re.compile(pattern)
    out: list[str] = []
    root = base or session_dir()
    for path in sorted(glob.glob(os.path.join(root, "logs", "serve", "replica_*.log"))):
        with contextlib.suppress(OSError), open(path, errors="replace") as f:
            name = os.path.basename(path)
            out += [f"{name}: {ln.rstrip()}" for ln in f if rx.search(ln)]
    return out[-most:]


def keep_replica_lines(path: str, **kw: Any) -> int:
    """``replica_lines(**kw)`` written to ``path``; how many (0 where it cannot write)."""
    lines = replica_lines(**kw)
    try:
        with open(path, "w") as f:
            f.write("".join(f"{ln}\n" for ln in lines))
    except OSError:
        return 0
    return len(lines)


_STAGE_PARTS = {"ray_ferry_stage_latency_ms_sum": 0, "ray_ferry_stage_latency_ms_count": 1}


def stage_totals(targets: list[str] | None = None) -> dict[str, list[float]]:
    """The Ferry replicas' stage histograms (``ray_ferry_stage_latency_ms_{sum,count}``),
    summed over replicas and models, by stage: ``[ms summed, observations]`` since each
    replica started, as last exported; {} where none is (a peer). Two readings' difference
    is the mean between them: of the decode rounds' parts (``decode_wait`` an image,
    ``decode_host`` / ``decode_device`` a round) no answer's ``timings_ms`` says."""
    out: dict[str, list[float]] = {}
    for name, lab, v in scrape("ray_ferry_stage_latency_ms_", targets):
        if name in _STAGE_PARTS and "stage" in lab:
            out.setdefault(lab["stage"], [0.0, 0.0])[_STAGE_PARTS[name]] += v
    return out


_SERVE_BATCH = {
    "ray_serve_actual_batch_size_count": "batches",
    "ray_serve_actual_batch_size_sum": "items",
    "ray_serve_batch_wait_time_ms_sum": "wait_ms",
}


def serve_batch_counts(targets: list[str] | None = None) -> dict[str, float]:
    """Ray Serve's own ``@serve.batch`` histograms (a peer's batches), summed over replicas
    and functions: ``batches``, ``items`` in them, and ``wait_ms`` (each batch's wait for
    its requests, summed) since each replica started, as last exported; {} where no
    replica runs a ``@serve.batch`` function (Ferry's own batches: ``executor_counts``)."""
    out: dict[str, float] = {}
    for name, _lab, v in scrape("ray_serve_", targets):
        key = _SERVE_BATCH.get(name)
        if key is not None:
            out[key] = out.get(key, 0.0) + v
    return out


def executor_counts(targets: list[str] | None = None) -> dict[str, float]:
    """The Ferry replicas' executor counts (``ray_ferry_executor_{batches,items,padded_items,
    graph_replays,eager_runs,captures}``), summed over replicas: since each started, as last
    exported (a few seconds behind); {} where none is exported (a peer)."""
    out: dict[str, float] = {}
    for name, _lab, v in scrape("ray_ferry_executor_", targets):
        key = name.removeprefix("ray_ferry_executor_")
        out[key] = out.get(key, 0.0) + v
    return out
