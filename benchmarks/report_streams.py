"""RESULTS.md's live-streams section (``streams.json``, ``bench_streams.py``): what ran, each
system's levels -- streams opened and refused, frames answered a second, latency, frames
dropped -- and Ferry against each peer level by level, then the plot."""

from __future__ import annotations

import os

from benchmarks.report_base import RES, md_table


def streams_section(doc: dict) -> list[str]:
    out = [
        f"{doc['label']}. Machine: {doc['machine']}; commit {doc.get('commit', '?')}, "
        f"{doc['date']}. Frames: {doc['frames']}; deadline: {doc['deadline_ms']}; "
        f"{doc.get('rest_s_between_levels', '?')} s of rest before each level.",
        "",
    ]
    for name, s in doc["systems"].items():
        head = f"`{name}` ({s.get('config', '?')}, model `{s.get('model', '?')}`"
        head += f", {s['query']})" if s.get("query") else ")"
        if s.get("cut"):
            head += f"; cut: {s['cut']}"
        if s.get("replicas_starting"):
            head += f"; replicas still starting: {s['replicas_starting']}"
        rows = [
            {
                "streams": lv["streams"],
                "opened": lv["opened"],
                "refused": lv["refused"],
                "fps offered": lv["offered_fps"],
                "answered / s": lv["answers_per_s"],
                "p50 / p99 ms": f"{lv['latency_ms'].get('p50')} / {lv['latency_ms'].get('p99')}",
                "dropped %": lv["dropped_pct"],
                "errors": lv["errors"],
            }
            for lv in s.get("levels", [])
        ]
        out += [head + ":", ""]
        if rows:
            out += [md_table(rows, [(k, k) for k in rows[0]]), ""]
        else:
            out += ["no level measured", ""]
    if doc.get("vs_peer"):
        cols = [
            ("peer", "peer"),
            ("streams", "streams"),
            ("Ferry / peer, answered a second", "answers_per_s_ratio"),
            ("Ferry p99 ms", "ferry_p99_ms"),
            ("peer p99 ms", "peer_p99_ms"),
            ("Ferry dropped %", "ferry_dropped_pct"),
        ]
        out += ["Ferry against each peer, level by level (one run):", ""]
        out += [md_table(doc["vs_peer"], cols), ""]
    if doc.get("note"):
        out += [doc["note"], ""]
    if os.path.exists(os.path.join(RES, "streams.png")):
        out += ["![streams](results/streams.png)", ""]
    return out
