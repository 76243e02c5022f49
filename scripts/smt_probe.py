"""Do two busy threads on one machine slow each other: the same Python work timed on core 0
alone, beside a busy loop on core 0's hyper-thread sibling (where the machine has one), and
beside a busy loop on a core that is not its sibling. A slow mode where every thread's CPU
an image doubles once more cores are busy (benchmarks/results/e2e_notes.md, 2026-12-07) fits
siblings that share one core; this says whether they do here and by how much.

    python scripts/smt_probe.py [--seconds 2] [--rounds 3] [--json OUT]

Prints the topology (``lscpu``'s threads a core, core 0's siblings) and each case's work a
CPU second relative to alone (below 1: the same work cost more CPU time), the median of
``--rounds`` interleaved rounds, and ``alone_spread`` (each alone round against their median:
the noise of the timing itself). Linux only (``sched_setaffinity``, ``/sys`` topology)."""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import time


def siblings(cpu: int) -> list[int]:
    """The logical CPUs that share ``cpu``'s core (itself included)."""
    path = f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list"
    out: list[int] = []
    with open(path) as f:
        for part in f.read().strip().split(","):
            lo, _, hi = part.partition("-")
            out += range(int(lo), int(hi or lo) + 1)
    return out


def _spin(cpu: int, stop: mp.Event) -> None:
    os.sched_setaffinity(0, {cpu})
    while not stop.is_set():
        for _ in range(10_000):
            pass


def work_rate(cpu: int, seconds: float) -> float:
    """Loops of plain Python a CPU second, pinned to ``cpu`` (thread CPU time, as the
    benchmarks' per-image figures count it)."""
    os.sched_setaffinity(0, {cpu})
    n, t0, c0 = 0, time.monotonic(), time.thread_time()
    while time.monotonic() - t0 < seconds:
        for _ in range(10_000):
            pass
        n += 1
    return n / max(time.thread_time() - c0, 1e-9)


def beside(busy: int | None, seconds: float) -> float:
    stop = mp.Event()
    p = None
    if busy is not None:
        p = mp.Process(target=_spin, args=(busy, stop), daemon=True)
        p.start()
        time.sleep(0.2)
    try:
        return work_rate(0, seconds)
    finally:
        stop.set()
        if p is not None:
            p.join(5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    keep = ("Model name", "Thread(s) per core", "Core(s) per socket", "Socket(s)", "CPU(s)")
    topo = [line for line in lscpu.splitlines() if line.startswith(keep)]
    sib = [c for c in siblings(0) if c != 0]
    # (a machine of one core, or whose other CPUs are all core 0's siblings, has no such case)
    other = next((c for c in sorted(os.sched_getaffinity(0)) if c != 0 and c not in sib), None)
    beside(None, args.seconds / 2)  # (a warm-up: the first timing of a process runs slow)
    cases: dict[str, int | None] = {"alone": None}
    if other is not None:
        cases["beside_other_core"] = other
    if sib:
        cases["beside_sibling"] = sib[0]
    rates: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(args.rounds):  # interleaved, so a drift of the host's speed hits each alike
        for k, busy in cases.items():
            rates[k].append(beside(busy, args.seconds))
    alone = statistics.median(rates["alone"])
    out = {
        "topology": topo,
        "cpu0_siblings": sib,
        "alone_loops_per_cpu_s": round(alone),
        "alone_spread": [round(r / alone, 3) for r in rates["alone"]],
        **{k: round(statistics.median(v) / alone, 3) for k, v in rates.items() if k != "alone"},
    }
    print(json.dumps(out, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
