"""The soak's live streams (``soak.py --streams K``; issue 34: memory flat over a long run with
streams opening and closing).

K players each open a stream on ``/v1/streams/{model}``, play it at ``fps`` for a life drawn
between half and one and a half times ``seconds`` (``loadtest.streams`` plays it: frames on
a timetable, receipts, an end message), close it, rest up to half a second (a refused one
1 to 1.5 s: try again later) and open the next, until the soak ends. So streams open and close all the time while the HTTP clients
run. What counts as unexpected: a stream closed with a code other than 1000 (normal) or
1013 (refused at the handshake: try again later), or a frame answered with an error. Frames
dropped by the service's policy are counted, not unexpected. At the end the replica's book
(``GET /v1/streams``) must come back to idle: no stream, no declared rate, nothing queued.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any

from loadtest import streams as ls

OK_CLOSES = (1000, 1013)


@dataclass
class StreamBook:
    """Every stream the players ran: its end time and its outcome."""

    done: list[tuple[float, ls.StreamStats]] = field(default_factory=list)
    unexpected: dict[str, int] = field(default_factory=dict)

    def add(self, st: ls.StreamStats) -> None:
        self.done.append((time.time(), st))
        if st.close_code not in OK_CLOSES and st.refused is None:
            key = f"stream closed {st.close_code}"
            self.unexpected[key] = self.unexpected.get(key, 0) + 1
        elif st.refused is not None and st.close_code != 1013:
            key = f"stream not opened: {st.refused}"
            self.unexpected[key] = self.unexpected.get(key, 0) + 1
        if st.errors:
            self.unexpected["stream frame error"] = (
                self.unexpected.get("stream frame error", 0) + st.errors
            )

    def opened(self) -> int:
        return sum(1 for _, st in self.done if st.refused is None)


async def player(
    url: str,
    frames: list[bytes],
    fps: float,
    seconds: float,
    end: float,
    book: StreamBook,
    seed: int,
    token: str | None = None,
) -> None:
    """Streams one after another until ``end``, each of a random life around ``seconds``."""
    rnd = random.Random(seed)
    headers = {"authorization": f"Bearer {token}"} if token else {}
    await asyncio.sleep(rnd.random())  # the players start spread over a second
    while time.time() < end:
        life = min(seconds * (0.5 + rnd.random()), max(0.2, end - time.time()))
        frames_of = frames[rnd.randrange(len(frames)) :] + frames  # each starts elsewhere
        st = await ls._stream(url, headers, frames_of, fps, life, 0.0)
        book.add(st)
        # refused (1013, try again later): back off as a client should, 1-2 s
        await asyncio.sleep(rnd.random() / 2 + (1.0 if st.refused is not None else 0.0))


def start(args: Any, url: str, end: float, book: StreamBook) -> list[asyncio.Future]:
    """``args.streams`` players (soak.py's ``--stream-*`` options) against ``url``'s
    ``/v1/streams/{args.stream_model}``, until ``end``."""
    if not args.streams:
        return []
    w, h = (int(x) for x in args.stream_size.lower().split("x"))
    frames = ls.frames_corpus(w, h)
    ws = url.replace("http", "ws", 1) + f"/v1/streams/{args.stream_model}?fps={args.stream_fps:g}"
    return [
        asyncio.ensure_future(
            player(ws, frames, args.stream_fps, args.stream_seconds, end, book, 1000 + i)
        )
        for i in range(args.streams)
    ]


async def judge_into(
    out: dict[str, Any], args: Any, book: StreamBook, url: str, t0: float, t1: float
) -> None:
    """The streams' part of the soak's judgement, added to ``out`` (soak_judge.judge's):
    their figures, their unexpected outcomes, and whether the stream book came back idle."""
    left = await left_behind(url, replicas=getattr(args, "ingress_replicas", 1))
    out["streams"] = {
        **summary(book, args.stream_fps, t0, t1, args.streams),
        "model": args.stream_model,
        "size": args.stream_size,
        "life_s": f"{args.stream_seconds * 0.5:g}-{args.stream_seconds * 1.5:g}",
        "left_behind": left,
    }
    out["unexpected"] = {**out["unexpected"], **book.unexpected}
    out["pass"]["no_unexpected"] = not out["unexpected"]
    out["pass"]["streams_book_idle"] = left is None


def summary(book: StreamBook, fps: float, t0: float, t1: float, players: int) -> dict[str, Any]:
    """The streams' figures over the whole soak (``loadtest.streams.summarize``'s fields) and
    per half, with how many opened and closed."""
    half = t0 + (t1 - t0) / 2

    def of(part: list[ls.StreamStats], span: float) -> dict[str, Any]:
        s = ls.summarize(part, len(part), fps, 0.0, max(span, 1e-9), 0.0)
        return {k: s[k] for k in ("opened", "refused", "refusals", "frames_sent", "answered",
                                  "errors", "dropped", "dropped_pct", "latency_ms",
                                  "close_codes")}  # fmt: skip

    return {
        "players": players,
        "fps": fps,
        "streams_run": len(book.done),
        "whole": of([st for _, st in book.done], t1 - t0),
        "first_half": of([st for t, st in book.done if t < half], half - t0),
        "second_half": of([st for t, st in book.done if t >= half], t1 - half),
    }


async def left_behind(
    url: str, limit_s: float = 30.0, token: str | None = None, replicas: int = 1
) -> dict | None:
    """None once ``GET /v1/streams`` -- answered by one replica of the ingress at a time,
    which it names (``replica``) -- has been idle (``loadtest.streams.book_idle``) at the
    latest reading of each of ``replicas`` replicas, within ``limit_s``; else the latest
    reading of each replica seen, by replica (``{"replicas_seen": n, ...}`` where fewer than
    ``replicas`` answered). One idle reading is not enough where 8 replicas answer in turn."""
    import httpx

    headers = {"authorization": f"Bearer {token}"} if token else {}
    t_end = time.time() + limit_s
    last: dict[str, dict] = {}
    async with httpx.AsyncClient(base_url=url, timeout=30) as c:
        while True:
            b = (await c.get("/v1/streams", headers=headers)).json()
            last[str(b.get("replica", "?"))] = b
            if len(last) >= replicas and all(ls.book_idle(x) for x in last.values()):
                return None
            if time.time() > t_end:
                busy = {k: v for k, v in last.items() if not ls.book_idle(v)}
                return busy or {"replicas_seen": len(last), "wanted": replicas}
            await asyncio.sleep(0.05 if len(last) < replicas else 0.2)
