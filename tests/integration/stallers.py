"""A load generator of stalled uploads, run as its own process by test_slow_clients.py (so
the probe that measures the service does not share an event loop with 1,000 sockets):
opens ``STALLED`` connections to 127.0.0.1:``PORT``, 20 every half-second, each declaring a
1,000-byte body and sending 10 bytes, then waits for every answer and prints one JSON line:
``{"opened_s": s, "outcomes": [[status, seconds to the answer, closed], ...]}``.

It runs at the niceness Ray gives its workers (``RAY_worker_niceness``, 15 unless set):
at the default 0 the kernel would weigh this process 28x each Serve replica on a machine
where they share the cores, and the test would measure a service starved by its own load
generator (on a real node the clients are elsewhere)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

WAVE, WAVE_EVERY_S = 20, 0.5  # 40 new connections a second
HEAD = (
    b"POST /v1/models/digits/classify HTTP/1.1\r\nHost: t\r\nContent-Type: image/png\r\n"
    b"Content-Length: 1000\r\n\r\n\x89PNG\r\n\x1a\n\x00\x00"
)


async def _stall(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(HEAD)
    await w.drain()
    return r, w


async def _outcome(
    r: asyncio.StreamReader, w: asyncio.StreamWriter, wait_s: float
) -> tuple[int, float, bool]:
    """(status, seconds until the answer, whether the server closed the connection; a 503
    without Retry-After counts as status 0)."""
    t0 = time.perf_counter()
    try:
        line = await asyncio.wait_for(r.readline(), wait_s)
        took = time.perf_counter() - t0
        status = int(line.split()[1]) if line else 0
        rest = await asyncio.wait_for(r.read(), 10)  # until EOF: the server closes
        if status == 503 and b"retry-after" not in rest.lower():
            status = 0
    except (asyncio.TimeoutError, ConnectionError):
        return -1, time.perf_counter() - t0, False
    finally:
        w.close()
    return status, took, True


async def main(port: int, stalled: int, wait_s: float) -> None:
    t0 = time.perf_counter()
    conns = []
    for _wave in range(0, stalled, WAVE):  # 1,000 in about 10 s
        conns += await asyncio.gather(*(_stall(port) for _ in range(WAVE)))
        await asyncio.sleep(WAVE_EVERY_S)
    opened_s = time.perf_counter() - t0
    outcomes = await asyncio.gather(*(_outcome(r, w, wait_s) for r, w in conns))
    print(json.dumps({"opened_s": opened_s, "outcomes": outcomes}))


if __name__ == "__main__":
    ray_nice = int(os.environ.get("RAY_worker_niceness", "15"))  # noqa: SIM112 (Ray's name)
    os.nice(max(0, ray_nice - os.nice(0)))
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])))
