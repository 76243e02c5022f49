"""One load level of ``bench_e2e.py``: the load generator's figures, the server's CPU (every
process of the system's ``serve run``, the load generator excluded) and the device's
utilisation, as one row of ``e2e.json``."""

from __future__ import annotations

import argparse
import subprocess
import time
from typing import Any

from benchmarks import loadgen, ray_probe
from benchmarks.device_sampler import DeviceSampler
from benchmarks.e2e_systems import WORKLOADS, Workload
from loadtest.cores import ServerSpan
from loadtest.corpus import Corpus


def _row(
    system: str,
    w: Workload,
    c: Corpus,
    n: int,
    args: argparse.Namespace,
    r: dict[str, Any],
    replicas: int | None,
    busy: float | None,
    server_cores: float,
    threads: list[dict[str, Any]],
    device: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One level's row: the load generator's figures ``r``, the server's CPU and the
    device's utilisation (``DeviceSampler.result()``: None where there is no NVML)."""
    return {
        "system": system,
        "gpu": getattr(args, "gpu", None),  # the run's device: one file holds several runs'
        "workload": w.name,
        "corpus": c.name,
        "replicas": replicas,
        "mps": args.mps,
        "clients": n,
        "img_s": r["img_s"],  # answers a second: images classified, or frames answered
        "p50_ms": r["p50_ms"],
        "p99_ms": r["p99_ms"],
        "errors": r["errors"],
        "errors_by_status": r["errors_by_status"],
        "loadgen_procs": r["loadgen_procs"],
        "loadgen_cpu_per_proc": r["loadgen_cpu_per_proc"],
        "machine_busy_cores": busy,
        "server_cores": round(server_cores, 2),
        # the server's CPU per answered image: every process of its `serve run` (Ray, Serve,
        # HAProxy, replicas), the load generator excluded
        "server_cpu_ms_per_img": round(server_cores / r["img_s"] * 1e3, 3) if r["img_s"] else None,
        # where those cores went: the busiest (process kind, thread name) pairs
        "server_threads": threads,
        # the GPU's busy time (a kernel running) and JPEG-engine utilisation over the level
        # (means, 0-1, from NVML; device_sampler.py)
        **(device or {"gpu_util": None, "gpu_jpeg_util": None}),
    }


_LAST_STAGES: dict[str, Any] = {}
"""The last level's ``stage_totals`` and ``executor_counts`` readings, and the ``serve run``
they were of."""


def per_image(rates: dict[str, float], img_s: float) -> dict[str, float]:
    """A level's machine counters (``loadtest.cores.counter_rates``) with the kernel's cores
    summed (system, irq, softirq) and each count a second also as a count an image."""
    if not rates:
        return {}
    out = dict(rates)
    kernel = sum(rates.get(k, 0.0) for k in ("system_cores", "irq_cores", "softirq_cores"))
    out["kernel_cores"] = round(kernel, 3)
    for k, v in rates.items():
        if k.endswith("_per_s") and img_s > 0:
            out[k[: -len("_per_s")] + "_per_img"] = round(v / img_s, 2)
    return out


def stage_means(now: dict[str, list[float]], before: dict[str, list[float]]) -> dict[str, float]:
    """Each stage's mean ms between two ``stage_totals`` readings of one system (the whole
    of ``now`` for a stage ``before`` lacks); a stage observed nothing between them is left
    out."""
    out = {}
    for stage, (ms, n) in now.items():
        ms0, n0 = before.get(stage, (0.0, 0.0))
        if n > n0:
            out[stage] = round((ms - ms0) / (n - n0), 3)
    return out


def level_batches(
    counts: dict[str, float],
    before: dict[str, float],
    stages: dict[str, list[float]],
    stages_before: dict[str, list[float]],
) -> dict[str, float]:
    """The model batches and decode rounds between two readings of one system (its
    executors' counts and stage totals, since each replica started; a peer's
    ``serve_batch_counts``): batches, their mean items, the padding rows' share of the rows
    run, a ``@serve.batch``'s mean wait, and images a decode round (one ``decode_wait`` an
    image, one ``decode_host`` a round). What a reading lacks is left out."""
    out: dict[str, float] = {}
    d = {
        k: counts[k] - before.get(k, 0.0)
        for k in ("batches", "items", "padded_items")
        if k in counts
    }
    if d.get("batches", 0) > 0 and "items" in d:
        out["batches"] = d["batches"]
        out["mean_batch"] = round(d["items"] / d["batches"], 2)
        if "wait_ms" in counts:  # a @serve.batch's mean wait for its requests
            wait = counts["wait_ms"] - before.get("wait_ms", 0.0)
            out["mean_batch_wait_ms"] = round(wait / d["batches"], 3)
        if "padded_items" in d and d["items"] + d["padded_items"] > 0:
            out["padding_share"] = round(d["padded_items"] / (d["items"] + d["padded_items"]), 3)
    images, rounds = (
        stages.get(k, (0.0, 0.0))[1] - stages_before.get(k, (0.0, 0.0))[1]
        for k in ("decode_wait", "decode_host")
    )
    if rounds > 0:
        out["round_images"] = round(images / rounds, 2)
    return out


def _spies(system: str, c: Corpus, n: int, args: argparse.Namespace, run_id: str) -> list:
    """py-spy on two of the system's replicas over this level, where ``--spy`` asks for it
    (``profile_pipeline.start_spies``; a file a process, named by system, corpus, level)."""
    if not getattr(args, "spy", None) or n != args.spy_clients:
        return []
    from benchmarks.profile_pipeline import ray_processes, start_spies

    prefix = f"{system.replace('+', '_')}_{c.name}_{n}_"
    span = args.warmup + args.seconds
    try:
        return start_spies(
            ray_processes(run_id), args.spy, span, native=args.spy_native, prefix=prefix
        )
    except OSError as exc:  # no py-spy here: the level is measured without it
        print(f"      py-spy not started: {exc}", flush=True)
        return []


def _spied(spies: list, span: float) -> None:
    """Wait for the level's spies (killed past ``span`` + 60 s), saying which failed."""
    for p in spies:
        try:
            rc = p.wait(timeout=span + 60)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = p.wait()
        if rc:
            print(f"      py-spy {' '.join(map(str, p.args[2:4]))} exited {rc}", flush=True)


def measure(
    system: str,
    url: str,
    c: Corpus,
    n: int,
    args: argparse.Namespace,
    collect: bool,
    run_id: str,
    replicas: int | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[dict[str, Any], dict[str, float] | None]:
    """One load level: its row, and the answers' mean per-stage timings when ``collect``.
    ``run_id``: the system's ``serve run`` (its processes' CPU is the server's); ``headers``:
    the system's own, beside the workload's (the row lists them)."""
    w: Workload = WORKLOADS[args.workload]
    spies = _spies(system, c, n, args, run_id)
    device = DeviceSampler()  # (before the span: NVML's first load may import Ray)
    span = ServerSpan(run_id)
    with device:
        r = loadgen.run(
            url,
            c.bodies,
            "image/jpeg",
            n,
            args.seconds,
            warmup=args.warmup,
            extra_headers={**w.headers(), **(headers or {})},
            collect_timings=collect,
            expect_sizes=w.expect(c),
        )
    # warm-up included: the level's whole span, its rate taken as the measured one
    span.end()
    server_cores, threads, busy = span.cores, span.threads, span.busy
    _spied(spies, args.warmup + args.seconds)
    row = _row(system, w, c, n, args, r, replicas, busy, server_cores, threads, device.result())
    row["machine"] = per_image(span.machine, r["img_s"])
    img_s = max(r["img_s"], 1e-9)  # the run's threads that switched most, and an image
    row["switches"] = [
        {**t, "per_img": round(t["switches_per_s"] / img_s, 3)} for t in span.switches
    ]
    if headers:
        row["headers"] = headers
    if spies:  # py-spy ran on two replicas over this level (native: pausing them)
        row["spy"] = "native" if args.spy_native else "sampled"
    # the executors' counts since each replica started (the warm-up's captures included),
    # read once the replicas have exported what they recorded up to the level's end (its
    # load stopped: nothing of the next level is in them): a capture under load shows as a
    # count that grows from one level's row to a later one's
    time.sleep(ray_probe.EXPORT_WAIT_S)
    counts = ray_probe.executor_counts()
    if counts:
        row["executor_counts"] = counts
    else:  # a peer: its @serve.batch batches, from Ray Serve's own histograms
        counts = ray_probe.serve_batch_counts()
        if counts:
            row["serve_batch_counts"] = counts
    stages = ray_probe.stage_totals()
    if stages:
        row["stage_totals"] = stages
    same = _LAST_STAGES.get("run") == run_id
    last = _LAST_STAGES.get("stages", {}) if same else {}
    last_counts = _LAST_STAGES.get("counts", {}) if same else {}
    _LAST_STAGES.update(run=run_id, stages=stages, counts=counts)
    batches = level_batches(counts, last_counts, stages, last)
    if batches:  # since the level before (or the start: the warm-up's batches in the first)
        row["level_batches"] = batches
    unit = "frames/s" if w.name == "image" else "img/s"
    print(
        f"   {c.name:>7} {n:>5} clients: {r['img_s']:8.1f} {unit}  p50 {r['p50_ms']} ms  "
        f"p99 {r['p99_ms']} ms  errors {r['errors_by_status'] or 0}  loadgen cpu "
        f"{r['loadgen_cpu_per_proc']}  busy cores {busy}  server cpu "
        f"{row['server_cpu_ms_per_img']} ms/img  GPU {row['gpu_util']}  JPEG engines "
        f"{row['gpu_jpeg_util']}  GPU memory peak {row.get('gpu_mem_peak_mib')} of "
        f"{row.get('gpu_mem_total_mib')} MiB"
        + (f" ({row['gpu_mem_error']})" if row.get("gpu_mem_error") else ""),
        flush=True,
    )
    m = row["machine"]
    if m:  # (the kernel's cores, switches and interrupts: a slow mode's machine-wide costs)
        print(
            f"      machine: user {m.get('user_cores')} / kernel {m.get('kernel_cores')} / "
            f"steal {m.get('steal_cores')} cores; an image {m.get('ctxt_per_img')} context "
            f"switches, {m.get('intr_per_img')} interrupts ({m.get('nvidia_intr_per_img')} "
            f"NVIDIA's), {m.get('tcp_in_segs_per_img')} TCP segments in / "
            f"{m.get('tcp_out_segs_per_img')} out, {m.get('tcp_opens_per_img')} connections "
            f"opened / {m.get('tcp_accepts_per_img')} accepted",
            flush=True,
        )
    for t in threads[:6]:
        print(f"      {t['cores']:6.2f} cores  {t['process']} / {t['thread']}", flush=True)
    for t in row["switches"][:4]:
        print(f"      {t['per_img']:6.2f} switches an image  {t['process']} / {t['thread']}")
    if r.get("mean_timings_ms"):
        print(f"      stages (mean ms): {r['mean_timings_ms']}", flush=True)
    if counts:
        print(f"      executor, since start: {counts}", flush=True)
    if batches:
        print(f"      batches and rounds over the level: {batches}", flush=True)
    decode = {k: v for k, v in stage_means(stages, last).items() if k.startswith("decode_")}
    if decode:  # since the level before (or the start), as Ray last exported the totals
        print(f"      decode rounds, mean ms over the level: {decode}", flush=True)
    return row, r.get("mean_timings_ms")


def precisions(base: str = "http://127.0.0.1:8000", timeout_s: float = 10) -> dict[str, Any]:
    """Each model's compute dtype as a Ferry app reports it (``GET /v1/models``: the dtype
    chosen at load and why, once its inference replica has answered), else {}: which one an
    engine ran in changes its GPU time several-fold, and it is not in the config."""
    import json
    import urllib.request

    try:
        with urllib.request.urlopen(f"{base}/v1/models", timeout=timeout_s) as r:
            models = json.load(r).get("models", [])
    except Exception:  # (a peer, or an app without the route: nothing to say)
        return {}
    return {m["name"]: m["precision"] for m in models if m.get("precision")}
