"""Live video streams, the pure core: one stream's frames, in order, with its drop policy and
its reader's window (one ingress replica's book of open streams, admission, is
``stream_book.py``'s).

No asyncio, no Serve, no Starlette: times are passed in, and a frame's way downstream is an
opaque handle (a future: ``cancel()`` gives it up) that the caller's ``withdraw`` takes back
while it has not left the coalescer. The WebSocket route (``deployments/streams_route.py``)
drives it; tests drive it with a fake clock. The protocol (``docs/api.md``, Live streams):

* frames are numbered 0, 1, 2, ... as they arrive, and every frame gets one message, in
  frame order: its answer, its error, or -- merged with its neighbours dropped for the same
  reason -- ``{"dropped": [numbers], "reason": ...}``; an answer that is an image or a
  mask is its JSON header followed at once by the encoded bytes (``FrameAnswer``);
* **bounded lag**: a stream holds at most ``max_held`` frames (what its deadline covers at
  its rate); a frame that arrives when it holds them all makes room by dropping the oldest
  frame that has not started (``lag``; the new frame itself when every held one has
  started); a frame whose deadline passes before it started is dropped (``late``), as is
  one that waited past it downstream (its ``DeadlineExceeded``); a frame that came faster
  than the stream's declared rate is dropped at once (``rate``);
* **slow readers**: the client acknowledges what it read (``{"read": n}``); once
  ``window`` answers are sent and unacknowledged the stream is paused -- its frames are
  dropped (``paused``) -- and after ``pause_s`` paused it is closed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .config import StreamsConfig
from .errors import DeadlineExceeded, FerryError, QueueFull
from .protocol.validate import finite_float

LATE, LAG, RATE, PAUSED = "late", "lag", "rate", "paused"  # why a frame was dropped
GRACE_S = 1.0  # past a started frame's deadline, how long its answer is still awaited


@dataclass(frozen=True)
class StreamParams:
    """One stream's terms, from its query parameters and the config."""

    fps: float  # its declared rate (admission, the rate gate)
    deadline_s: float  # from a frame's arrival to its answer
    max_held: int  # bounded lag: the most frames it holds unanswered
    window: int  # answers it may leave unacknowledged before it is paused
    pause_s: float  # how long it may stay paused before it is closed


def stream_params(query: Mapping[str, str], cfg: StreamsConfig) -> StreamParams:
    """The terms of a stream opened with ``query`` (``fps``, ``deadline_ms``); 400
    ``InvalidInput`` naming the value for one out of range."""
    raw_fps = query.get("fps")
    fps = (
        cfg.default_fps
        if raw_fps is None
        else finite_float(raw_fps, "fps", 0.0, cfg.max_stream_fps)
    )
    raw_ms = query.get("deadline_ms")
    if raw_ms is None:
        deadline_s = min(cfg.deadline_frames / fps, cfg.max_deadline_ms / 1e3)
    else:
        deadline_s = finite_float(raw_ms, "deadline_ms", 0.0, cfg.max_deadline_ms) / 1e3
    return StreamParams(
        fps=fps,
        deadline_s=deadline_s,
        max_held=max(2, math.ceil(deadline_s * fps) + 1),
        window=max(8, math.ceil(cfg.unread_s * fps)),
        pause_s=cfg.pause_s,
    )


# ---------------------------------------------------------------------------- messages
@dataclass(frozen=True)
class FrameAnswer:
    """A frame's answer: the task's result fields as its own route answers them
    (``top_k`` for classify, boxes for detect), ``timings_ms`` among them. An answer that
    is an encoded image or mask (``media``) is two messages on the wire, one right after
    the other: this JSON header -- its fields (``media_type`` among them) and ``bytes``,
    the media's length -- then the media as one binary message."""

    frame: int
    fields: Mapping[str, Any]
    media: bytes | None = None

    def body(self) -> dict[str, Any]:
        if self.media is None:
            return {"frame": self.frame, **self.fields}
        return {"frame": self.frame, **self.fields, "bytes": len(self.media)}


@dataclass(frozen=True)
class FrameError:
    """A frame that failed (a bad image): Ferry's error body, for this frame; the stream
    goes on."""

    frame: int
    error: FerryError

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "frame": self.frame,
            "error": self.error.message or type(self.error).__name__,
            "type": type(self.error).__name__,
        }
        if self.error.fields:
            out["detail"] = self.error.public_detail()
        return out


@dataclass
class FramesDropped:
    """Consecutive frames dropped for one reason (``LATE``, ``LAG``, ``RATE``, ``PAUSED``)."""

    frames: list[int]
    reason: str

    def body(self) -> dict[str, Any]:
        return {"dropped": list(self.frames), "reason": self.reason}


StreamMessage = FrameAnswer | FrameError | FramesDropped


class Outbox:
    """Frames' outcomes, resolved in any order, taken in frame order: ``take`` returns the
    messages due now -- up to the first frame still unresolved -- merging consecutive
    frames dropped for the same reason into one message."""

    def __init__(self) -> None:
        self.next = 0  # the first frame not yet taken
        self._done: dict[int, StreamMessage] = {}

    def __len__(self) -> int:
        return len(self._done)

    def put(self, message: StreamMessage) -> None:
        n = message.frames[0] if isinstance(message, FramesDropped) else message.frame
        self._done.setdefault(n, message)

    def take(self) -> list[StreamMessage]:
        out: list[StreamMessage] = []
        while self.next in self._done:
            m = self._done.pop(self.next)
            last = out[-1] if out else None
            if (
                isinstance(m, FramesDropped)
                and isinstance(last, FramesDropped)
                and last.reason == m.reason
            ):
                last.frames.append(self.next)
            else:
                out.append(m)
            self.next += 1
        return out


class RateGate:
    """A token bucket at ``fps``, holding at most one second of frames (a burst a second
    long passes; a stream faster than it said does not)."""

    def __init__(self, fps: float, now: float) -> None:
        self.fps = fps
        self.capacity = max(1.0, fps)
        self.tokens = self.capacity
        self.at = now

    def allow(self, now: float) -> bool:
        self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.fps)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


# ---------------------------------------------------------------------------- one stream
@dataclass
class Held:
    """A frame the stream holds: its number, its way downstream, its deadline."""

    n: int
    handle: Any  # cancel() gives it up
    deadline: float


@dataclass
class Counts:
    answered: int = 0
    errors: int = 0
    dropped: dict[str, int] = field(default_factory=dict)


class Stream:
    """One stream's state, driven by its route: frames arrive (``arrive``, ``make_room``,
    ``hold``), their outcomes come back in any order (``answered``, ``failed``,
    ``expire``), messages leave in frame order (``take``), the reader acknowledges
    (``receipt``). ``withdraw(handle)`` takes back a frame that has not left (True), or
    says it has (False)."""

    def __init__(self, params: StreamParams, now: float, withdraw: Callable[[Any], bool]) -> None:
        self.p = params
        self.withdraw = withdraw
        self.gate = RateGate(params.fps, now)
        self.outbox = Outbox()
        self.held: dict[int, Held] = {}  # in frame order
        self.next_n = 0
        self.read_upto = -1  # the client acknowledged every answer up to this frame
        self.paused_since: float | None = None
        self.counts = Counts()

    def arrive(self, now: float) -> tuple[int, str | None]:
        """Number the next frame; why it is dropped at once (``PAUSED``, ``RATE``) or None
        when it may go on."""
        n = self.next_n
        self.next_n += 1
        reason = PAUSED if self.paused_since is not None else None
        if reason is None and not self.gate.allow(now):
            reason = RATE
        if reason is not None:
            self._drop(n, reason)
        return n, reason

    def make_room(self, n: int) -> bool:
        """Bounded lag: with ``max_held`` frames held, drop the oldest that has not started
        to make room for frame ``n``; False (``n`` dropped) when every held frame has."""
        if len(self.held) < self.p.max_held:
            return True
        for h in list(self.held.values()):
            if self.withdraw(h.handle):
                del self.held[h.n]
                self._drop(h.n, LAG)
                return True
        self._drop(n, LAG)
        return False

    def hold(self, n: int, handle: Any, deadline: float) -> None:
        self.held[n] = Held(n, handle, deadline)

    def bad(self, n: int, error: FerryError) -> None:
        """Frame ``n`` was refused before it went anywhere (a bad image)."""
        self.counts.errors += 1
        self.outbox.put(FrameError(n, error))

    def answered(self, n: int, fields: Mapping[str, Any], media: bytes | None = None) -> None:
        if self.held.pop(n, None) is not None:
            self.counts.answered += 1
            self.outbox.put(FrameAnswer(n, fields, media))

    def failed(self, n: int, error: FerryError) -> None:
        """Frame ``n``'s error from downstream: a deadline that passed on the way (or the
        budget's drop) is a late frame, dropped; any other is the frame's error."""
        if self.held.pop(n, None) is None:
            return
        late = isinstance(error, DeadlineExceeded) or (
            isinstance(error, QueueFull) and error.reason == "queue_timeout"
        )
        if late:
            self._drop(n, LATE)
        else:
            self.counts.errors += 1
            self.outbox.put(FrameError(n, error))

    def expire(self, n: int, now: float) -> float | None:
        """Frame ``n``'s deadline passed: dropped (``LATE``) if it has not left; given up
        once ``GRACE_S`` past it. When to look again, or None."""
        h = self.held.get(n)
        if h is None:
            return None
        if self.withdraw(h.handle) or now >= h.deadline + GRACE_S:
            h.handle.cancel()
            del self.held[n]
            self._drop(n, LATE)
            return None
        return h.deadline + GRACE_S

    def take(self, now: float) -> list[StreamMessage]:
        """The messages due now, in frame order; a reader this far behind is paused."""
        out = self.outbox.take()
        if self.unread >= self.p.window and self.paused_since is None:
            self.paused_since = now
        return out

    def receipt(self, n: int) -> None:
        """The client read every answer up to frame ``n``: resumes a paused stream whose
        unread answers fell below the window."""
        self.read_upto = max(self.read_upto, min(n, self.outbox.next - 1))
        if self.unread < self.p.window:
            self.paused_since = None

    @property
    def unread(self) -> int:
        return self.outbox.next - 1 - self.read_upto

    def overdue(self, now: float) -> bool:
        """Paused for ``pause_s``: to be closed."""
        return self.paused_since is not None and now - self.paused_since >= self.p.pause_s - 1e-9

    def abandon(self) -> int:
        """Give up every held frame (the stream ends): how many there were."""
        n = len(self.held)
        for h in self.held.values():
            h.handle.cancel()
        self.held.clear()
        return n

    @property
    def settled(self) -> bool:
        """Every frame that arrived has had its message taken."""
        return not self.held and not self.outbox and self.outbox.next == self.next_n

    def _drop(self, n: int, reason: str) -> None:
        self.counts.dropped[reason] = self.counts.dropped.get(reason, 0) + 1
        self.outbox.put(FramesDropped([n], reason))
