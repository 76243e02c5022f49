"""A closed-loop HTTP load generator: N clients over P processes, aiohttp, images cycled.

    python benchmarks/loadgen.py --url http://127.0.0.1:8000/v1/models/resnet50/classify \
        --image chelsea.jpg [--image more.jpg ...] --clients 64 --seconds 30 [--procs 4] [--warmup 3]
    python benchmarks/loadgen.py --url 'http://127.0.0.1:8000/v1/models/unet/image?size=input' \
        --image frame.jpg --accept image/jpeg --expect-jpeg --clients 64 --seconds 30

Each client sends a request, waits for the answer, sends the next; with several images each
client cycles through all of them, starting at its own (clients hold different images at
any moment). It reports img/s (answers per second), p50/p99 latency, errors by status, and
the generator's own CPU use (user+system seconds per wall second, per process), so it can be
shown not to be the bottleneck. Run it as its own process: it imports nothing of Ray.

An image answer (``expect_sizes``, ``--expect-jpeg``) counts as OK only when it is a JPEG of
the size its request's image had: its SOF header is read and its last two bytes must be the
end-of-image marker, the image is not decoded (``jpeg_size``); any other answer with status
200 is an error, ``"200 not a WxH JPEG"``. The per-stage timings (``collect_timings``) come
from a JSON answer's ``timings_ms`` or an image answer's ``Server-Timing`` header.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import resource
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

# the start-of-frame markers that carry the image's size: SOF0..SOF15 but DHT, JPG and DAC
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# markers without a length: TEM, RST0..RST7 (SOI and EOI are read before the loop)
_BARE = frozenset(range(0xD0, 0xD8)) | {0x01}


def jpeg_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from a JPEG's start-of-frame header, or None when ``data`` is not a
    JPEG whose header says its size (a cheap check of an answer: no decoding)."""
    if len(data) < 4 or data[0] != 0xFF or data[1] != 0xD8:
        return None
    i, n = 2, len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in _BARE:
            i += 2
            continue
        if marker in (0xD9, 0xDA):  # EOI or scan data before any frame header
            return None
        length = int.from_bytes(data[i + 2 : i + 4], "big")
        if length < 2:
            return None
        if marker in _SOF:
            if i + 9 > n or length < 7:
                return None
            h = int.from_bytes(data[i + 5 : i + 7], "big")
            w = int.from_bytes(data[i + 7 : i + 9], "big")
            return (w, h) if w and h else None
        i += 2 + length
    return None


def server_timing(header: str) -> dict[str, float]:
    """``"ingress;dur=1.2, gpu;dur=3"`` -> ``{"ingress": 1.2, "gpu": 3.0}`` (entries without
    a numeric ``dur`` are left out)."""
    out: dict[str, float] = {}
    for entry in header.split(","):
        name, *params = (p.strip() for p in entry.split(";"))
        for p in params:
            key, _, value = p.partition("=")
            if name and key.strip().lower() == "dur":
                with contextlib.suppress(ValueError):
                    out[name] = float(value.strip().strip('"'))
    return out


def answer_error(status: int | str, payload: bytes, expect: tuple[int, int] | None) -> str | None:
    """Why an answer is not OK (its status, or that it is not a whole JPEG of ``expect``'s
    (width, height): that size in its frame header, and its end-of-image marker last), or
    None when it is."""
    if status != 200:
        return str(status)
    if expect is not None and (jpeg_size(payload) != tuple(expect) or payload[-2:] != b"\xff\xd9"):
        return f"200 not a {expect[0]}x{expect[1]} JPEG"
    return None


def _add_timings(timings: dict[str, float], payload: bytes, header: str | None) -> None:
    """Sum one answer's per-stage timings into ``timings`` (``_n``: the answers counted)."""
    got = server_timing(header) if header else json.loads(payload).get("timings_ms", {})
    for k, v in got.items():
        timings[k] = timings.get(k, 0.0) + v
    timings["_n"] = timings.get("_n", 0) + 1


async def _clients(
    url: str,
    bodies: Sequence[bytes],
    headers: dict[str, str],
    n: int,
    seconds: float,
    warmup: float,
    timings: dict[str, float] | None = None,
    first: int = 0,
    expect: Sequence[tuple[int, int]] | None = None,
) -> tuple[list[float], dict[str, int], int]:
    import aiohttp

    lat: list[float] = []
    errors: dict[str, int] = {}
    count_from = time.perf_counter() + warmup
    stop_at = count_from + seconds
    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as s:

        async def client(i: int) -> None:
            while True:
                t0 = time.perf_counter()
                if t0 >= stop_at:
                    return
                k = i % len(bodies)
                i += 1
                timing = payload = None
                try:
                    async with s.post(url, data=bodies[k], headers=headers) as r:
                        payload = await r.read()
                        status, timing = r.status, r.headers.get("server-timing")
                except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                    status = type(exc).__name__
                t1 = time.perf_counter()
                if t0 < count_from or t1 > stop_at:
                    continue
                err = answer_error(status, payload or b"", expect[k] if expect else None)
                if err is None:
                    lat.append(t1 - t0)
                    if timings is not None:  # the server's per-stage timings, summed
                        _add_timings(timings, payload, timing)
                else:
                    errors[err] = errors.get(err, 0) + 1

        await asyncio.gather(*(client(first + c) for c in range(n)))
    return lat, errors, n


def _proc(args: tuple, q: Any) -> None:
    url, bodies, headers, n, seconds, warmup, collect, first, expect = args
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    timings: dict[str, float] | None = {} if collect else None
    lat, errors, _ = asyncio.run(
        _clients(url, bodies, headers, n, seconds, warmup, timings, first, expect)
    )
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    q.put((lat, errors, cpu / wall, timings))


def _summary(
    out: list[tuple], clients: int, seconds: float, procs: int, collect_timings: bool
) -> dict[str, Any]:
    """The processes' results ``(latencies, errors, cpu, timings)`` as one level's figures."""
    lat = np.concatenate([np.asarray(o[0]) for o in out]) if out else np.zeros(0)
    errors: dict[str, int] = {}
    for o in out:
        for k, v in o[1].items():
            errors[k] = errors.get(k, 0) + v
    cpu = [round(o[2], 2) for o in out]
    stage: dict[str, float] = {}
    for o in out:
        for k, v in (o[3] or {}).items():
            stage[k] = stage.get(k, 0.0) + v
    res = {
        "clients": clients,
        "seconds": seconds,
        "ok": int(len(lat)),
        "img_s": round(len(lat) / seconds, 1),
        "p50_ms": round(float(np.percentile(lat, 50)) * 1e3, 2) if len(lat) else None,
        "p99_ms": round(float(np.percentile(lat, 99)) * 1e3, 2) if len(lat) else None,
        "errors": int(sum(errors.values())),
        "errors_by_status": errors,
        "loadgen_procs": procs,
        "loadgen_cpu_per_proc": cpu,
    }
    if collect_timings and stage.get("_n"):
        n = stage.pop("_n")
        res["mean_timings_ms"] = {k: round(v / n, 3) for k, v in stage.items()}
    return res


def run(
    url: str,
    body: bytes | Sequence[bytes],
    content_type: str,
    clients: int,
    seconds: float,
    procs: int | None = None,
    warmup: float = 2.0,
    extra_headers: dict[str, str] | None = None,
    collect_timings: bool = False,
    expect_sizes: Sequence[tuple[int, int]] | None = None,
) -> dict[str, Any]:
    """``clients`` closed-loop clients for ``seconds`` after ``warmup``; ``body`` is one
    request body or several, cycled. ``expect_sizes``: each body's (width, height), one a
    body: an answer is OK only as a JPEG of its request's size."""
    bodies = (body,) if isinstance(body, bytes) else tuple(body)
    expect = None if expect_sizes is None else tuple(tuple(e) for e in expect_sizes)
    if expect is not None and len(expect) != len(bodies):
        raise ValueError(f"{len(expect)} expected sizes for {len(bodies)} bodies")
    procs = procs or max(1, min(clients // 32 + 1, os.cpu_count() or 1, 8))
    procs = min(procs, clients)
    headers = {"content-type": content_type, **(extra_headers or {})}
    shares = [clients // procs + (1 if i < clients % procs else 0) for i in range(procs)]
    firsts = [sum(shares[:i]) for i in range(procs)]  # client c starts at image c
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ps = [
        ctx.Process(
            target=_proc,
            args=((url, bodies, headers, n, seconds, warmup, collect_timings, first, expect), q),
        )
        for n, first in zip(shares, firsts, strict=True)
    ]
    for p in ps:
        p.start()
    out = []
    for _ in ps:  # a generator process that died must not hang the benchmark
        try:
            out.append(q.get(timeout=seconds + warmup + 180))
        except Exception:
            break
    for p in ps:
        p.join(10)
        if p.is_alive():
            p.kill()
    if len(out) < len(ps):
        raise RuntimeError(f"{len(ps) - len(out)} load generator process(es) gave no result")
    return _summary(out, clients, seconds, procs, collect_timings)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--url", required=True)
    ap.add_argument("--image", required=True, action="append", help="repeat to cycle several")
    ap.add_argument("--content-type", default="image/jpeg")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--warmup", type=float, default=3)
    ap.add_argument("--procs", type=int, default=None)
    ap.add_argument("--accept", default=None, help="the requests' Accept header")
    ap.add_argument(
        "--expect-jpeg",
        action="store_true",
        help="an answer is OK only as a JPEG of its input's size (the images must be JPEGs)",
    )
    args = ap.parse_args()
    bodies = []
    for path in args.image:
        with open(path, "rb") as f:
            bodies.append(f.read())
    expect = [jpeg_size(b) for b in bodies] if args.expect_jpeg else None
    if expect is not None and None in expect:
        ap.error("--expect-jpeg needs JPEG images")
    res = run(
        args.url,
        bodies,
        args.content_type,
        args.clients,
        args.seconds,
        args.procs,
        args.warmup,
        extra_headers={"accept": args.accept} if args.accept else None,
        expect_sizes=expect,
    )
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
