"""A load generator of live video streams: N WebSocket streams at F fps against
``/v1/streams/{model}``, frames from a corpus, for a number of seconds, at each N of a list.

    python -m loadtest.streams --url ws://127.0.0.1:8000/v1/streams/digits \\
        --streams 1,16,64 --fps 30 --seconds 10 --size 64x64 [--procs 4] [--token T]

Each stream opens (staggered over the first second), sends its frames on a fixed timetable
(frame ``i`` at ``i / fps`` s), reads every message, acknowledges what it read every few
frames (``{"read": n}``, as a well-behaved client does) and ends with ``{"end": true}``,
waiting for the rest of its answers. Per level it reports: the streams opened and refused
(with the reasons), frames sent, answered, failed and dropped (by reason), the latency of
the answered frames (from a frame's send to its answer: p50/p90/p99/max ms), each stream's
achieved fps (answers per second of its sending time) and the generator's own CPU. The
streams can be spread over processes (``--procs``); it imports nothing of Ray.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import resource
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import orjson
import websockets

from loadtest.corpus import _photo, fit
from pipeline.imaging import encode_jpeg

RECEIPT_EVERY = 4  # frames between two receipts (the service pauses past max(8, 2 s) unread)
COMPRESSIONS = {"none": None, "deflate": "deflate"}
"""What a stream offers the server (``--compression``): nothing by default. A frame is a JPEG,
which permessage-deflate does not shrink (a 640x360 frame of 54,042 bytes deflates to
53,715), yet a client that offers it -- ``websockets``' default, and browsers' -- makes the
client deflate every frame and the server inflate it: 1.2 ms and 0.19 ms a frame on the
2-core VM (README, "Live streams")."""


@dataclass
class StreamStats:
    """One stream's outcome."""

    opened: bool = False
    refused: str | None = None  # the close reason of a refusal at the handshake
    close_code: int | None = None
    sent: int = 0
    answered: int = 0
    errors: int = 0
    error_types: dict[str, int] = field(default_factory=dict)  # a frame's error, by its type
    dropped: dict[str, int] = field(default_factory=dict)
    latency_ms: list[float] = field(default_factory=list)
    sending_s: float = 0.0
    sent_at: list[float] = field(default_factory=list)  # perf_counter s, frame by frame


def frames_corpus(width: int, height: int, n: int = 30, quality: int = 85) -> list[bytes]:
    """``n`` JPEG frames of ``width`` x ``height``: a slow pan across a bundled photo (no two
    frames alike, as a video's)."""
    photo = _photo("astronaut")
    return [
        encode_jpeg(np.ascontiguousarray(fit(photo, width, height, i / max(1, n - 1))), quality)
        for i in range(n)
    ]


async def _stream(
    url: str,
    headers: dict[str, str],
    frames: list[bytes],
    fps: float,
    seconds: float,
    delay: float,
    compression: str | None = None,
) -> StreamStats:
    await asyncio.sleep(delay)
    st = StreamStats()
    try:
        ws = await websockets.connect(
            url,
            additional_headers=headers,
            max_size=None,
            open_timeout=60,
            compression=compression,
        )
    except (OSError, websockets.InvalidStatus, asyncio.TimeoutError) as exc:
        st.refused = f"connect: {type(exc).__name__}"
        return st
    try:
        await asyncio.gather(_send(ws, st, frames, fps, seconds), _read(ws, st))
    except websockets.ConnectionClosed:
        pass
    finally:
        await ws.close()
    st.close_code = ws.close_code
    if ws.close_code == 1013:  # refused at its handshake (try again later)
        st.refused = ws.close_reason
    st.opened = st.refused is None
    return st


async def _send(ws: Any, st: StreamStats, frames: list[bytes], fps: float, seconds: float) -> None:
    """Frame ``i`` at ``i / fps`` s, then the end."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    for i in range(max(1, round(seconds * fps))):
        await asyncio.sleep(max(0.0, t0 + i / fps - loop.time()))
        st.sent_at.append(time.perf_counter())
        await ws.send(frames[i % len(frames)])
        st.sent += 1
    st.sending_s = loop.time() - t0
    await ws.send('{"end": true}')


async def _read(ws: Any, st: StreamStats) -> None:
    """Every message, each frame's latency, a receipt every ``RECEIPT_EVERY`` frames."""
    last_receipt, receipts_closed = -1, False
    async for raw in ws:
        if isinstance(raw, bytes):  # an image's or a mask's bytes, right after its header
            continue
        now = time.perf_counter()
        m = orjson.loads(raw)
        if "dropped" in m:
            st.dropped[m["reason"]] = st.dropped.get(m["reason"], 0) + len(m["dropped"])
            last = m["dropped"][-1]
        elif "frame" not in m:  # a refusal, or an error that is no frame's
            continue
        else:
            last = m["frame"]
            if "error" in m:
                st.errors += 1
                kind = str(m.get("type", "?"))
                st.error_types[kind] = st.error_types.get(kind, 0) + 1
            else:
                st.answered += 1
                st.latency_ms.append((now - st.sent_at[last]) * 1e3)
        if last - last_receipt >= RECEIPT_EVERY and not receipts_closed:
            try:
                await ws.send(json.dumps({"read": last}))
            except websockets.ConnectionClosed:
                # the service closed the stream: the answers it sent before its close are
                # still buffered here, so count them too
                receipts_closed = True
            last_receipt = last


async def play(
    url: str,
    n: int,
    fps: float,
    seconds: float,
    frames: list[bytes],
    token: str | None = None,
    compression: str | None = None,
) -> list[StreamStats]:
    """``n`` streams at ``fps`` for ``seconds``, opened over the first second, each offering
    ``compression`` (None: none; ``"deflate"``: permessage-deflate)."""
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return await asyncio.gather(
        *(_stream(url, headers, frames, fps, seconds, i / max(1, n), compression) for i in range(n))
    )


def _play_in_process(args: tuple) -> tuple[list[dict[str, Any]], float]:
    url, n, fps, seconds, frames, token, compression = args
    cpu0 = _cpu()
    stats = asyncio.run(play(url, n, fps, seconds, frames, token, compression))
    out = []
    for s in stats:
        s.sent_at = []  # (not sent back)
        out.append(asdict(s))
    return out, _cpu() - cpu0


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run_level(
    url: str,
    n: int,
    fps: float,
    seconds: float,
    frames: list[bytes],
    token: str | None = None,
    procs: int = 1,
    compression: str | None = None,
) -> dict[str, Any]:
    """One level: ``n`` streams spread over ``procs`` processes; its summary."""
    procs = max(1, min(procs, n))
    shares = [n // procs + (1 if i < n % procs else 0) for i in range(procs)]
    jobs = [(url, k, fps, seconds, frames, token, compression) for k in shares]
    t0 = time.perf_counter()
    if procs == 1:
        results = [_play_in_process(jobs[0])]
    else:
        with mp.get_context("spawn").Pool(procs) as pool:
            results = pool.map(_play_in_process, jobs)
    wall = time.perf_counter() - t0
    stats = [StreamStats(**s) for part, _ in results for s in part]
    return summarize(stats, n, fps, seconds, wall, sum(c for _, c in results))


def _summed(counts: Any) -> dict[str, int]:
    """Counters by key, summed over streams."""
    out: dict[str, int] = {}
    for c in counts:
        for k, v in c.items():
            out[k] = out.get(k, 0) + v
    return out


def summarize(
    stats: list[StreamStats], n: int, fps: float, seconds: float, wall_s: float, cpu_s: float
) -> dict[str, Any]:
    opened = [s for s in stats if s.refused is None]
    lat = np.array([x for s in opened for x in s.latency_ms]) if opened else np.zeros(0)
    sent = sum(s.sent for s in opened)
    dropped = _summed(s.dropped for s in opened)
    per_stream = [s.answered / s.sending_s for s in opened if s.sending_s > 0]
    refusals: dict[str, int] = {}
    for s in stats:
        if s.refused is not None:
            refusals[s.refused] = refusals.get(s.refused, 0) + 1
    pct = (lambda q: round(float(np.percentile(lat, q)), 2)) if lat.size else (lambda q: None)
    return {
        "streams": n,
        "fps": fps,
        "seconds": seconds,
        "offered_fps": round(n * fps, 1),
        "opened": len(opened),
        "refused": n - len(opened),
        "refusals": refusals,
        "frames_sent": sent,
        "answered": sum(s.answered for s in opened),
        "errors": sum(s.errors for s in opened),
        "errors_by_type": _summed(s.error_types for s in opened),
        "dropped": dropped,
        "dropped_pct": round(100 * sum(dropped.values()) / sent, 3) if sent else None,
        "latency_ms": {"p50": pct(50), "p90": pct(90), "p99": pct(99), "max": pct(100)},
        "achieved_fps_per_stream": {
            "min": round(min(per_stream), 2) if per_stream else None,
            "p50": round(float(np.median(per_stream)), 2) if per_stream else None,
        },
        "answers_per_s": round(sum(s.answered for s in opened) / wall_s, 1),
        "close_codes": sorted({s.close_code for s in stats if s.close_code is not None}),
        "generator_cpu_s_per_s": round(cpu_s / wall_s, 3),
    }


def book_idle(b: dict[str, Any]) -> bool:
    """Whether the replica's stream book (``GET /v1/streams``) holds nothing: no stream, no
    declared rate, empty coalescers and GPU queue -- where a run must leave the service."""
    return (
        not b["streams"]
        and not any(b["admitted_fps"].values())
        and all(c["waiting"] == 0 and c["in_flight"] == 0 for c in b["coalescers"].values())
        and b["downstream"].get("queue_depth") == 0
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", required=True, help="ws://HOST:PORT/v1/streams/MODEL[?query]")
    ap.add_argument("--streams", default="1,16,64", help="stream counts, one level each")
    ap.add_argument("--fps", type=float, default=30.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--size", default="64x64", help="frame WIDTHxHEIGHT (JPEG)")
    ap.add_argument("--procs", type=int, default=1)
    ap.add_argument("--token", default=None)
    ap.add_argument("--out", default=None, help="write the levels as JSON here")
    ap.add_argument(
        "--compression",
        choices=sorted(COMPRESSIONS),
        default="none",
        help="permessage-deflate offered by each stream (COMPRESSIONS says why not by default)",
    )
    a = ap.parse_args(argv)
    w, h = (int(x) for x in a.size.lower().split("x"))
    frames = frames_corpus(w, h)
    sep = "&" if "?" in a.url else "?"
    url = f"{a.url}{sep}fps={a.fps:g}"
    levels = []
    for n in (int(x) for x in a.streams.split(",")):
        levels.append(
            run_level(
                url, n, a.fps, a.seconds, frames, a.token, a.procs, COMPRESSIONS[a.compression]
            )
        )
        print(json.dumps(levels[-1]), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(levels, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
