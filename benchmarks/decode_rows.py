"""bench_decode's rows and its result: each row as it is measured (printed, and the JSON so
far saved), its ratios to the one-thread CPU row and to the peer's, and the result's JSON."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from benchmarks.common import machine, today


class Rows(list):
    """The run's rows; ``saved(rows)`` after each one is added (the JSON so far, so that a
    run cut short by its caller's time limit keeps what it measured)."""

    def __init__(self, saved: Callable[[list], None] | None = None) -> None:
        super().__init__()
        self.saved = saved


def add_row(rows: Rows, path: str, corpus: str, batch: int, measured: tuple) -> None:
    """Add the row of ``measured`` (img/s, CPU ms an image, images) and print it."""
    rate, cpu_ms, n = measured
    rows.append(
        {"path": path, "corpus": corpus, "batch": batch, "img_s": rate, "cpu_ms_per_img": cpu_ms}
    )
    print(f"{corpus} x{batch} {path}: {rate:,.0f} img/s, {cpu_ms:.3f} CPU ms/img ({n} images)")
    if rows.saved is not None:
        rows.saved(rows)


def of(rows: list, path: str, r: dict) -> dict | None:
    """The row of ``path`` with ``r``'s corpus and batch size, if it was measured."""
    key = (r["corpus"], r["batch"])
    return next((b for b in rows if b["path"] == path and (b["corpus"], b["batch"]) == key), None)


def ratios(rows: list) -> None:
    """Each row's rate and CPU over the one-thread CPU row of its corpus and batch size, and
    each GPU row's rate over the peer's (``img_s_vs_peer``)."""
    for r in rows:
        base = of(rows, "cpu_simplejpeg_1t", r)
        if base and base["img_s"] and base["cpu_ms_per_img"]:
            r["img_s_vs_cpu_1t"] = r["img_s"] / base["img_s"]
            r["cpu_ms_vs_cpu_1t"] = r["cpu_ms_per_img"] / base["cpu_ms_per_img"]
        if not r["path"].startswith("gpu_"):  # Ferry's GPU paths, against the peer's
            continue
        procs = r["path"].removesuffix("_sleep").rpartition("_")[2]  # x8p, or a backend
        peer = of(rows, "peer_torchvision" + (f"_{procs}" if procs[:1] == "x" else ""), r)
        if peer and peer["img_s"]:
            r["img_s_vs_peer"] = r["img_s"] / peer["img_s"]


def result_doc(
    args: argparse.Namespace, corpora: list, mps: bool, rows: list, complete: bool
) -> dict:
    """The result's JSON: the machine, the method, the rows (``complete``: False while the
    run goes on, and where it was cut short)."""
    return {
        "machine": machine(),
        "date": today(),
        "image": "; ".join(f"{c.name}: {c.description}" for c in corpora),
        "mps": mps,
        "method": (
            f"batch images per call, {args.in_flight} calls in flight (peer_torchvision: call "
            f"after call on one thread, as its replica's GPU thread runs them; its rows are "
            f"also normalised to float16, which Ferry leaves to the model's first kernel), "
            f"{args.seconds} s per row, one process (gpu_<backend>_x<N>p: N at once, "
            "started together, their rates summed); CPU ms = process CPU time (all "
            "threads) per image; baseline cpu_simplejpeg_1t of the same corpus and batch "
            "measured in the same run"
        ),
        "complete": complete,
        "rows": rows,
    }
