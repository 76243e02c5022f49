"""The load runs' plots: throughput and p50 / p99 latency against concurrency, one line per
system (``loadtest.run``'s summary.png, ``bench_e2e``'s e2e.png)."""

from __future__ import annotations

import os
from typing import Any


def draw(
    a: Any,
    b: Any,
    rows: list[dict[str, Any]],
    title: str = "",
    x_label: str = "concurrent clients",
    rate_label: str = "images / s",
) -> None:
    """Throughput on axes ``a`` and p50 (dashed) / p99 (solid) on ``b``, against concurrency
    (log x, named ``x_label``; the rate named ``rate_label``), one line per system."""
    systems = sorted(
        {r["system"] for r in rows}, key=lambda s: [r["system"] for r in rows].index(s)
    )
    for s in systems:
        rs = sorted((r for r in rows if r["system"] == s), key=lambda r: r["clients"])
        x = [r["clients"] for r in rs]
        (line,) = a.plot(x, [r["img_s"] for r in rs], marker="o", label=s)
        # a level where nothing was answered within the window has no latency to draw
        rs = [r for r in rs if r.get("p50_ms") is not None and r.get("p99_ms") is not None]
        x = [r["clients"] for r in rs]
        b.plot(x, [r["p99_ms"] for r in rs], marker="o", color=line.get_color(), label=f"{s} p99")
        b.plot(
            x,
            [r["p50_ms"] for r in rs],
            marker=".",
            linestyle="--",
            color=line.get_color(),
            label=f"{s} p50",
        )
    from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

    levels = sorted({r["clients"] for r in rows})
    prefix = f"{title}: " if title else ""
    a.set(xscale="log", xlabel=x_label, ylabel=rate_label, title=prefix + "throughput")
    b.set(
        xscale="log",
        yscale="log",
        xlabel=x_label,
        ylabel="latency (ms)",
        title=prefix + "p50 (dashed), p99 (solid)",
    )
    for ax in (a, b):  # the measured levels are the ticks, written out (8, not 10^0.9)
        ax.xaxis.set_major_locator(FixedLocator(levels))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(ScalarFormatter())
    a.set_ylim(bottom=0)  # throughput from 0: a small difference looks small
    a.grid(True, alpha=0.3)
    b.grid(True, alpha=0.3, which="both")
    a.legend(fontsize=8)
    b.legend(fontsize=8)


def plot(
    rows: list[dict[str, Any]],
    path: str,
    title: str = "",
    split_by: str | None = None,
    x_label: str = "concurrent clients",
    rate_label: str = "images / s",
) -> str:
    """Two panels against concurrency: throughput, and p50 / p99; with ``split_by`` (a row
    field, e.g. ``corpus``) one pair of panels per value of it, in one figure. ``x_label``
    and ``rate_label`` name the axes (a stream benchmark: streams, frames answered a second)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = (
        {"": rows}
        if split_by is None
        else {
            v: [r for r in rows if r.get(split_by) == v]
            for v in dict.fromkeys(r.get(split_by) for r in rows)
        }
    )
    fig, axes = plt.subplots(len(groups), 2, figsize=(12, 4.5 * len(groups)), squeeze=False)
    for (label, part), (a, b) in zip(groups.items(), axes, strict=True):
        draw(a, b, part, str(label) if split_by else "", x_label, rate_label)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
