"""Live video streams over WebSocket: ``/v1/streams/{model}`` on the ingress's ASGI app, and
``GET /v1/streams``, the replica's book of them (``docs/api.md``, Live streams).

``StreamRoute`` is pure ASGI inside the bearer-token check (``ingress_http.BearerAuth``): it
finds the ingress replica in the scope, as ``ingress_http.FerryApp``'s classify path does, and serves the
connection itself (``StreamConnection``). The stream's rules are ``pipeline/streams.py``'s;
what its frames ask is ``stream_tasks.py``'s; the frames ride the ingress's own coalescer
and GPU batches with the per-request traffic. This module only drives them: the handshake
and its admission, a reader (frames, receipts, the end) and a writer (answers in frame
order, the pause, the close), and a timer per frame for its deadline.

Under Serve a replica's sends never wait for the client (its messages queue in Serve's
proxy), so a slow reader is told by its receipts (``{"read": n}``), not by the socket.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
import time
from functools import partial
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.datastructures import QueryParams

from pipeline import metrics
from pipeline.errors import FerryError, InvalidInput, PayloadTooLarge, RetryLater, Unavailable
from pipeline.stages.messages import Encoded, RequestMeta
from pipeline.stream_book import StreamBook, Ticket
from pipeline.streams import LATE, FrameAnswer, FramesDropped, Stream, StreamMessage, stream_params

from . import stream_tasks
from .http_errors import unwrap
from .observe import ingress_of, request_id_from

logger = logging.getLogger(__name__)
STREAM_PATH = re.compile(r"^/v1/streams/([^/]+)$")
LOOK_S = 0.5  # how often an idle stream looks whether the application is being stopped
TRY_AGAIN_LATER, POLICY, GOING_AWAY, NORMAL = 1013, 1008, 1001, 1000


REPLICA = f"{socket.gethostname()}/{os.getpid()}"
"""Which replica a book is (``GET /v1/streams`` answers from one replica of the ingress)."""


class StreamHub:
    """One ingress replica's streams: the admission book and the open connections."""

    def __init__(self, ingress: Any) -> None:
        self.ingress = ingress
        self.book = StreamBook(ingress.cfg.streams, ingress.cfg.batching.retry_after_s)
        self.open: dict[str, StreamConnection] = {}

    async def books(self) -> dict[str, Any]:
        """The replica's books: its streams, what each model's streams declared, its
        coalescers, and the inference stage's queue and pool (what a closed stream must
        have given back)."""
        ing = self.ingress
        try:
            down = await ing.down.status()
            downstream = {"queue_depth": down.get("queue_depth"), "pool": down.get("pool")}
        except Exception as exc:  # (a stage being replaced: the books say so)
            downstream = {"error": type(unwrap(exc)).__name__}
        return {
            "replica": REPLICA,
            "streams": [c.describe() for c in self.open.values()],
            "admitted_fps": {m: self.book.fps_of(m) for m in ing.models},
            "coalescers": {
                f"{m}/{kind}": {"waiting": c.waiting, "in_flight": c.in_flight}
                for (m, kind), c in ing._coalescers.items()
            },
            "downstream": downstream,
        }


def hub_of(scope: dict) -> StreamHub | None:
    """This replica's hub, made at its first use (in the app's state, with the ingress)."""
    app = scope.get("app")
    ingress = ingress_of(scope)
    if ingress is None:
        return None
    hub = getattr(app.state, "streams", None)
    if hub is None:
        hub = app.state.streams = StreamHub(ingress)
    return hub


class StreamConnection:
    """One stream, from its handshake to its close."""

    def __init__(self, hub: StreamHub, model: str, scope: dict, receive: Any, send: Any) -> None:
        self.hub, self.ingress = hub, hub.ingress
        self.model = model
        self.scope, self.receive, self._send = scope, receive, send
        self.id = request_id_from(scope.get("headers") or [])
        self.query = _query(scope)
        self.loop = asyncio.get_running_loop()
        self.wake = asyncio.Event()
        self.ending: str | None = None  # why no more frames are taken: "end", "draining"
        self.notes: list[dict[str, Any]] = []  # messages that are no frame's, to send
        self.stream: Stream | None = None
        self.ticket: Ticket | None = None
        self.closed = False

    # ------------------------------------------------------------------ the handshake
    async def run(self) -> None:
        if (await self.receive())["type"] != "websocket.connect":
            return
        self.ingress.drain.start()
        try:
            with self.ingress.drain.work(self.id):  # a stop waits for the stream to settle
                await self._open()
                await self._send({"type": "websocket.accept"})
                logger.info("stream %s opened: %s %s", self.id, self.model, self.query)
                await self._serve()
        except FerryError as exc:
            if self.stream is None:  # refused at the handshake
                await self._refuse(exc)
            else:
                raise
        finally:
            self._free()

    async def _open(self) -> None:
        """Check the stream's terms and admit it, or raise why not."""
        ing = self.ingress
        ing._model(self.model)  # 404's ModelNotFound: no such model
        ing.readiness.check(self.model)  # refused at load: its reason
        self.plan = await stream_tasks.plan_of(ing, self.model, self.query)
        self.params = stream_params(self.query, ing.cfg.streams)
        self.coalescer = ing._coalescer(self.model, stream_tasks.COALESCER)
        self.coalescer.check(self.id)  # the queue budget: none while it is overloaded now
        now = self.loop.time()
        self.ticket = self.hub.book.admit(self.id, self.model, self.params.fps, now)
        self.stream = Stream(self.params, self.loop.time(), self.coalescer.withdraw)
        self.hub.open[self.id] = self

    async def _refuse(self, exc: FerryError) -> None:
        """Accept, say why in Ferry's error JSON, close: 1013 (try again later) for a
        refusal that a retry may pass, 1008 for one that it will not."""
        retry = isinstance(exc, RetryLater) and getattr(exc, "retryable", True)
        code = TRY_AGAIN_LATER if retry else POLICY
        if retry:
            metrics.count_rejected(getattr(exc, "reason", None) or "stream")
        logger.info("stream %s refused (%s): %s", self.id, code, exc)
        body = {"error": exc.message or type(exc).__name__, "type": type(exc).__name__}
        if exc.fields:
            body["detail"] = exc.public_detail()
        await self._send({"type": "websocket.accept"})
        await self._send({"type": "websocket.send", "text": orjson.dumps(body).decode()})
        reason = getattr(exc, "reason", None) or exc.message
        await self._close(code, f"{type(exc).__name__}: {reason}")

    # ------------------------------------------------------------------ the stream
    async def _serve(self) -> None:
        reader = asyncio.ensure_future(self._read())
        writer = asyncio.ensure_future(self._write())
        look = self.loop.call_later(LOOK_S, self._look)
        try:
            await asyncio.wait({reader, writer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            look.cancel()
            for t in (reader, writer):
                t.cancel()
            await asyncio.gather(reader, writer, return_exceptions=True)

    async def _read(self) -> None:
        """Frames, receipts and the end, until the client goes."""
        while True:
            msg = await self.receive()
            if msg["type"] == "websocket.disconnect":
                logger.info("stream %s: the client went (%s)", self.id, msg.get("code"))
                return
            if msg.get("bytes") is not None:
                self._frame(msg["bytes"])
            elif msg.get("text") is not None:
                self._text(msg["text"])

    def _frame(self, data: bytes) -> None:
        if self.ingress.drain.draining:
            self.ending = self.ending or "draining"
        if self.ending:  # no more frames are taken (not numbered)
            self.wake.set()
            return
        assert self.stream is not None
        now, t0, wall = self.loop.time(), time.perf_counter(), time.time()
        n, dropped = self.stream.arrive(now)
        self.wake.set()
        if dropped:
            return
        ic = self.ingress.cfg.ingress
        try:
            if len(data) > ic.max_body_bytes:
                raise PayloadTooLarge("frame too large", bytes=len(data), max=ic.max_body_bytes)
            image = Encoded.checked(
                data, None, self.ingress.targets[self.model], ic.max_pixels, ic.max_image_work_bytes
            )
            spec = self.plan.spec_for(image)  # from this frame's size: its answer's 413
        except FerryError as exc:  # this frame's error; the stream goes on
            self.stream.bad(n, exc)
            return
        if not self.stream.make_room(n):
            return
        deadline_s = self.params.deadline_s
        meta = RequestMeta(f"{self.id}/{n}", wall + deadline_s, False, wall, frame=True)
        fut = stream_tasks.ask(self.ingress, self.model, image, meta, spec)
        self.stream.hold(n, fut, now + deadline_s)
        fut.add_done_callback(partial(self._done, n, t0, time.perf_counter()))
        self.loop.call_at(now + deadline_s, self._expire, n)

    def _text(self, text: str) -> None:
        """``{"read": n}`` (a receipt) or ``{"end": true}``; anything else is answered
        with an error message (not a frame's) and the stream goes on."""
        assert self.stream is not None
        try:
            msg = orjson.loads(text)
            if not isinstance(msg, dict):
                raise ValueError
            if msg.get("end") is True:
                self.ending = self.ending or "end"
            elif "read" in msg and type(msg["read"]) is int:
                self.stream.receipt(msg["read"])
            else:
                raise ValueError
        except ValueError:
            err = InvalidInput('not a stream message: {"read": n} or {"end": true}', text=text[:64])
            self.notes.append(
                {"error": err.message, "type": "InvalidInput", "detail": err.public_detail()}
            )
        self.wake.set()

    def _done(self, n: int, t0: float, queued: float, fut: asyncio.Future) -> None:
        """Frame ``n``'s answer (or error) came back."""
        assert self.stream is not None
        if fut.cancelled():  # given up by the stream itself
            return
        exc = fut.exception()
        if exc is not None:
            err = unwrap(exc)
            if isinstance(err, asyncio.CancelledError):  # its call was (the replica stops)
                err = Unavailable("the frame's call was cancelled", retry_after_s=1.0)
            elif not isinstance(err, FerryError):
                logger.error("stream %s frame %d failed: %s", self.id, n, err, exc_info=err)
                err = FerryError("internal error")
            self.stream.failed(n, err)
        else:
            answer = fut.result()
            timings = answer.timings.report(
                t0 * 1e3, queued * 1e3, time.perf_counter() * 1e3, time.time() * 1e3
            )
            self.stream.answered(n, *stream_tasks.fields(answer, timings))
        self.wake.set()

    def _expire(self, n: int) -> None:
        if self.stream is None or self.closed:
            return
        again = self.stream.expire(n, self.loop.time())
        if again is not None:
            self.loop.call_at(again, self._expire, n)
        self.wake.set()

    def _look(self) -> None:
        """Every ``LOOK_S``: an idle stream still sees a stop begin."""
        if self.ingress.drain.draining and not self.ending:
            self.ending = "draining"
        self.wake.set()
        if not self.closed:
            self.loop.call_later(LOOK_S, self._look)

    async def _write(self) -> None:
        """Messages in frame order; the pause and the close."""
        assert self.stream is not None
        s, pause_timer = self.stream, None
        while True:
            await self.wake.wait()
            self.wake.clear()
            now = self.loop.time()
            while self.notes:  # messages that are no frame's
                await self._send({"type": "websocket.send", "text": _json(self.notes.pop(0))})
            sent = s.take(now)
            for m in sent:  # an image's or a mask's bytes right after its header
                await self._send({"type": "websocket.send", "text": _json(m.body())})
                if isinstance(m, FrameAnswer) and m.media is not None:
                    await self._send({"type": "websocket.send", "bytes": m.media})
            if sent:
                self._count(sent, now)
            if s.paused_since is not None and pause_timer is None:
                pause_timer = self.loop.call_at(s.paused_since + s.p.pause_s, self.wake.set)
            elif s.paused_since is None and pause_timer is not None:
                pause_timer.cancel()
                pause_timer = None
            if s.overdue(now):
                await self._close(
                    POLICY, f"slow reader: {s.unread} answers unread for {s.p.pause_s:g} s"
                )
                return
            if self.ending and s.settled:
                code, why = (
                    (NORMAL, "end of stream")
                    if self.ending == "end"
                    else (GOING_AWAY, "the service is stopping")
                )
                await self._close(code, why)
                return

    def _count(self, sent: list[StreamMessage], now: float) -> None:
        """The frames settled, late ones apart, into the book (admission's late ratio)."""
        for m in sent:
            if isinstance(m, FramesDropped):  # ray_ferry_rejected_total{reason="frame_late"}...
                for _ in m.frames:
                    metrics.count_rejected(f"frame_{m.reason}")
        late = sum(len(m.frames) for m in sent if isinstance(m, FramesDropped) and m.reason == LATE)
        total = sum(len(m.frames) if isinstance(m, FramesDropped) else 1 for m in sent)
        self.hub.book.frames(self.model, now, late, total)

    # ------------------------------------------------------------------ the end
    async def _close(self, code: int, reason: str) -> None:
        if not self.closed:
            self.closed = True
            logger.info("stream %s closed %d: %s", self.id, code, reason)
            reason = reason.encode()[:123].decode("utf-8", "ignore")  # (a close frame's most)
            await self._send({"type": "websocket.close", "code": code, "reason": reason})

    def _free(self) -> None:
        """Everything the stream holds comes back: its frames (withdrawn from the coalescer
        or given up downstream), its place in the book."""
        self.closed = True
        if self.stream is not None:
            self.stream.abandon()
        if self.ticket is not None:
            self.hub.book.release(self.ticket)
        self.hub.open.pop(self.id, None)

    def describe(self) -> dict[str, Any]:
        s = self.stream
        assert s is not None
        return {
            "id": self.id,
            "model": self.model,
            "task": self.plan.task.name,
            "format": self.plan.format,
            "fps": self.params.fps,
            "deadline_ms": round(self.params.deadline_s * 1e3, 3),
            "frames": s.next_n,
            "held": len(s.held),
            "answered": s.counts.answered,
            "errors": s.counts.errors,
            "dropped": dict(s.counts.dropped),
            "unread": s.unread,
            "paused": s.paused_since is not None,
            "ending": self.ending,
        }


def _json(body: dict[str, Any]) -> str:
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY).decode()


def _query(scope: dict) -> dict[str, str]:
    """The query parameters (the first of each name)."""
    out: dict[str, str] = {}
    for k, v in QueryParams(scope.get("query_string", b"")).multi_items():
        out.setdefault(k, v)
    return out


class StreamRoute:
    """Pure ASGI, inside the auth check: a WebSocket to ``/v1/streams/{model}`` is served
    here; everything else goes on."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        match = STREAM_PATH.match(scope["path"]) if scope["type"] == "websocket" else None
        hub = hub_of(scope) if match else None
        if hub is not None:
            assert match is not None
            await StreamConnection(hub, match.group(1), scope, receive, send).run()
            return
        await self.app(scope, receive, send)


def install(app: FastAPI) -> None:
    """The stream route's layer and ``GET /v1/streams`` on ``app`` (before the auth check
    is added outside it)."""
    app.add_middleware(StreamRoute)

    @app.get("/v1/streams", tags=["streams"])
    async def streams(request: Request) -> JSONResponse:
        """This ingress replica's live streams and the books they draw on."""
        hub = hub_of(request.scope)
        return JSONResponse(await hub.books() if hub is not None else {"streams": []})
