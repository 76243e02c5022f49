"""Live video streams: one ingress replica's book of its open streams, and the rule that
admits one more at its handshake (``docs/api.md``, Live streams). Pure, the clock passed in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .config import StreamsConfig
from .errors import QueueFull


class Recent:
    """Counts over the last ``window_s`` seconds, in whole-second buckets (a ratio that
    forgets: an overload long past refuses nothing)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._buckets: dict[int, list[int]] = {}  # second -> [hits, total]

    def add(self, now: float, hits: int, total: int) -> None:
        b = self._buckets.setdefault(int(now), [0, 0])
        b[0] += hits
        b[1] += total

    def ratio(self, now: float) -> float:
        start = int(now - self.window_s)
        for sec in [s for s in self._buckets if s < start]:
            del self._buckets[sec]
        hits = sum(b[0] for b in self._buckets.values())
        total = sum(b[1] for b in self._buckets.values())
        return hits / total if total else 0.0


@dataclass(frozen=True)
class Ticket:
    """An admitted stream's place in the book."""

    stream_id: str
    model: str
    fps: float


class StreamBook:
    """One ingress replica's open streams and the rule that admits one: at most
    ``max_streams`` open; a model's declared rates together within ``max_fps``; and none
    while the model's open streams drop more than ``max_late`` of their frames late (over
    ``late_window_s``). Refusals are ``QueueFull`` (retry later). (The route also asks the
    queue budget: none while a frame arriving now would wait past it.)"""

    def __init__(self, cfg: StreamsConfig, retry_after_s: float = 1.0) -> None:
        self.cfg = cfg
        self.retry_after_s = retry_after_s
        self.open: dict[str, Ticket] = {}
        self.late: dict[str, Recent] = {}

    def fps_of(self, model: str) -> float:
        return sum(t.fps for t in self.open.values() if t.model == model)

    def frames(self, model: str, now: float, late: int, total: int) -> None:
        """``total`` frames of ``model``'s streams settled now, ``late`` of them dropped late."""
        self.late.setdefault(model, Recent(self.cfg.late_window_s)).add(now, late, total)

    def late_ratio(self, model: str, now: float) -> float:
        recent = self.late.get(model)
        return 0.0 if recent is None else recent.ratio(now)

    def admit(self, stream_id: str, model: str, fps: float, now: float) -> Ticket:
        cfg, taken = self.cfg, self.fps_of(model)
        if len(self.open) >= cfg.max_streams:
            self._refuse(
                "stream_limit",
                "this replica holds its most streams",
                open=len(self.open),
                max_streams=cfg.max_streams,
            )
        if cfg.max_fps is not None and taken + fps > cfg.max_fps + 1e-9:
            self._refuse(
                "stream_rate",
                "the model's streams would pass their frame rate",
                fps=fps,
                admitted_fps=round(taken, 3),
                max_fps=cfg.max_fps,
            )
        late = self.late_ratio(model, now)
        if late > cfg.max_late:
            self._refuse(
                "stream_late",
                "the model's open streams miss their deadlines",
                late_ratio=round(late, 4),
                max_late=cfg.max_late,
            )
        ticket = self.open[stream_id] = Ticket(stream_id, model, fps)
        return ticket

    def release(self, ticket: Ticket) -> None:
        self.open.pop(ticket.stream_id, None)

    def _refuse(self, reason: str, message: str, **fields: Any) -> None:
        raise QueueFull(
            f"stream refused: {message}",
            retry_after_s=self.retry_after_s,
            reason=reason,
            **fields,
        )
