"""What ``bench_e2e`` reads of a running system at each level (``e2e_level.py``,
``ray_probe.py``): its models' precisions, its replicas' warnings, the means and batches
between two readings, and how a row that measured part of a system is shown."""

from __future__ import annotations

import os

from benchmarks import report


def test_a_ferry_apps_model_precisions_are_read_from_its_model_list():
    """``e2e_level.precisions``: each model's compute dtype from ``GET /v1/models`` (a row
    carries it: which dtype an engine ran in changes its GPU time), models without one left
    out; nothing where no server answers the route."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from benchmarks.e2e_level import precisions

    listing = {
        "models": [
            {"name": "resnet50", "precision": {"dtype": "float16", "chosen_by": "probe"}},
            {"name": "digits", "state": "starting"},
        ]
    }

    class Models(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            body = json.dumps(listing).encode() if self.path == "/v1/models" else b""
            self.send_response(200 if body else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Models)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{srv.server_address[1]}"
        assert precisions(base) == {"resnet50": {"dtype": "float16", "chosen_by": "probe"}}
    finally:
        srv.shutdown()
        srv.server_close()
    assert precisions(base, timeout_s=1) == {}  # closed: nothing answers


def test_the_replicas_warnings_are_kept_from_the_sessions_serve_logs(tmp_path):
    """``ray_probe.keep_replica_lines``: the WARNING and ERROR lines of the session's Serve
    replica logs, each with its file's name (bench_e2e keeps them beside a system's serve
    log: a model served in float32, a graph not captured)."""
    from benchmarks import ray_probe

    serve = tmp_path / "logs" / "serve"
    serve.mkdir(parents=True)
    (serve / "replica_ferry_Ingress_a.log").write_text(
        "INFO 1 ready\nWARNING 2 resnet50 served in float32: fp16 not finite\nINFO 3\n"
    )
    (serve / "replica_ferry_Ingress_b.log").write_text("ERROR 4 out of memory\n")
    (serve / "controller_1.log").write_text("WARNING 5 not a replica's\n")
    got = ray_probe.replica_lines(base=str(tmp_path))
    assert got == [
        "replica_ferry_Ingress_a.log: WARNING 2 resnet50 served in float32: fp16 not finite",
        "replica_ferry_Ingress_b.log: ERROR 4 out of memory",
    ]
    out = tmp_path / "replicas_ferry.log"
    assert ray_probe.keep_replica_lines(str(out), base=str(tmp_path)) == 2
    assert out.read_text().splitlines() == got
    assert ray_probe.replica_lines(base=str(tmp_path), most=1) == got[-1:]
    assert ray_probe.keep_replica_lines(str(tmp_path / "no" / "such.log"), base=str(tmp_path)) == 0


def test_a_row_that_measured_part_of_a_system_is_shown_marked_and_is_no_peak_or_ratio():
    import copy
    import json

    path = os.path.join(os.path.dirname(report.__file__), "results", "e2e.json")
    doc = json.load(open(path))
    part = copy.deepcopy(doc)
    corpus = part["rows"][0]["corpus"]
    ferry = [r for r in part["rows"] if r["system"] == "ferry" and r["corpus"] == corpus]
    top = max(ferry, key=lambda r: r["img_s"])
    top["img_s"] *= 10  # a level of part of the system: none of it may count
    top["replicas_starting"] = ["ferry/Inference: UPDATING"]
    text = "\n".join(report.e2e_section(part))
    assert f"{top['img_s']:,.0f}" in text and "part of the system (replicas starting)" in text
    peak = max(r["img_s"] for r in ferry if r is not top)
    assert f"Ferry's peak: {peak:,.0f} img/s" in text
    assert f"{top['img_s']:,.0f} img/s" not in text


def test_stage_means_are_over_the_span_between_two_readings():
    """(``e2e_level.stage_means``: the replicas' stage totals are since each started; a
    level's means are the difference from the reading before it.)"""
    from benchmarks.e2e_level import stage_means

    before = {"decode_host": [100.0, 10.0], "decode_wait": [50.0, 40.0]}
    now = {"decode_host": [160.0, 13.0], "decode_wait": [50.0, 40.0], "decode_device": [9.0, 3.0]}
    # decode_wait saw nothing in between (left out); decode_device is new: all of it
    assert stage_means(now, before) == {"decode_host": 20.0, "decode_device": 3.0}
    assert stage_means(now, {}) == {
        "decode_host": 12.308,
        "decode_wait": 1.25,
        "decode_device": 3.0,
    }


def test_the_apps_bench_e2e_starts_export_within_the_wait_before_a_level_is_read():
    """(Ray's default report interval, 10 s, is longer than a level: its replicas' totals
    were read a level late. The apps get ``EXPORT_ENV``, which Ray's config honours, and a
    level's totals are read ``EXPORT_WAIT_S`` after its load: a flush and a report later.)"""
    import subprocess
    import sys

    from benchmarks import ray_probe
    from pipeline.metrics_buffer import FLUSH_S

    env = {**os.environ, **ray_probe.EXPORT_ENV}
    code = "import ray; print(ray._config.metrics_report_interval_ms())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert int(out.stdout.strip()) == ray_probe.EXPORT_MS
    assert ray_probe.EXPORT_WAIT_S > ray_probe.EXPORT_MS / 1000 + FLUSH_S


def test_level_batches_are_the_batches_and_rounds_between_two_readings():
    from benchmarks.e2e_level import level_batches

    before = {"batches": 100.0, "items": 500.0, "padded_items": 60.0, "graph_replays": 100.0}
    now = {"batches": 150.0, "items": 900.0, "padded_items": 100.0, "graph_replays": 150.0}
    stages0 = {"decode_wait": [10.0, 500.0], "decode_host": [5.0, 100.0]}
    stages1 = {"decode_wait": [30.0, 900.0], "decode_host": [9.0, 150.0]}
    got = level_batches(now, before, stages1, stages0)
    # 50 batches of 400 items (8 a batch) and 40 padding rows: 40 / 440 of the rows run
    assert got == {"batches": 50.0, "mean_batch": 8.0, "padding_share": 0.091, "round_images": 8.0}
    # the first level: since the start
    assert level_batches(now, {}, stages1, {})["mean_batch"] == 6.0
    # a peer (no counts, no stages), and a level with no batch: nothing to say
    assert level_batches({}, {}, {}, {}) == {}
    assert level_batches(before, before, stages0, stages0) == {}
    # an executor that does not export the padding (an older one): the rest still
    assert level_batches({"batches": 2.0, "items": 5.0}, {}, {}, {}) == {
        "batches": 2.0,
        "mean_batch": 2.5,
    }


def test_a_peers_batches_are_read_from_serves_own_batch_histograms():
    """``ray_probe.serve_batch_counts`` over a real HTTP metrics endpoint serving the lines a
    Ray 2.60 replica with a ``@serve.batch`` function exported (seen on this machine), two
    replicas; then ``level_batches`` of two such readings."""
    import http.server
    import threading

    from benchmarks import ray_probe
    from benchmarks.e2e_level import level_batches

    def lines(replica: str, batches: float, items: float, wait: float) -> str:
        lab = f'application="peer",deployment="Peer",function_name="classify",replica="{replica}"'
        return (
            "# HELP ray_serve_actual_batch_size The size of each batch.\n"
            f'ray_serve_actual_batch_size_bucket{{{lab},le="8.0"}} {batches}\n'
            f"ray_serve_actual_batch_size_count{{{lab}}} {batches}\n"
            f"ray_serve_actual_batch_size_sum{{{lab}}} {items}\n"
            f"ray_serve_batch_wait_time_ms_count{{{lab}}} {batches}\n"
            f"ray_serve_batch_wait_time_ms_sum{{{lab}}} {wait}\n"
            f"ray_serve_batches_processed_total{{{lab}}} {batches}\n"
            f"ray_ferry_executor_batches{{{lab}}} 999\n"  # (not Serve's: left out)
        )

    body = {"text": lines("a", 10, 35, 20) + lines("b", 6, 29, 12)}

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            data = body["text"].encode()
            self.send_response(200)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        target = [f"127.0.0.1:{srv.server_address[1]}"]
        first = ray_probe.serve_batch_counts(target)
        assert first == {"batches": 16.0, "items": 64.0, "wait_ms": 32.0}
        body["text"] = lines("a", 30, 195, 60) + lines("b", 26, 189, 52)
        now = ray_probe.serve_batch_counts(target)
        # a Ferry replica exports its own batches, no @serve.batch's: nothing read
        body["text"] = 'ray_ferry_executor_batches{replica="a"} 40\n'
        assert ray_probe.serve_batch_counts(target) == {}
        assert ray_probe.executor_counts(target) == {"batches": 40.0}
    finally:
        srv.shutdown()
        srv.server_close()
    # 40 batches of 320 items between the readings, 80 ms of waits
    assert level_batches(now, first, {}, {}) == {
        "batches": 40.0,
        "mean_batch": 8.0,
        "mean_batch_wait_ms": 2.0,
    }
