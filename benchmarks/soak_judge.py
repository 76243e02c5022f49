"""The soak's judgement (``soak.py``): Triton's memory-growth rule per process and pool,
the p99 drift between the halves, the windows, and the RESULTS.md lines of the runs."""

from __future__ import annotations

import argparse
from typing import Any


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 1)


def trimmed_mean(xs: list[float], trim: float = 0.1) -> float:
    xs = sorted(xs)
    k = int(len(xs) * trim)
    part = xs[k : len(xs) - k] or xs
    return sum(part) / len(part)


def growth(samples: list[tuple[float, float]], t_warm: float, t_half: float) -> dict[str, Any]:
    """Triton's rule on one series of (time, bytes): max after warm-up minus the trimmed mean
    of the second half, in MB."""
    after = [v for t, v in samples if t >= t_warm]
    second = [v for t, v in samples if t >= t_half]
    if not after or not second:
        return {"samples": len(samples), "growth_mb": None}
    tm = trimmed_mean(second)
    return {
        "samples": len(samples),
        "first_mb": round(samples[0][1] / 2**20, 1),
        "max_mb": round(max(after) / 2**20, 1),
        "second_half_trimmed_mean_mb": round(tm / 2**20, 1),
        "growth_mb": round((max(after) - tm) / 2**20, 1),
    }


def judge(args: argparse.Namespace, book: Any, rss, pool, t0: float, t1: float) -> dict[str, Any]:
    warm = t0 + min(args.warmup_s, (t1 - t0) / 4)
    half = warm + (t1 - warm) / 2
    ok = [(t, k, ms) for t, k, s, ms in book.rows if s == 200 and t >= warm]
    first = [ms for t, _, ms in ok if t < half]
    second = [ms for t, _, ms in ok if t >= half]
    p1, p2 = pct(first, 0.99), pct(second, 0.99)
    drift = round((p2 - p1) / p1, 3) if p1 and p2 else None
    windows = []
    w = warm
    while w < t1 - 1:
        xs = [ms for t, _, ms in ok if w <= t < w + args.window_s]
        windows.append({"from_s": round(w - t0), "requests": len(xs), "p99_ms": pct(xs, 0.99)})
        w += args.window_s
    kinds = sorted({k for _, k, _ in ok})
    per_kind = {}
    for k in kinds:
        a = [ms for t, kk, ms in ok if kk == k and t < half]
        b = [ms for t, kk, ms in ok if kk == k and t >= half]
        per_kind[k] = {
            "first_half_p99_ms": pct(a, 0.99),
            "second_half_p99_ms": pct(b, 0.99),
            "requests": len(a) + len(b),
        }
    procs = {k: growth(v, warm, half) for k, v in sorted(rss.items())}
    pools = {k: growth(v, warm, half) for k, v in sorted(pool.items())}
    worst = max(
        (
            p["growth_mb"]
            for p in [*procs.values(), *pools.values()]
            if p.get("growth_mb") is not None
        ),
        default=None,
    )
    statuses: dict[str, int] = {}
    for _, _, s, _ in book.rows:
        statuses[str(s)] = statuses.get(str(s), 0) + 1
    return {
        "duration_s": round(t1 - t0),
        "requests": len(book.rows),
        "requests_per_s": round(len(book.rows) / (t1 - t0), 1),
        "statuses": statuses,
        "bad_requests": sum(1 for _, k, _, _ in book.rows if k.startswith("bad")),
        "unexpected": book.unexpected,
        "shed_503": book.shed,
        "shed_share": round(book.shed / max(1, len(book.rows)), 4),
        "p99_first_half_ms": p1,
        "p99_second_half_ms": p2,
        "p99_drift": drift,
        "per_kind": per_kind,
        "windows": windows,
        "rss": procs,
        "pool_bytes": pools,
        "worst_growth_mb": worst,
        "pass": {
            "memory": worst is not None and worst <= args.max_growth_mb,
            "drift": drift is not None and abs(drift) <= args.max_drift,
            "no_unexpected": not book.unexpected,
        },
    }


def section(soaks: dict[str, Any]) -> list[str]:
    """RESULTS.md lines of the soak runs."""
    lines = [
        "| soak | config | machine | minutes | clients | requests | shed 503 | unexpected "
        "| worst growth MB | p99 1st / 2nd half ms | drift | pass |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, d in soaks.items():
        p = d["pass"]
        lines.append(
            f"| {name}{' (' + d['label'] + ')' if d.get('label') else ''} | {d['config']} | "
            f"{d['machine']} | {d['duration_s'] / 60:.0f} | {d['clients']} | {d['requests']} | "
            f"{d.get('shed_503', 'n/a')} | {sum(d['unexpected'].values())} | {d['worst_growth_mb']} | "
            f"{d['p99_first_half_ms']} / {d['p99_second_half_ms']} | {'n/a' if d['p99_drift'] is None else format(d['p99_drift'], '+.0%')} | "
            f"{'yes' if all(p.values()) else 'no: ' + ', '.join(k for k, v in p.items() if not v)} |"
        )
    notes = [f"* {name}: {d['conditions']}." for name, d in soaks.items() if d.get("conditions")]
    notes += [streams_line(name, d["streams"]) for name, d in soaks.items() if d.get("streams")]
    return lines + ([""] + notes if notes else [])


def streams_line(name: str, s: dict[str, Any]) -> str:
    """One RESULTS.md line of a soak's live streams (``soak_streams.summary``)."""
    w = s["whole"]
    refusals = ", ".join(f"{k} {v}" for k, v in w["refusals"].items()) or "none"
    dropped = ", ".join(f"{k} {v}" for k, v in w["dropped"].items()) or "none"
    return (
        f"* {name}, live streams: {s['players']} players of {s['model']} at {s['fps']:g} fps "
        f"({s['size']} JPEG, each {s['life_s']} s) ran {s['streams_run']} streams: "
        f"{w['opened']} opened and played, {w['refused']} refused at the handshake "
        f"({refusals}); {w['frames_sent']} frames sent, {w['answered']} answered "
        f"(p50 / p99 {w['latency_ms']['p50']} / {w['latency_ms']['p99']} ms), {w['errors']} "
        f"errors, dropped: {dropped}; the replica's stream book "
        f"{'idle at the end' if s.get('left_behind') is None else 'NOT idle at the end'}."
    )
