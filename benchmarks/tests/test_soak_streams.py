"""soak_streams: what the soak counts of its live streams (made-up outcomes, no service):
which closes are unexpected, the halves' figures, and when the replica's book is idle."""

from __future__ import annotations

from benchmarks import soak_streams as S
from loadtest.streams import StreamStats, book_idle
from tests.json_server import json_server


def _played(answered: int, code: int = 1000, errors: int = 0, late: int = 0) -> StreamStats:
    st = StreamStats(opened=True, close_code=code, sent=answered + late + errors)
    st.answered, st.errors, st.sending_s = answered, errors, 1.0
    st.latency_ms = [10.0] * answered
    if late:
        st.dropped = {"late": late}
    return st


def test_normal_closes_refusals_and_drops_are_expected_the_rest_is_not():
    book = S.StreamBook()
    book.add(_played(10))
    book.add(_played(8, late=2))  # the service's drop policy: counted, not unexpected
    book.add(StreamStats(refused="QueueFull: stream_late", close_code=1013))  # try later
    assert book.unexpected == {} and book.opened() == 2
    book.add(_played(3, code=1011))  # an internal error closed it
    book.add(_played(5, errors=2))  # two frames answered with an error
    book.add(StreamStats(refused="connect: ConnectionRefusedError"))  # no handshake at all
    assert book.unexpected == {
        "stream closed 1011": 1,
        "stream frame error": 2,
        "stream not opened: connect: ConnectionRefusedError": 1,
    }


def test_summary_splits_the_streams_by_when_they_ended():
    book = S.StreamBook()
    for t, st in ((100.0, _played(10)), (130.0, _played(4, late=6)),
                  (160.0, StreamStats(refused="QueueFull: queue_budget", close_code=1013))):  # fmt: skip
        book.done.append((t, st))
    s = S.summary(book, 10.0, 90.0, 190.0, players=2)
    assert s["streams_run"] == 3 and s["players"] == 2
    assert s["whole"]["opened"] == 2 and s["whole"]["refused"] == 1
    assert s["whole"]["answered"] == 14 and s["whole"]["dropped"] == {"late": 6}
    assert s["first_half"]["answered"] == 14 and s["second_half"]["opened"] == 0
    assert s["second_half"]["refusals"] == {"QueueFull: queue_budget": 1}


def test_the_book_is_idle_only_when_nothing_is_held():
    quiet = {
        "streams": [],
        "admitted_fps": {"digits": 0},
        "coalescers": {"digits": {"waiting": 0, "in_flight": 0}},
        "downstream": {"queue_depth": 0},
    }
    assert book_idle(quiet)
    assert not book_idle({**quiet, "streams": [{"id": 1}]})
    assert not book_idle({**quiet, "admitted_fps": {"digits": 10.0}})
    assert not book_idle({**quiet, "coalescers": {"digits": {"waiting": 1, "in_flight": 0}}})
    assert not book_idle({**quiet, "downstream": {"queue_depth": 3}})


def test_the_results_line_says_what_the_streams_did():
    from benchmarks.soak_judge import section

    book = S.StreamBook()
    book.done += [(100.0, _played(10, late=2)), (120.0, StreamStats(refused="x", close_code=1013))]
    streams = {**S.summary(book, 10.0, 90.0, 190.0, 1), "model": "digits", "size": "64x64",
               "life_s": "2.5-7.5", "left_behind": None}  # fmt: skip
    run = {"label": "", "config": "c", "machine": "m", "duration_s": 600, "clients": 4,
           "requests": 9, "shed_503": 0, "unexpected": {}, "worst_growth_mb": 1.0,
           "p99_first_half_ms": 5, "p99_second_half_ms": 5, "p99_drift": 0.0,
           "pass": {"memory": True}, "streams": streams}  # fmt: skip
    line = section({"cpu_streams": run})[-1]
    assert "ran 2 streams: 1 opened and played, 1 refused at the handshake (x 1)" in line
    assert "12 frames sent, 10 answered" in line and "dropped: late 2" in line
    assert line.endswith("the replica's stream book idle at the end.")


def _books_server(answers: list[dict]):
    """An HTTP server answering ``GET /v1/streams`` with ``answers`` in turn, round and round
    (as replicas answer in turn behind Serve's proxy)."""
    url, _served, srv = json_server(lambda i, path: (200, answers[i % len(answers)]))
    return url, srv


def test_the_book_counts_as_idle_only_once_every_replica_has_said_so():
    import asyncio

    quiet = {
        "streams": [],
        "admitted_fps": {"digits": 0},
        "coalescers": {},
        "downstream": {"queue_depth": 0},
    }
    a, b = {**quiet, "replica": "a"}, {**quiet, "replica": "b", "streams": [{"id": 7}]}
    url, srv = _books_server([a, b])
    try:  # replica b still holds a stream: an idle answer from a is not enough
        left = asyncio.run(S.left_behind(url, limit_s=1.0, replicas=2))
        assert left == {"b": b}
    finally:
        srv.shutdown()
    url, srv = _books_server([a])
    try:  # only one of the two replicas ever answered: not judged idle
        left = asyncio.run(S.left_behind(url, limit_s=1.0, replicas=2))
        assert left == {"replicas_seen": 1, "wanted": 2}
        assert asyncio.run(S.left_behind(url, limit_s=1.0, replicas=1)) is None
    finally:
        srv.shutdown()
    url, srv = _books_server([a, {**quiet, "replica": "b"}])
    try:
        assert asyncio.run(S.left_behind(url, limit_s=5.0, replicas=2)) is None
    finally:
        srv.shutdown()
