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


class Kinds:
    """Stands where a module of metric classes stands: each kind makes a ``Recorder`` and
    notes (kind, name) in ``made``."""

    def __init__(self, made: list[tuple[str, str]]):
        self.made = made

    def __getattr__(self, kind):
        def make(name, *a, **kw):
            self.made.append((kind, name))
            return Recorder()

        return make


HIST = [f"{h}_{part}" for h in ("stage", "batch") for part in ("bucket", "count", "sum")]


def sinks() -> dict[str, Recorder]:
    return {k: Recorder() for k in ("queue", "requests", "dropped", *HIST)}


def buckets(rec: Recorder) -> dict[tuple, float]:
    """A bucket gauge's last value by (le, the other labels)."""
    out: dict[tuple, float] = {}
    for op, v, tags in rec.calls:
        assert op == "set"
        out[(tags["le"], tuple(sorted((k, x) for k, x in tags.items() if k != "le")))] = v
    return out


def test_flush_exports_histograms_as_cumulative_buckets_and_each_counters_sum():
    s = sinks()
    buf = metrics.Buffer(s)
    total = (("stage", "total"), ("model", "m"))
    for ms in (1.5, 7.0, 300.0, 2.0):
        buf.put("stage", "observe", ms, total)
    for depth in (5, 9, 2):
        buf.put("queue", "set", depth, (("model", "m"),))
    for code in ("200", "200", "503"):
        buf.put("requests", "inc", 1, (("route", "classify"), ("code", code)))
    assert s["stage_bucket"].calls == []  # nothing reaches Ray before a flush
    calls = buf.flush()
    tags = {"stage": "total", "model": "m"}
    lbl = tuple(sorted(tags.items()))
    got = buckets(s["stage_bucket"])
    # Prometheus' le: observations at or below the bound, cumulative (2.0 is in le=2.0)
    assert got[("0.5", lbl)] == 0 and got[("1.0", lbl)] == 0
    assert got[("2.0", lbl)] == 2 and got[("4.0", lbl)] == 2 and got[("8.0", lbl)] == 3
    assert got[("256.0", lbl)] == 3 and got[("512.0", lbl)] == 4 and got[("+Inf", lbl)] == 4
    assert s["stage_count"].calls == [("set", 4, tags)]
    assert s["stage_sum"].calls == [("set", 310.5, tags)]  # exact, not from bucket midpoints
    assert s["queue"].calls == [("set", 2, {"model": "m"})]
    assert sorted(s["requests"].calls, key=lambda c: c[2]["code"]) == [
        ("inc", 2.0, {"route": "classify", "code": "200"}),
        ("inc", 1.0, {"route": "classify", "code": "503"}),
    ]
    assert calls == len(got) + 2 + 1 + 2
    assert buf.flush() == 0 and len(s["stage_count"].calls) == 1  # nothing new: no calls
    buf.put("stage", "observe", 0.2, total)
    buf.flush()  # the running totals since the start, as Prometheus' counters are
    assert s["stage_count"].calls[-1] == ("set", 5, tags)
    assert buckets(s["stage_bucket"])[("0.5", lbl)] == 1
    assert buckets(s["stage_bucket"])[("+Inf", lbl)] == 5


def test_ray_calls_per_flush_do_not_grow_with_the_observations():
    s = sinks()
    buf = metrics.Buffer(s)
    tags = (("stage", "gpu"), ("model", "m"))
    for i in range(10_000):
        buf.put("stage", "observe", float(i % 50), tags)
    buf.observe("stage", 3.0, tags, n=64)  # a batch of 64 items, each 3 ms
    calls = buf.flush()
    assert calls <= len(metrics.LATENCY_BOUNDARIES_MS) + 1 + 2
    assert s["stage_count"].calls == [("set", 10_064, dict(tags))]
    assert buckets(s["stage_bucket"])[("+Inf", tuple(sorted(tags)))] == 10_064


def test_histograms_counted_from_many_threads_lose_nothing():
    s = sinks()
    buf = metrics.Buffer(s)
    tags = (("stage", "queue"), ("model", "m"))

    def hammer():
        for _ in range(20_000):
            buf.put("stage", "observe", 1.0, tags)

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    buf.flush()
    assert s["stage_count"].calls == [("set", 80_000, dict(tags))]


def test_records_past_the_cap_are_dropped_and_counted():
    s = sinks()
    buf = metrics.Buffer(s, max_pending=3)
    for code in range(5):
        buf.put("requests", "inc", 1, (("code", str(code)),))
    buf.flush()
    assert sorted(c[2]["code"] for c in s["requests"].calls) == ["0", "1", "2"]  # oldest kept
    assert s["dropped"].calls == [("inc", 2.0, None)]
    buf.put("requests", "inc", 1, (("code", "9"),))
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
    while not s["stage_count"].calls and time.time() < deadline:
        time.sleep(0.01)
    assert s["stage_count"].calls == [("set", 1, {"stage": "queue", "model": "m"})]
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
    """A buffer stand-in that keeps what the record functions put and observe."""

    def __init__(self):
        self.records: list[tuple] = []

    def put(self, name, op, value, tags=()):
        self.records.append((name, op, value, tags))

    def observe(self, name, value, tags=(), n=1):
        self.records.extend([(name, "observe", value, tags)] * n)

    def observe_each(self, name, values, tags=()):
        self.records.extend((name, "observe", v, tags) for v in values)


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
    names = ("batches", "batch_items", "batch_bucket", "batch_count", "batch_sum")
    buf = metrics.Buffer({k: Recorder() for k in names})
    for r in c.records:
        buf.put(*r)
    buf.flush()
    assert buf.sinks["batch_items"].calls == [("inc", 11, {"model": "m"})]
    assert buf.sinks["batches"].calls == [("inc", 2, {"model": "m"})]
    got = buckets(buf.sinks["batch_bucket"])
    m = (("model", "m"),)
    assert got[("2.0", m)] == 0
    assert got[("4.0", m)] == 1 and got[("8.0", m)] == 2  # 3 is in le=4, 8 in le=8
    assert buf.sinks["batch_sum"].calls == [("set", 11, {"model": "m"})]


def test_ingress_groups_are_counted_with_their_items(monkeypatch):
    c = Collect()
    monkeypatch.setattr(metrics, "_buffer", c)
    for size in (5, 1, 16):
        metrics.observe_group("m", size)
    buf = metrics.Buffer({k: Recorder() for k in ("groups", "group_items")})
    for r in c.records:
        buf.put(*r)
    buf.flush()
    assert buf.sinks["groups"].calls == [("inc", 3, {"model": "m"})]
    assert buf.sinks["group_items"].calls == [("inc", 22, {"model": "m"})]


def test_metrics_are_made_from_the_installed_classes(monkeypatch):
    import ray.util.metrics as rum

    made: list[tuple[str, str]] = []
    monkeypatch.setattr(metrics, "_classes", None)
    metrics.use_metric_classes(Kinds(made))
    try:
        sinks = metrics._make(metrics._classes)
    finally:
        metrics.use_metric_classes(None)
    assert set(sinks) >= {"stage_us", "requests", "gpu_util", "gpu_jpeg_util", *HIST}
    assert ("Counter", "ferry_requests_total") in made
    for name in ("ferry_stage_latency_ms", "ferry_batch_size"):  # as Prometheus reads one
        assert {("Gauge", f"{name}_{p}") for p in ("bucket", "count", "sum")} <= set(made)
    assert all(hasattr(rum, kind) for kind, _ in made)  # the kinds Ray has


def test_every_gauge_is_set_again_each_refresh_changed_or_not():
    # Ray's agent drops a gauge not set again within two report intervals: an idle
    # replica's gauges and histograms are set again every refresh_s all the same
    now = [0.0]
    s = sinks()
    buf = metrics.Buffer(s, refresh_s=5.0, clock=lambda: now[0])
    buf.put("queue", "set", 3, (("model", "m"),))
    buf.put("queue", "set", 0, (("model", "n"),))
    buf.put("stage", "observe", 4.0, (("stage", "queue"), ("model", "m")))
    buf.put("requests", "inc", 1, (("code", "200"),))
    buf.flush()
    assert len(s["queue"].calls) == 2 and len(s["stage_count"].calls) == 1
    now[0] = 4.9
    buf.put("queue", "set", 5, (("model", "m"),))
    buf.flush()  # before the refresh: only what changed
    assert s["queue"].calls[2:] == [("set", 5, {"model": "m"})]
    assert len(s["stage_count"].calls) == 1
    now[0] = 5.0
    buf.flush()  # the refresh: every gauge at its last value, every histogram cell
    assert sorted(s["queue"].calls[3:], key=str) == [
        ("set", 0, {"model": "n"}),
        ("set", 5, {"model": "m"}),
    ]
    assert s["stage_count"].calls[1:] == [("set", 1, {"stage": "queue", "model": "m"})]
    assert len(s["stage_bucket"].calls) == 2 * (len(metrics.LATENCY_BOUNDARIES_MS) + 1)
    assert s["requests"].calls == [("inc", 1, {"code": "200"})]  # a counter is not re-added
    now[0] = 6.0
    buf.flush()  # and the next refresh is refresh_s after this one
    assert len(s["queue"].calls) == 5
    # half the agent's TTL: 5 s at Ray's default interval (10 s). Ray's config is the
    # process's: one that ran the integration tests' ray.init (a 2 s interval) has 1 s
    import ray

    interval_s = ray._config.metrics_report_interval_ms() / 1000
    assert metrics.refresh_s() == {10.0: 5.0, 2.0: 1.0}.get(interval_s, max(interval_s, 1) / 2)


def test_outside_serve_the_metrics_are_rays_own(monkeypatch):
    # a plain Ray process (a benchmark's actor) installs no classes: ray.util.metrics serves
    import ray

    made: list[tuple[str, str]] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(metrics, "_classes", None)
    monkeypatch.setattr(metrics, "_metrics", None)
    monkeypatch.setattr(metrics, "ray_metrics", Kinds(made))
    got = metrics._get()
    assert got is not None and ("Counter", "ferry_requests_total") in made


def test_a_histogram_takes_a_batchs_values_at_once_as_it_takes_them_one_by_one():
    """``observe_each`` (one lock for a batch's items) counts as ``observe`` per value:
    the same buckets, count and exact sum."""
    from pipeline.metrics_buffer import HISTOGRAMS, Histograms

    values = [0.2, 1.0, 4.0, 4.0, 37.5, 1e6]
    one, each = Histograms(), Histograms()
    for v in values:
        one.observe("stage", v, (("stage", "q"),))
    each.observe_each("stage", values, (("stage", "q"),))
    each.observe_each("stage", [], (("stage", "q"),))
    assert one._cells == each._cells
    cell = each._cells[("stage", (("stage", "q"),))]
    assert sum(cell[:-1]) == len(values) and cell[-1] == sum(values)
    assert len(cell) == len(HISTOGRAMS["stage"]) + 2
