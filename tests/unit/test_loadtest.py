"""Load shapes, the summary/plot writer on a synthetic locust CSV, busy cores, the corpora."""

from __future__ import annotations

import json
import os

import pytest

from loadtest import plots
from loadtest import run as runner
from loadtest.shapes import Pulse, SlowClients, StepRamp
from tests.json_server import json_server


def test_step_ramp_doubles_until_max():
    s = StepRamp(start_users=2, step_s=10, max_users=16)
    seq = [s.tick(t, {}) for t in (0, 5, 10, 25, 31, 39)]
    assert [x[0] for x in seq] == [2, 2, 4, 8, 16, 16]
    assert s.tick(39.5, {}) == (16, 16.0, None)
    assert s.tick(41, {}) is None  # 32 > max_users


def test_step_ramp_stops_when_latency_or_errors_break_the_limit():
    s = StepRamp(start_users=1, step_s=10, p99_limit_ms=500, fail_limit=0.01)
    assert s.tick(10.2, {"p99_ms": 400, "fail_ratio": 0.0}) == (2, 2.0, None)
    assert s.tick(20.5, {"p99_ms": 800, "fail_ratio": 0.0}) is None
    s2 = StepRamp(start_users=1, step_s=10, fail_limit=0.01)
    assert s2.tick(10.5, {"p99_ms": 10, "fail_ratio": 0.05}) is None


def test_pulse_bursts_three_times_the_level():
    p = Pulse(users=10, factor=3, burst_s=60, period_s=180, duration_s=400)
    assert [p.tick(t, {})[0] for t in (0, 100, 119, 120, 179, 180, 300)] == [
        10,
        10,
        10,
        30,
        30,
        10,
        30,
    ]
    assert p.tick(400, {}) is None


def test_slow_clients_mix():
    s = SlowClients(users=40, slow_share=0.25, duration_s=10)
    users, rate, weights = s.tick(1, {})
    assert users == 40 and weights == {"SlowUploadUser": 0.25, "ClassifyUser": 0.75}
    assert s.tick(10, {}) is None


CSV = """Type,Name,Request Count,Failure Count,Median Response Time,Average Response Time,Min Response Time,Max Response Time,Average Content Size,Requests/s,Failures/s,50%,66%,75%,80%,90%,95%,98%,99%,99.9%,99.99%,100%
POST,classify,1000,4,12,13.5,3,80,250,100.0,0.4,12,14,15,16,20,25,40,55,79,80,80
,Aggregated,1000,4,12,13.5,3,80,250,100.0,0.4,12,14,15,16,20,25,40,55,79,80,80
"""


def test_summary_and_plot_from_a_synthetic_csv(tmp_path):
    p = tmp_path / "u8_stats.csv"
    p.write_text(CSV)
    row = runner.parse_stats_csv(str(p), seconds=10)
    assert row == {"requests": 1000, "errors": 4, "img_s": 99.6, "p50_ms": 12.0, "p99_ms": 55.0}
    rows = [{"system": "a", "clients": c, **row} for c in (1, 8)] + [
        {"system": "b", "clients": 8, **row}
    ]
    path = runner.write_summary(rows, str(tmp_path / "out"), {"seconds": 10})
    assert json.load(open(path))["rows"][2]["system"] == "b"
    png = plots.plot(rows, str(tmp_path / "out" / "summary.png"), "t")
    assert os.path.getsize(png) > 5000
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_plot_draws_a_level_that_answered_nothing(tmp_path):
    """A collapsed system (nothing answered within the window) has throughput 0 and no
    latency; the plot keeps its throughput point and leaves the latency out."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    rows = [
        {"system": "peer", "clients": 1, "img_s": 30.0, "p50_ms": 30.0, "p99_ms": 35.0},
        {"system": "peer", "clients": 512, "img_s": 0.0, "p50_ms": None, "p99_ms": None},
    ]
    seen = []
    real = plt.Figure.savefig

    def keep(fig, *a, **k):
        seen.append([[list(line.get_xdata()) for line in ax.get_lines()] for ax in fig.axes])
        return real(fig, *a, **k)

    plt.Figure.savefig = keep
    try:
        png = plots.plot(rows, str(tmp_path / "p.png"))
    finally:
        plt.Figure.savefig = real
    assert os.path.getsize(png) > 5000
    throughput, latency = seen[0]
    assert throughput == [[1, 512]]
    assert latency == [[1], [1]]


def test_busy_cores_counts_a_spinning_thread():
    import time

    from loadtest.cores import busy_cores_since

    mark, cores = busy_cores_since()
    assert cores == 0.0
    end = time.monotonic() + 0.4
    while time.monotonic() < end:  # this process keeps one core busy
        pass
    _, cores = busy_cores_since(mark)
    assert 0.6 <= cores <= (os.cpu_count() or 1) + 0.1


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="Linux's /proc counters")
def test_machine_counters_see_a_busy_core_and_switches_and_count_them_an_image():
    import threading
    import time

    from benchmarks.e2e_level import per_image
    from loadtest.cores import counter_rates, machine_counters

    before, t0 = machine_counters(), time.monotonic()
    end = t0 + 0.4
    while time.monotonic() < end:  # one core busy in user space...
        pass
    for _ in range(200):  # ...and threads that start and end: context switches
        t = threading.Thread(target=time.sleep, args=(0,))
        t.start()
        t.join()
    rates = counter_rates(before, machine_counters(), time.monotonic() - t0)
    assert rates["user_cores"] + rates["system_cores"] >= 0.5
    assert rates["ctxt_per_s"] >= 400 and rates["intr_per_s"] >= 0
    m = per_image(rates, img_s=100.0)
    assert m["ctxt_per_img"] == round(rates["ctxt_per_s"] / 100.0, 2)
    kernel = rates["system_cores"] + rates["irq_cores"] + rates["softirq_cores"]
    assert m["kernel_cores"] == round(kernel, 3)
    assert per_image({}, 100.0) == {}


@pytest.mark.skipif(not os.path.exists("/proc/net/snmp"), reason="Linux's TCP counters")
def test_machine_counters_count_tcp_connections_and_segments():
    import socket

    from loadtest.cores import machine_counters

    server = socket.create_server(("127.0.0.1", 0))
    before = machine_counters()
    for _ in range(20):  # twenty connections, each a request and an answer
        c = socket.create_connection(server.getsockname())
        s, _ = server.accept()
        c.sendall(b"x" * 100)
        assert s.recv(100)
        s.sendall(b"y" * 100)
        assert c.recv(100)
        c.close()
        s.close()
    server.close()
    after = machine_counters()
    assert after["tcp_opens"] - before["tcp_opens"] >= 20
    assert after["tcp_accepts"] - before["tcp_accepts"] >= 20
    assert after["tcp_in_segs"] - before["tcp_in_segs"] >= 20 * 4  # SYN, ACK, data, FIN at least
    assert after["tcp_out_segs"] - before["tcp_out_segs"] >= 20 * 4


def test_photos_corpus_is_distinct_real_photos_in_the_size_range():
    import simplejpeg

    from loadtest.corpus import corpus

    c = corpus("photos")
    assert c.name == "photos" and len(c.bodies) >= 16
    assert len(set(c.bodies)) == len(c.bodies)  # distinct images
    for body, (w, h) in zip(c.bodies, c.sizes, strict=True):
        hh, ww, _, _ = simplejpeg.decode_jpeg_header(body)
        assert (ww, hh) == (w, h)
        assert 640 <= w <= 1920 and 480 <= h <= 1080
    assert {s for s in c.sizes} >= {(640, 480), (1920, 1080)}
    assert 50_000 < c.mean_bytes < 400_000 and "quality 85" in c.description
    assert corpus("chelsea").sizes == ((451, 300),)
    with pytest.raises(ValueError, match="unknown corpus"):
        corpus("nope")


def test_shapes_fit_the_run_they_are_given():
    from loadtest import shapes

    p = shapes.make("pulse", 60)
    levels = {p.tick(t, {})[0] for t in range(0, 60)}
    assert levels == {p.users, round(p.users * p.factor)}  # a burst comes within 60 s
    assert p.tick(60, {}) is None
    assert shapes.make("slow", 5).tick(5, {}) is None
    assert shapes.make("pulse", None).duration_s == 600  # no limit: the shape's own schedule
    assert shapes.limited(10.0, 10.0) and not shapes.limited(9.9, 10.0)
    assert not shapes.limited(1e9, None)


def test_plot_ticks_are_the_levels_throughput_from_zero_and_both_legends(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    rows = [
        {"system": "s", "clients": c, "img_s": 500.0 + c, "p50_ms": 5.0 + c, "p99_ms": 9.0 + c}
        for c in (1, 8, 64)
    ]
    seen = {}
    real = plt.Figure.savefig

    def keep(fig, *a, **k):
        fig.canvas.draw()
        a0, a1 = fig.axes
        seen["ticks"] = [[t.get_text() for t in ax.get_xticklabels()] for ax in (a0, a1)]
        seen["ylim"] = a0.get_ylim()
        seen["legends"] = [[t.get_text() for t in ax.get_legend().get_texts()] for ax in (a0, a1)]
        return real(fig, *a, **k)

    plt.Figure.savefig = keep
    try:
        plots.plot(rows, str(tmp_path / "p.png"))
    finally:
        plt.Figure.savefig = real
    assert seen["ticks"] == [["1", "8", "64"], ["1", "8", "64"]]
    assert seen["ylim"][0] == 0
    assert seen["legends"] == [["s"], ["s p99", "s p50"]]


def _dashboard(answers: list[dict | None]) -> tuple[str, list[int], object]:
    """An HTTP server answering ``GET /api/serve/applications/`` with ``answers`` in turn (the
    last one again after): the shape of Ray's Serve REST API (``ServeInstanceDetails``); a
    None, a 503 (a dashboard still starting, or too busy to answer)."""

    def answer(i: int, path: str) -> tuple[int, dict | None]:
        doc = answers[min(i, len(answers) - 1)]
        if doc is None:
            return 503, None
        return (200 if path == "/api/serve/applications/" else 404), doc

    return json_server(answer)


def _apps(**status: str) -> dict:
    deps = {name: {"status": s, "replicas": []} for name, s in status.items()}
    return {"applications": {"ferry": {"status": "DEPLOYING", "deployments": deps}}}


def test_wait_settled_waits_for_every_deployment_and_stops_at_a_failed_one(monkeypatch):
    monkeypatch.setenv("RAY_AUTH_TOKEN", "t")
    url, served, srv = _dashboard(
        [_apps(Ingress="UPDATING"), _apps(Ingress="UPDATING"), _apps(Ingress="HEALTHY")]
    )
    try:
        assert runner.serve_starting(url) == ["ferry/Ingress: UPDATING"]
        assert runner.wait_settled(30, dashboard=url) == []  # the third answer: all up
        assert served[0] == 3
    finally:
        srv.shutdown()
    url, served, srv = _dashboard([_apps(Ingress="HEALTHY", Inference="DEPLOY_FAILED")])
    try:  # will not come up by waiting: the wait ends at its first reading
        assert runner.wait_settled(30, dashboard=url) == ["ferry/Inference: DEPLOY_FAILED"]
        assert served[0] == 1
    finally:
        srv.shutdown()
    assert runner.wait_settled(1, dashboard="http://127.0.0.1:9") is None  # nobody answers
    url, served, srv = _dashboard([None, _apps(Ingress="UPDATING"), None, _apps(Ingress="HEALTHY")])
    try:  # a reading that fails is no "all up" (2026-12-06: the first one ended the wait)
        assert runner.wait_settled(30, dashboard=url) == []
        assert served[0] == 4
    finally:
        srv.shutdown()
    url, served, srv = _dashboard([_apps(Ingress="UPDATING"), None])
    try:  # the wait ends with readings failing: what was last read is what it says
        assert runner.wait_settled(3, dashboard=url) == ["ferry/Ingress: UPDATING"]
    finally:
        srv.shutdown()
