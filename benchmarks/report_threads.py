"""Where the server's CPU goes, by process and thread, for RESULTS.md's end-to-end section
(``report_e2e.e2e_section`` calls it per corpus): each level's busiest threads of every
Ray/Serve/HAProxy process (``bench_e2e``'s ``server_threads``, the load generator left out),
in cores and in CPU ms an image -- issue 28's breakdown."""

from __future__ import annotations

TOP = 8
"""Threads shown: the busiest at any level."""


def thread_lines(rows: list[dict], system: str = "ferry") -> list[str]:
    """A table for ``system``'s rows of one corpus, one column per level; [] without thread
    readings."""
    mine = sorted((r for r in rows if r["system"] == system and r.get("server_threads")),
                  key=lambda r: r["clients"])  # fmt: skip
    if not mine:
        return []
    cores: dict[str, dict[int, float]] = {}
    for r in mine:
        for t in r["server_threads"]:
            name = f"{t['process'].removeprefix('ray::')} / {t['thread']}"
            cores.setdefault(name, {})[r["clients"]] = t["cores"]
    top = sorted(cores, key=lambda n: -max(cores[n].values()))[:TOP]
    head = " | ".join(f"{r['clients']} clients" for r in mine)
    lines = [
        "",
        f"Where `{system}`'s server CPU goes (its busiest threads at any level: cores busy, "
        "and CPU ms an image):",
        "",
        f"| process / thread | {head} |",
        "|" + "---|" * (len(mine) + 1),
    ]
    for n in top:
        cells = []
        for r in mine:
            c = cores[n].get(r["clients"])
            if c is None:
                cells.append("-")
            else:
                per = f", {c * 1e3 / r['img_s']:.2f} ms" if r["img_s"] else ""
                cells.append(f"{c:.2f}{per}")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    total = [
        f"{r['server_cores']:.2f}, {r['server_cpu_ms_per_img']:.2f} ms"
        if r.get("server_cores") is not None and r.get("server_cpu_ms_per_img") is not None
        else "-"
        for r in mine
    ]
    lines.append("| every server process | " + " | ".join(total) + " |")
    return lines
