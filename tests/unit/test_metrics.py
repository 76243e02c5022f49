"""The metrics buffer: what reaches Ray's metric objects, and when."""

from __future__ import annotations

import threading
import time

from pipeline import metrics


class Recorder:
    """Stands where a Ray metric object stands: keeps every call made to it."""

    def __init__(self):
        self.calls: list[tuple] = []

    def observe(self, value, tags=None):
        self.calls.append(("observe", value, tags))

    def set(self, value, tags=None):
        self.calls.append(("set", value, tags))

    def inc(self, value=1.0, tags=None):
        self.calls.append(("inc", value, tags))


def sinks() -> dict[str, Recorder]:
    return {k: Recorder() for k in ("stage", "queue", "requests", "dropped")}


def test_flush_records_every_observation_the_last_gauge_and_each_counters_sum():
    s = sinks()
    buf = metrics.Buffer(s)
    total = (("stage", "total"), ("model", "m"))
    for ms in (1.5, 7.0, 300.0):
        buf.put("stage", "observe", ms, total)
    for depth in (5, 9, 2):
        buf.put("queue", "set", depth, (("model", "m"),))
    for code in ("200", "200", "503"):
        buf.put("requests", "inc", 1, (("route", "classify"), ("code", code)))
    assert s["stage"].calls == []  # nothing reaches Ray before a flush
    assert buf.flush() == 3 + 1 + 2
    tags = {"stage": "total", "model": "m"}
    assert s["stage"].calls == [("observe", v, tags) for v in (1.5, 7.0, 300.0)]
    assert s["queue"].calls == [("set", 2, {"model": "m"})]
    assert sorted(s["requests"].calls, key=lambda c: c[2]["code"]) == [
        ("inc", 2.0, {"route": "classify", "code": "200"}),
        ("inc", 1.0, {"route": "classify", "code": "503"}),
    ]
    assert buf.flush() == 0 and len(s["stage"].calls) == 3  # each record goes once


def test_records_past_the_cap_are_dropped_and_counted():
    s = sinks()
    buf = metrics.Buffer(s, max_pending=3)
    for ms in range(5):
        buf.put("stage", "observe", float(ms), (("stage", "gpu"), ("model", "m")))
    buf.flush()
    assert [c[1] for c in s["stage"].calls] == [0.0, 1.0, 2.0]  # the oldest kept
    assert s["dropped"].calls == [("inc", 2.0, None)]
    buf.put("stage", "observe", 9.0, (("stage", "gpu"), ("model", "m")))
    buf.flush()
    assert s["dropped"].calls == [("inc", 2.0, None)]  # counted once


def test_the_flushing_thread_exports_without_a_caller_asking():
    s = sinks()
    buf = metrics.Buffer(s)
    buf.start(every_s=0.05)
    buf.start(every_s=0.05)  # once only
    assert sum(t.name == "ferry-metrics" for t in threading.enumerate()) >= 1
    buf.put("stage", "observe", 4.0, (("stage", "queue"), ("model", "m")))
    deadline = time.time() + 5
    while not s["stage"].calls and time.time() < deadline:
        time.sleep(0.01)
    assert s["stage"].calls == [("observe", 4.0, {"stage": "queue", "model": "m"})]
    assert not buf.pending


def test_without_ray_the_functions_do_nothing(monkeypatch):
    import ray

    # as in a process where Ray is not up (integration tests in this pytest run may have it up)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(metrics, "_metrics", None)
    monkeypatch.setattr(metrics, "_buffer", None)
    metrics.observe_stage("total", "m", 1.0)
    metrics.count_request("digits", "/v1/models/{model}/classify", 200)
    metrics.set_pool({"bytes_in_use": 1, "bytes_held": 2, "high_water_bytes": 3})
    metrics.flush()
    assert metrics._buffer is None and metrics._metrics is None


class Collect:
    """A buffer stand-in that keeps what the record functions put."""

    def __init__(self):
        self.records: list[tuple] = []

    def put(self, name, op, value, tags=()):
        self.records.append((name, op, value, tags))


def test_stage_times_are_per_item_with_an_exact_total(monkeypatch):
    c = Collect()
    monkeypatch.setattr(metrics, "_buffer", c)
    metrics.observe_stage("gpu", "m", 2.5, n=3)  # a batch of 3: each item spent 2.5 ms
    metrics.observe_items("queue", "m", [1.0, 4.0])
    tags_gpu = (("stage", "gpu"), ("model", "m"))
    assert [r for r in c.records if r[0] == "stage"] == [
        ("stage", "observe", 2.5, tags_gpu),
        ("stage", "observe", 2.5, tags_gpu),
        ("stage", "observe", 2.5, tags_gpu),
        ("stage", "observe", 1.0, (("stage", "queue"), ("model", "m"))),
        ("stage", "observe", 4.0, (("stage", "queue"), ("model", "m"))),
    ]
    us = {r[3]: r[2] for r in c.records if r[0] == "stage_us"}
    assert us == {tags_gpu: 7500.0, (("stage", "queue"), ("model", "m")): 5000.0}


def test_batch_sizes_are_counted_as_integers(monkeypatch):
    c = Collect()
    monkeypatch.setattr(metrics, "_buffer", c)
    metrics.observe_batch("m", 3)
    metrics.observe_batch("m", 8)
    buf = metrics.Buffer({k: Recorder() for k in ("batch", "batches", "batch_items")})
    for r in c.records:
        buf.put(*r)
    buf.flush()
    assert buf.sinks["batch_items"].calls == [("inc", 11, {"model": "m"})]
    assert buf.sinks["batches"].calls == [("inc", 2, {"model": "m"})]
    assert [v for _, v, _ in buf.sinks["batch"].calls] == [3, 8]
    assert all(isinstance(v, int) for _, v, _ in buf.sinks["batch"].calls)


def test_metrics_are_made_from_the_installed_classes(monkeypatch):
    import ray.util.metrics as rum

    made = []

    class Kinds:
        def __getattr__(self, kind):
            def make(name, *a, **kw):
                made.append((kind, name))
                return Recorder()

            return make

    monkeypatch.setattr(metrics, "_classes", None)
    metrics.use_metric_classes(Kinds())
    try:
        sinks = metrics._make(metrics._classes)
    finally:
        metrics.use_metric_classes(None)
    assert set(sinks) >= {"stage", "stage_us", "batch", "requests", "gpu_util", "gpu_jpeg_util"}
    assert ("Counter", "ferry_requests_total") in made
    assert ("Histogram", "ferry_stage_latency_ms") in made
    assert all(hasattr(rum, kind) for kind, _ in made)  # the kinds Ray has
