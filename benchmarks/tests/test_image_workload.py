"""bench_e2e's image workload on the CPU, without Ray or a GPU: the frames corpus, the U-Net
file and Ferry's config loading it (as ``ferry config check`` loads models), the load
generator's JPEG-answer check and Server-Timing over real HTTP, and what the benchmark asks
and writes (systems, routes, headers, rows)."""

from __future__ import annotations

import argparse
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import simplejpeg
import yaml

from benchmarks import bench_e2e, loadgen
from benchmarks import image_workload as iw
from benchmarks.e2e_configs import serve_config, url_of
from benchmarks.e2e_systems import SYSTEMS, WORKLOADS, corpus_of
from benchmarks.loadgen import answer_error, jpeg_size, server_timing
from pipeline.imaging import encode_jpeg


@pytest.fixture(scope="module")
def frames():
    return iw.frames()


def test_the_corpus_is_16_distinct_real_frames_of_1280x720(frames):
    assert frames.name == iw.CORPUS == "frames720" and len(frames.bodies) == 16
    assert len(set(frames.bodies)) == 16
    assert frames.sizes == ((1280, 720),) * 16
    assert {jpeg_size(b) for b in frames.bodies} == {(1280, 720)}
    assert 60_000 < frames.mean_bytes < 400_000  # photos, not flat colour
    for body in frames.bodies[::5]:
        img = simplejpeg.decode_jpeg(body, colorspace="RGB")
        assert img.shape == (720, 1280, 3) and img.std() > 20
    assert "1280x720" in frames.description and "quality 85" in frames.description
    assert corpus_of("frames720").bodies == frames.bodies
    assert corpus_of("chelsea").name == "chelsea"


def test_the_unet_file_loads_in_ferrys_config_as_an_image_model(tmp_path):
    """The benchmark's config with the model file exported here (width 4: the same network,
    narrower), loaded as the inference replica loads it (on numpy without a GPU)."""
    pytest.importorskip("torch")
    from pipeline.check import check_models
    from pipeline.config import PipelineConfig

    path = iw.export_unet(str(tmp_path / "unet.pt2"), width=4)
    assert os.listdir(tmp_path) == ["unet.pt2"]  # written whole, nothing left beside it
    served = serve_config("ferry_image", SYSTEMS["ferry_image"])
    try:
        with open(served) as f:
            pipeline = yaml.safe_load(f)["applications"][0]["args"]["config"]
    finally:
        os.unlink(served)
    (entry,) = pipeline["models"]
    assert entry["source"] == iw.UNET_PATH and entry["task"] == "image"
    assert entry["input"] == {"height": 256, "width": 256, "resize": "stretch"}
    entry["source"] = path
    report, backend = check_models(PipelineConfig.model_validate(pipeline))
    assert backend in ("numpy", "cupy") and report.loaded == ["unet"] and not report.refused
    assert "width 32" in iw.describe() and "4.3 GMAC" in iw.describe()


# ------------------------------------------------------------------ the JPEG answer check


def _jpeg(w: int, h: int, **pil) -> bytes:
    if not pil:
        return encode_jpeg(np.full((h, w, 3), 128, np.uint8))
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.zeros((h, w, 3), np.uint8)).save(buf, "JPEG", **pil)
    return buf.getvalue()


def test_jpeg_size_reads_the_frame_header_of_any_jpeg():
    assert jpeg_size(_jpeg(1280, 720)) == (1280, 720)  # simplejpeg, baseline
    assert jpeg_size(_jpeg(47, 33, progressive=True)) == (47, 33)  # SOF2
    assert jpeg_size(_jpeg(20, 10, exif=b"Exif\x00\x00" + b"\x00" * 300)) == (20, 10)  # APP1
    grey = simplejpeg.encode_jpeg(np.zeros((9, 17, 1), np.uint8), colorspace="GRAY")
    assert jpeg_size(grey) == (17, 9)
    body = _jpeg(64, 32)
    assert jpeg_size(body[:2] + b"\xff\xff" + body[2:]) == (64, 32)  # a fill byte
    for bad in (b"", b"\xff\xd8", b"\x89PNG\r\n\x1a\n", b"{}", body[:20], b"\xff\xd8\xff\xd9"):
        assert jpeg_size(bad) is None, bad[:8]
    assert jpeg_size(b"\xff\xd8\xff\xda\x00\x04ab") is None  # a scan before any frame


def test_an_answer_is_ok_only_as_a_whole_jpeg_of_its_inputs_size():
    body = _jpeg(1280, 720)
    assert answer_error(200, body, (1280, 720)) is None
    assert answer_error(200, body, None) is None  # classify: any 200
    assert answer_error(200, b'{"top_k": []}', None) is None
    assert answer_error(200, body[:-100], (1280, 720)) == "200 not a 1280x720 JPEG"  # cut
    assert answer_error(200, _jpeg(256, 256), (1280, 720)) == "200 not a 1280x720 JPEG"
    assert answer_error(200, b'{"error": 1}', (1280, 720)) == "200 not a 1280x720 JPEG"
    assert answer_error(503, body, (1280, 720)) == "503"
    assert answer_error("ClientOSError", b"", (1280, 720)) == "ClientOSError"


def test_server_timing_parses_ferrys_and_the_peers_headers():
    ferry = "ingress;dur=0.8, preprocess;dur=3.25, queue;dur=1, gpu;dur=4.5, total;dur=12.0"
    assert server_timing(ferry) == {
        "ingress": 0.8,
        "preprocess": 3.25,
        "queue": 1.0,
        "gpu": 4.5,
        "total": 12.0,
    }
    assert server_timing('a;desc="x";dur="2.5", b, c;dur=oops, ;dur=1') == {"a": 2.5}
    assert server_timing("") == {}


class _Answers(BaseHTTPRequestHandler):
    """Answers each POST in turn: the body echoed (a JPEG of its size), cut short, another
    size, a 503 -- with a Server-Timing header on the good ones."""

    seen: list[str] = []
    count = 0
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["content-length"]))
        with self.lock:
            k = type(self).count % 4
            type(self).count += 1
            self.seen.append(self.headers.get("accept", ""))
        status, out, extra = 200, body, {}
        if k == 0:
            extra = {"server-timing": "gpu;dur=2, total;dur=5"}
        elif k == 1:
            out = body[:-50]
        elif k == 2:
            out = _jpeg(8, 8)
        else:
            status, out = 503, b'{"error": "QueueFull"}'
        self.send_response(status)
        self.send_header("content-type", "image/jpeg")
        self.send_header("content-length", str(len(out)))
        for key, v in extra.items():
            self.send_header(key, v)
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args) -> None:
        pass


def _server() -> ThreadingHTTPServer:
    for port in range(8523, 8600):  # this machine's range for a test's own services
        try:
            return ThreadingHTTPServer(("127.0.0.1", port), _Answers)
        except OSError:
            continue
    pytest.skip("no free port in 8523..8599")


def test_the_load_generator_counts_only_jpegs_of_the_inputs_size_over_http():
    srv = _server()
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}/image"
        bodies = [_jpeg(64, 32), _jpeg(48, 96)]
        r = loadgen.run(
            url,
            bodies,
            "image/jpeg",
            clients=2,
            seconds=1.0,
            procs=1,
            warmup=0.2,
            extra_headers={"accept": "image/jpeg"},
            collect_timings=True,
            expect_sizes=[(64, 32), (48, 96)],
        )
    finally:
        srv.shutdown()
        srv.server_close()
        th.join(5)
    assert r["ok"] > 0 and r["errors"] >= 2 * r["ok"] - 4  # one answer in four is good
    assert set(r["errors_by_status"]) <= {"200 not a 64x32 JPEG", "200 not a 48x96 JPEG", "503"}
    assert "503" in r["errors_by_status"] and len(r["errors_by_status"]) >= 2
    assert r["mean_timings_ms"] == {"gpu": 2.0, "total": 5.0}  # the OK answers' header
    assert set(_Answers.seen) == {"image/jpeg"}
    with pytest.raises(ValueError, match="expected sizes"):
        loadgen.run(url, bodies, "image/jpeg", 1, 1.0, expect_sizes=[(64, 32)])


# ------------------------------------------------------------------- what bench_e2e asks


def test_the_image_workloads_systems_routes_and_headers():
    args = bench_e2e.parse_args(["--workload", "image"])
    assert args.names == ["ferry_image", "rayserve_image_8"] and args.corpus == "frames720"
    classify = bench_e2e.parse_args([])
    assert classify.workload == "classify" and classify.corpus == "chelsea,photos"
    assert "ferry" in classify.names and "ferry_image" not in classify.names
    for wrong in (["--workload", "image", "--systems", "ferry"], ["--systems", "ferry_image"]):
        with pytest.raises(SystemExit):
            bench_e2e.parse_args(wrong)
    w = WORKLOADS["image"]
    assert url_of(SYSTEMS["ferry_image"]) == (
        "http://127.0.0.1:8000/v1/models/unet/image?size=input&quality=90"
    )
    assert url_of(SYSTEMS["rayserve_image_8"]) == "http://127.0.0.1:8000/image"
    assert url_of(SYSTEMS["ferry"]).endswith("/v1/models/resnet50/classify")
    assert w.headers() == {"accept": "image/jpeg"} and WORKLOADS["classify"].headers() == {}
    c = corpus_of("chelsea")
    assert w.expect(c) == ((451, 300),) and WORKLOADS["classify"].expect(c) is None


def test_the_image_peers_serve_config():
    from ray.serve.schema import ServeDeploySchema

    path = serve_config("rayserve_image_8", SYSTEMS["rayserve_image_8"])
    try:
        with open(path) as f:
            raw = yaml.safe_load(f)
    finally:
        os.unlink(path)
    ServeDeploySchema.model_validate(raw)
    (app,) = raw["applications"]
    assert app["route_prefix"] == "/image"
    assert app["import_path"] == "benchmarks.peers.rayserve_image:build_app"
    assert app["args"] == {"replicas": 8, "model": iw.UNET_PATH}
    assert SYSTEMS["rayserve_image_8"]["env"] == SYSTEMS["ferry_image"]["env"]  # HAProxy both


def test_a_level_asks_for_jpegs_of_each_frames_size_and_its_row_says_image(monkeypatch):
    asked = {}

    def fake_run(url, bodies, content_type, clients, seconds, **kw):
        asked.update(kw, url=url, n=len(bodies), content_type=content_type)
        return {
            "img_s": 100.0,
            "p50_ms": 9.0,
            "p99_ms": 20.0,
            "errors": 1,
            "errors_by_status": {"200 not a 1280x720 JPEG": 1},
            "loadgen_procs": 1,
            "loadgen_cpu_per_proc": [0.2],
            "mean_timings_ms": {"gpu": 3.0},
        }

    from benchmarks import e2e_level

    monkeypatch.setattr(e2e_level.loadgen, "run", fake_run)
    from loadtest import cores

    monkeypatch.setattr(cores, "run_cpu_s", lambda run_id: 0.0)
    monkeypatch.setattr(cores, "thread_cpu_s", lambda run_id: {})
    monkeypatch.setattr(cores, "busiest", lambda a, b, wall, top=12, unit="cores": [])
    monkeypatch.setattr(cores, "busy_cores_since", lambda mark=None: (None, 1.5))
    args = argparse.Namespace(workload="image", seconds=2.0, warmup=1.0, mps=False)
    c = corpus_of("frames720")
    row, timings = bench_e2e.measure("ferry_image", "http://x/y", c, 16, args, True, "run", 8)
    assert asked["extra_headers"] == {"accept": "image/jpeg"} and asked["collect_timings"]
    assert asked["expect_sizes"] == ((1280, 720),) * 16 and asked["content_type"] == "image/jpeg"
    assert timings == {"gpu": 3.0}
    assert row["workload"] == "image" and row["corpus"] == "frames720"
    assert (row["system"], row["clients"], row["replicas"]) == ("ferry_image", 16, 8)
    assert (row["img_s"], row["p50_ms"], row["p99_ms"], row["errors"]) == (100.0, 9.0, 20.0, 1)
    assert row["errors_by_status"] == {"200 not a 1280x720 JPEG": 1}
    assert {"server_cpu_ms_per_img", "machine_busy_cores", "loadgen_cpu_per_proc"} <= set(row)


def test_a_run_merges_its_rows_into_the_file_and_strict_fails_on_errors(tmp_path, monkeypatch):
    """``main`` with the systems stood in: the U-Net is exported first, the earlier rows of
    other systems stay, the run's note names the model, and ``--strict`` exits 1 on a level
    with errors or a system that did not come up."""
    import json

    out = tmp_path / "e2e.json"
    old = {"system": "ferry", "corpus": "chelsea", "clients": 1, "img_s": 9.0, "errors": 0}
    out.write_text(json.dumps({"rows": [old], "corpora": {"chelsea": "one photo"}, "runs": {}}))
    exported = []
    monkeypatch.setattr(bench_e2e, "export_unet", lambda: exported.append(1) or "/m.pt2")
    monkeypatch.setattr(bench_e2e, "corpus_of", lambda name: corpus_of("chelsea"))

    def fake_system(name, corpora, levels, args, log_dir, rows, breakdown, save, budget):
        if name == "rayserve_image_4":
            return "did not come up"
        for n in levels:
            errors = 2 if n == 16 else 0
            rows.append(
                {"system": name, "workload": "image", "corpus": corpora[0].name, "clients": n,
                 "img_s": 50.0, "p50_ms": 1.0, "p99_ms": 2.0, "errors": errors,
                 "errors_by_status": {"503": errors} if errors else {}}
            )  # fmt: skip
            save()
        return "ok"

    monkeypatch.setattr(bench_e2e, "run_system", fake_system)
    common = ["--workload", "image", "--clients", "1,16", "--out", str(out)]
    assert bench_e2e.main([*common, "--systems", "ferry_image"]) == 0  # errors are figures
    assert exported == [1]
    doc = json.loads(out.read_text())
    assert doc["rows"][0] == old and len(doc["rows"]) == 3
    assert {r["workload"] for r in doc["rows"][1:]} == {"image"}
    assert {r["run"] for r in doc["rows"][1:]} == {"run1"} and "run" not in doc["rows"][0]
    (note,) = doc["runs"].values()
    assert "ferry_image" in note and "image: U-Net 256x256" in note and "width 32" in note
    assert (tmp_path / "e2e.png").exists()
    strict = [*common, "--strict", "--systems", "ferry_image,rayserve_image_4"]
    assert bench_e2e.main(strict) == 1
    assert len(json.loads(out.read_text())["rows"]) == 3  # ferry_image's rows replaced


def test_results_md_shows_image_rows_against_the_issues_goals(monkeypatch):
    """Image rows in e2e.json (made up here: no figure of this test is a result) get their
    corpus's section, the goals and each system's stages; the classify sections stay."""
    from benchmarks import report

    real = report.load

    def load(name):
        doc = real(name)
        if name != "e2e.json":
            return doc
        row = {"workload": "image", "corpus": "frames720", "errors": 0, "p50_ms": 9.0}
        rows = [
            {**row, "system": s, "clients": n, "img_s": v, "p99_ms": p99}
            for s, n, v, p99 in (
                ("ferry_image", 16, 1000.0, 30.0),
                ("ferry_image", 256, 2000.0, 80.0),
                ("rayserve_image_8", 16, 400.0, 50.0),
                ("rayserve_image_8", 256, 800.0, 200.0),
            )
        ]
        bd = {
            "ferry_image@frames720@16": {"ingress": 1.0, "gpu": 4.0, "total": 12.0},
            "rayserve_image_8@frames720@16": {"queue": 2.0, "batch": 20.0},
        }
        return {
            **doc,
            "corpora": {**doc["corpora"], "frames720": "16 frames"},
            "rows": doc["rows"] + rows,
            "ferry_breakdown": {**doc["ferry_breakdown"], **bd},
        }

    before = report.render()
    monkeypatch.setattr(report, "load", load)
    text = report.render()
    section = text[text.index("### Corpus `frames720`") :]
    assert "`ferry_image`'s peak: 2,000 frames/s (goal >= 3,000)" in section
    assert "(rayserve_image_8, 800 frames/s): 2.50x (goal >= 1.5x)" in section
    assert "p99 at 256 clients: 80 ms (goal <= 100 ms)" in section
    assert "| clients | ingress | gpu | total |" in section and "| 16 | 2.0 | 20.0 |" in section
    chelsea = text[text.index("### Corpus `chelsea`") : text.index("### Corpus `frames720`")]
    assert len(chelsea) > 1000 and chelsea in before  # the classify section as it was
