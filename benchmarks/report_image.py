"""The image workload's part of RESULTS.md's end-to-end section (``report_e2e.e2e_section``
calls it for a corpus whose rows carry ``"workload": "image"``): Ferry against the best of
the image peers, issue 33's goals, and where a frame's time goes in each system (the
answers' ``Server-Timing``, averaged)."""

from __future__ import annotations

FERRY = "ferry_image"
PEER = "rayserve_image"
GOAL_FPS, GOAL_RATIO, GOAL_P99_MS = 3000, 1.5, 100


def _peak(rows: list[dict], system: str) -> float:
    return max((r["img_s"] for r in rows if r["system"] == system), default=0.0)


def goals(rows: list[dict]) -> list[str]:
    """Issue 33's goals on one H200 that these rows can judge."""
    ferry = _peak(rows, FERRY)
    peers = {r["system"]: _peak(rows, r["system"]) for r in rows if r["system"].startswith(PEER)}
    out = [f"* `{FERRY}`'s peak: {ferry:,.0f} frames/s (goal >= {GOAL_FPS:,})."]
    best = max(peers, key=peers.get, default=None)
    if best and peers[best]:
        out.append(
            f"* vs the expert Ray Serve app at its best replica count ({best}, "
            f"{peers[best]:,.0f} frames/s): {ferry / peers[best]:.2f}x (goal >= {GOAL_RATIO}x)."
        )
    at256 = [r for r in rows if r["system"] == FERRY and r["clients"] == 256]
    if at256 and at256[0]["p99_ms"] is not None:
        out.append(f"* p99 at 256 clients: {at256[0]['p99_ms']:.0f} ms (goal <= {GOAL_P99_MS} ms).")
    return out


def stage_table(bd: dict[str, dict], system: str, corpus: str) -> list[str]:
    """Mean ms per stage of ``system``'s answers on ``corpus``, a row per client level."""
    picks = {k: v for k, v in bd.items() if k.startswith(f"{system}@{corpus}@")}
    if not picks:
        return []
    keys = list(dict.fromkeys(k for v in picks.values() for k in v))
    lines = ["| clients | " + " | ".join(keys) + " |", "|" + "---|" * (len(keys) + 1)]
    for k in sorted(picks, key=lambda x: int(x.rsplit("@", 1)[1])):
        cells = " | ".join(f"{picks[k][x]:.1f}" if x in picks[k] else "-" for x in keys)
        lines.append(f"| {k.rsplit('@', 1)[1]} | {cells} |")
    return ["", f"Where a frame's time goes in `{system}` (mean ms, `Server-Timing`):", "", *lines]


def image_lines(rows: list[dict], bd: dict[str, dict], corpus: str) -> list[str]:
    """What follows the corpus's level table: the goals, then each system's stages."""
    out = [
        "",
        "The image workload: frames/s (the rows' `img_s`); an answer counts only as a JPEG "
        "of its frame's size. Against the goals:",
        "",
        *goals(rows),
    ]
    for system in dict.fromkeys(r["system"] for r in rows):
        out += stage_table(bd, system, corpus)
    return out
