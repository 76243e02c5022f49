"""The live streams' pure core on a fake clock: frame order, the drop policy (bounded lag,
late, rate), slow readers, and the replica's book of streams (admission)."""

from __future__ import annotations

import math

import pytest

from pipeline.config import StreamsConfig
from pipeline.errors import DeadlineExceeded, InvalidInput, QueueFull, UnsupportedMediaType
from pipeline.stream_book import StreamBook
from pipeline.streams import (
    GRACE_S,
    LAG,
    LATE,
    PAUSED,
    RATE,
    FrameAnswer,
    FrameError,
    FramesDropped,
    Outbox,
    RateGate,
    Stream,
    StreamParams,
    stream_params,
)


class Handle:
    """A frame's way downstream as the core sees it: started once it left the coalescer."""

    def __init__(self) -> None:
        self.started = False
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


def withdraw(h: Handle) -> bool:
    if h.started or h.cancelled:
        return False
    h.cancel()
    return True


def bodies(msgs) -> list[dict]:
    return [m.body() for m in msgs]


def _stream(clock, **kw) -> Stream:
    p = {"fps": 10.0, "deadline_s": 0.2, "max_held": 3, "window": 8, "pause_s": 1.0} | kw
    return Stream(StreamParams(**p), clock(), withdraw)


def _frame(s: Stream, clock, started: bool = False) -> tuple[int, Handle]:
    n, reason = s.arrive(clock())
    assert reason is None
    h = Handle()
    h.started = started
    assert s.make_room(n)
    s.hold(n, h, clock() + s.p.deadline_s)
    return n, h


def test_stream_params_default_from_the_rate_and_refuse_what_is_out_of_range():
    cfg = StreamsConfig()
    p = stream_params({}, cfg)
    assert p.fps == 30.0 and p.deadline_s == pytest.approx(2 / 30)
    assert p.max_held == math.ceil(2 / 30 * 30) + 1 == 3 and p.window == 60
    p = stream_params({"fps": "10", "deadline_ms": "500"}, cfg)
    assert (p.fps, p.deadline_s, p.max_held, p.window) == (10.0, 0.5, 6, 20)
    for bad in ({"fps": "0"}, {"fps": "nan"}, {"fps": "121"}, {"deadline_ms": "20000"}):
        with pytest.raises(InvalidInput):
            stream_params(bad, cfg)


def test_outbox_answers_in_frame_order_merging_neighbours_dropped_for_one_reason():
    box = Outbox()
    box.put(FrameAnswer(2, {"top_k": []}))
    box.put(FramesDropped([1], LATE))
    assert box.take() == []  # frame 0 is not resolved yet
    box.put(FramesDropped([0], LATE))
    box.put(FramesDropped([3], LAG))
    assert bodies(box.take()) == [
        {"dropped": [0, 1], "reason": LATE},
        {"frame": 2, "top_k": []},
        {"dropped": [3], "reason": LAG},
    ]
    assert box.next == 4 and len(box) == 0


def test_rate_gate_passes_a_second_of_burst_then_the_rate(clock):
    g = RateGate(4.0, clock())
    assert [g.allow(clock()) for _ in range(5)] == [True] * 4 + [False]
    clock.advance(0.25)
    assert g.allow(clock()) and not g.allow(clock())


def test_answers_leave_in_frame_order_and_a_bad_frame_gets_its_error(clock):
    s = _stream(clock)
    n0, _ = _frame(s, clock)
    n1, _ = s.arrive(clock())
    s.bad(n1, UnsupportedMediaType("not an image"))
    n2, _ = _frame(s, clock)
    s.answered(n2, {"top_k": [2]})
    assert s.take(clock()) == []
    s.answered(n0, {"top_k": [0]})
    out = bodies(s.take(clock()))
    assert out[0] == {"frame": 0, "top_k": [0]} and out[2] == {"frame": 2, "top_k": [2]}
    assert out[1]["frame"] == 1 and out[1]["type"] == "UnsupportedMediaType"
    assert s.settled and s.counts.answered == 2 and s.counts.errors == 1


def test_a_deadline_passed_downstream_is_a_late_drop_other_errors_the_frames_own(clock):
    s = _stream(clock)
    n0, _ = _frame(s, clock, started=True)
    n1, _ = _frame(s, clock, started=True)
    s.failed(n0, DeadlineExceeded("deadline passed before the request reached the GPU"))
    s.failed(n1, QueueFull("no", reason="queue_full"))
    out = s.take(clock())
    assert isinstance(out[0], FramesDropped) and out[0].reason == LATE
    assert isinstance(out[1], FrameError) and out[1].frame == 1


def test_bounded_lag_drops_the_oldest_unstarted_frame_or_the_new_one(clock):
    s = _stream(clock, max_held=2)
    n0, h0 = _frame(s, clock, started=True)
    n1, h1 = _frame(s, clock)  # waiting in the coalescer
    n2, reason = s.arrive(clock())
    assert reason is None and s.make_room(n2)  # frame 1 makes room
    assert h1.cancelled and not h0.cancelled and list(s.held) == [n0]
    s.hold(n2, Handle(), clock() + 1)
    s.held[n2].handle.started = True
    n3, _ = s.arrive(clock())
    assert not s.make_room(n3)  # both held frames started: the new one goes
    s.answered(n0, {"x": 0})
    s.answered(n2, {"x": 2})
    assert bodies(s.take(clock())) == [
        {"frame": 0, "x": 0},
        {"dropped": [1], "reason": LAG},
        {"frame": 2, "x": 2},
        {"dropped": [3], "reason": LAG},
    ]


def test_a_frame_past_its_deadline_is_dropped_if_it_has_not_left_else_after_the_grace(clock):
    s = _stream(clock, deadline_s=0.1)
    n0, h0 = _frame(s, clock)
    n1, h1 = _frame(s, clock, started=True)
    clock.advance(0.1)
    assert s.expire(n0, clock()) is None and h0.cancelled
    again = s.expire(n1, clock())
    assert again == pytest.approx(clock() + GRACE_S) and not h1.cancelled
    clock.advance(GRACE_S)
    assert s.expire(n1, clock()) is None and h1.cancelled
    assert bodies(s.take(clock())) == [{"dropped": [0, 1], "reason": LATE}]
    s.answered(n1, {"late": True})  # an answer after it was given up is ignored
    assert s.take(clock()) == [] and s.settled


def test_over_rate_frames_are_dropped_at_once(clock):
    s = _stream(clock, fps=2.0, max_held=10)
    reasons = [s.arrive(clock())[1] for _ in range(3)]
    assert reasons == [None, None, RATE]


def test_a_slow_reader_is_paused_then_overdue_and_resumes_on_a_receipt(clock):
    s = _stream(clock, window=8, max_held=100, fps=100.0)
    for _ in range(8):
        n, _ = _frame(s, clock)
        s.answered(n, {})
    assert len(s.take(clock())) == 8 and s.unread == 8 and s.paused_since == clock()
    n, reason = s.arrive(clock())
    assert reason == PAUSED
    clock.advance(0.5)
    assert not s.overdue(clock())
    s.receipt(3)  # 4 unread: under the window again
    assert s.paused_since is None and s.unread == 4
    n, _ = _frame(s, clock)  # taken again
    s.answered(n, {})
    s.receipt(100)  # never past what was sent
    assert s.read_upto == 7
    clock.advance(0.5)
    assert not s.overdue(clock())
    for _ in range(8):
        n, _ = _frame(s, clock)
        s.answered(n, {})
    s.take(clock())
    clock.advance(1.0)
    assert s.overdue(clock())


def test_abandon_gives_up_every_held_frame(clock):
    s = _stream(clock)
    handles = [_frame(s, clock, started=i == 0)[1] for i in range(3)]
    assert s.abandon() == 3 and all(h.cancelled for h in handles) and not s.held


def test_the_book_admits_within_the_stream_limit_the_rate_and_while_streams_meet_deadlines(
    clock,
):
    cfg = StreamsConfig(max_streams=3, max_fps=50.0, max_late=0.1, late_window_s=5.0)
    book = StreamBook(cfg, retry_after_s=2)
    a = book.admit("a", "digits", 30.0, clock())
    with pytest.raises(QueueFull) as e:
        book.admit("b", "digits", 30.0, clock())
    assert e.value.reason == "stream_rate" and e.value.retry_after_s == 2
    book.admit("b", "resnet50", 30.0, clock())  # another model's rate is its own
    book.frames("digits", clock(), late=2, total=10)  # 20% of digits' frames were late
    with pytest.raises(QueueFull) as e:
        book.admit("c", "digits", 10.0, clock())
    assert e.value.reason == "stream_late" and e.value.fields["late_ratio"] == 0.2
    clock.advance(6.0)  # forgotten past the window
    assert book.late_ratio("digits", clock()) == 0.0
    book.admit("c", "digits", 10.0, clock())
    with pytest.raises(QueueFull) as e:
        book.admit("d", "digits", 1.0, clock())
    assert e.value.reason == "stream_limit"
    book.release(a)
    assert book.fps_of("digits") == 10.0
    book.admit("d", "digits", 1.0, clock())
