"""The statistics book over several ingress replicas: perf_analyzer subtracts snapshots in
unsigned 64-bit integers, so no snapshot may be smaller than an earlier one, whichever
replica answers the GET."""

from __future__ import annotations

from pipeline.protocol import triton


def _serve(book: triton.Stats, n: int, queue_ms: float) -> None:
    for _ in range(n):
        t = {"queue": queue_ms, "preprocess": 0.1, "gpu": 0.3, "postprocess": 0.05}
        book.record("digits", True, 1.0, t, 1)


def _queue(snapshot: dict) -> tuple[int, int]:
    q = snapshot["model_stats"][0]["inference_stats"]["queue"]
    return q["count"], q["ns"]


def _pa_queue_ms(before: tuple[int, int], after: tuple[int, int]) -> float:
    """perf_analyzer's arithmetic: uint64 differences, ns per request."""
    dn = (after[0] - before[0]) % 2**64
    dns = (after[1] - before[1]) % 2**64
    return dns / dn / 1e6


def test_snapshots_of_the_sum_over_replicas_never_go_backwards():
    a, b = triton.Stats(), triton.Stats()
    _serve(a, 50, 2000.0)  # replica a's first requests waited for the warm-up (2 s each)
    _serve(b, 60, 0.5)
    before = _queue(triton.Stats().model_stats(["digits"], triton.merge([a.books(), b.books()])))
    _serve(a, 30, 0.5)
    _serve(b, 30, 0.5)
    after = _queue(triton.Stats().model_stats(["digits"], triton.merge([b.books(), a.books()])))
    assert after[0] - before[0] == 60
    assert 0.49 < _pa_queue_ms(before, after) < 0.51
    # what each replica's own book gave: a GET on a, then one on b -> the difference wraps
    own = _pa_queue_ms(_queue(a.model_stats(["digits"])), _queue(b.model_stats(["digits"])))
    assert own > 1e9  # (the H200's 9.4e9 ms)


def test_merge_sums_every_field_and_keeps_the_latest_inference():
    a, b = triton.Stats(), triton.Stats()
    _serve(a, 3, 1.0)
    _serve(b, 2, 2.0)
    b.record("digits", False, 5.0, None, 0)
    s = triton.Stats().model_stats(["digits", "resnet50"], triton.merge([a.books(), b.books()]))
    d, r = s["model_stats"]
    st = d["inference_stats"]
    assert st["success"] == {"count": 5, "ns": 5_000_000}
    assert st["fail"] == {"count": 1, "ns": 5_000_000}
    assert st["queue"] == {"count": 5, "ns": 7_000_000}
    assert st["compute_infer"]["count"] == 5
    assert d["inference_count"] == 5 and d["execution_count"] == 5
    assert d["last_inference"] == max(
        x.model_stats(["digits"])["model_stats"][0]["last_inference"] for x in (a, b)
    )
    assert r["inference_stats"]["success"] == {"count": 0, "ns": 0}


def test_a_book_tells_of_changes_at_most_every_interval_and_copies_are_its_own(monkeypatch):
    monkeypatch.setattr(triton.time, "monotonic", lambda: 120.0)  # a machine booted 2 min ago
    book = triton.Stats()
    told: list[int] = []
    book.publish = lambda: told.append(1)
    book.publish_every_s = 3600.0
    _serve(book, 5, 1.0)
    assert len(told) == 1  # the first record tells, the rest wait for the interval
    copy = book.books()
    copy["digits"].success[0] = 99
    copy["digits"].durations["queue"][1] = -1.0
    s = book.model_stats(["digits"])["model_stats"][0]["inference_stats"]
    assert s["success"]["count"] == 5 and s["queue"]["ns"] == 5_000_000
