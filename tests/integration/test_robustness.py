"""No request can hurt the service, over real HTTP against a real Serve app on a local Ray
cluster: the issue-17 corpus (a 60000x1 PNG, non-finite numbers, overflowing and wrapping
shapes, JSON too deep, wrong JSON types, FastAPI's own 404/405, a mislabelled GIF) gets
Ferry's JSON error or an answer, fast, and a bounded hypothesis run finds no 5xx."""

from __future__ import annotations

import contextlib
import json
import time

import httpx
import numpy as np
import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.imaging import encode_jpeg, encode_png
from tests.integration.helpers import BASE, cpu_config, deploy, undeploy
from tests.unit.test_error_json import REGRESSIONS, _deep, infer_body

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def app(ray_cluster):
    deploy(cpu_config(), name="robust")
    # warm: every stage has answered once
    r = httpx.post(
        BASE + "/v1/models/resnet50/classify",
        content=encode_jpeg(np.zeros((64, 64, 3), np.uint8)),
        headers={"content-type": "image/jpeg"},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    yield BASE
    undeploy("robust")


def _replica_rss() -> dict[str, int]:
    """RSS of this app's replica processes (Ray titles them ``ray::ServeReplica:app:...``)."""
    out = {}
    for p in psutil.process_iter(["cmdline"]):
        title = " ".join(p.info["cmdline"] or [])
        if "ServeReplica:robust:" in title:
            with contextlib.suppress(psutil.Error):
                out[title.split()[0]] = p.memory_info().rss
    return out


def _ferry_json(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, (r.status_code, r.text[:300])
    body = r.json()
    assert isinstance(body["error"], str) and body["request_id"], body
    return body


def test_a_60000x1_png_answers_in_under_a_second_and_leaves_no_memory_behind(app):
    rng = np.random.default_rng(0)
    before = _replica_rss()
    for shape in ((1, 60000), (60000, 1)):
        for data, ct in (
            (encode_png(rng.integers(0, 255, (*shape, 3), dtype=np.uint8)), "image/png"),
            (encode_jpeg(rng.integers(0, 255, (*shape, 3), dtype=np.uint8)), "image/jpeg"),
        ):
            t0 = time.perf_counter()
            r = httpx.post(
                app + "/v1/models/resnet50/classify", content=data, headers={"content-type": ct}
            )
            took = time.perf_counter() - t0
            assert r.status_code == 200, r.text
            assert took < 1.0, (shape, ct, took)
    after = _replica_rss()
    grew = {k: (after[k] - before[k]) / 1e6 for k in before if k in after}
    assert grew and max(grew.values()) < 100, grew
    r = httpx.get(app + "/v2/health/ready")
    assert r.status_code == 200


def test_an_extreme_strip_is_refused_with_a_reason(app):
    data = encode_png(np.zeros((1, 100_000, 3), np.uint8))
    r = httpx.post(
        app + "/v1/models/resnet50/classify", content=data, headers={"content-type": "image/png"}
    )
    assert "aspect ratio" in _ferry_json(r, 400)["error"]


@pytest.mark.parametrize("value", ["nan", "1e400", "-inf"])
def test_non_finite_deadlines_are_json_400(app, value):
    r = httpx.post(
        app + "/v1/models/digits/classify",
        content=encode_png(np.zeros((8, 8, 1), np.uint8)),
        headers={"content-type": "image/png", "x-deadline-ms": value, "x-request-id": "dl-1"},
    )
    assert _ferry_json(r, 400)["request_id"] == "dl-1"


@pytest.mark.parametrize("name,body", REGRESSIONS, ids=[n for n, _ in REGRESSIONS])
def test_v2_regressions_are_json_400(app, name, body):
    r = httpx.post(app + "/v2/models/digits/infer", content=json.dumps(body).encode())
    _ferry_json(r, 400)


def test_deep_json_and_deep_data_are_json_400(app):
    for raw in (
        _deep(10_000),
        b'{"inputs": [{"name": "image", "shape": [1, 8, 8, 1], "datatype": "UINT8", "data": '
        + _deep(100_000)
        + b"}]}",
    ):
        _ferry_json(httpx.post(app + "/v2/models/digits/infer", content=raw), 400)


def test_fastapi_404_405_422_are_ferry_json(app):
    assert _ferry_json(httpx.get(app + "/nope"), 404)["error"] == "no such route"
    r = httpx.get(app + "/v2/models/digits/infer")
    _ferry_json(r, 405)
    # a Unicode digit where a header wants an integer
    r = httpx.post(
        app + "/v2/models/digits/infer",
        content=b"{}",
        headers={"inference-header-content-length": "²".encode("latin-1")},
    )
    _ferry_json(r, 400)


def test_a_gif_labelled_jpeg_is_415(app):
    gif = b"GIF89a\x01\x00\x01\x00\x80\x00\x00\xff\xff\xff\x00\x00\x00,\x00\x00\x00\x00\x01\x00"
    r = httpx.post(
        app + "/v1/models/resnet50/classify", content=gif, headers={"content-type": "image/jpeg"}
    )
    assert _ferry_json(r, 415)["detail"]["body"] == "gif"


# what an HTTP client can send as a header value (no edge whitespace: h11 refuses it)
header_values = st.text(
    alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=12
).map(lambda v: v.strip() or "0")


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    body=infer_body,
    deadline=header_values | st.sampled_from(["nan", "1e400"]),
    hl=header_values,
    top_k=header_values,
)
def test_fuzz_over_http_no_5xx_and_always_json(app, body, deadline, hl, top_k):
    with httpx.Client(base_url=app, timeout=30) as c:
        r = c.post(
            "/v2/models/digits/infer",
            content=json.dumps(body).encode(),
            headers={"x-deadline-ms": deadline, "inference-header-content-length": hl},
        )
        assert r.status_code < 500 and isinstance(r.json(), dict), r.text[:300]
        r = c.post(
            "/v1/models/digits/classify",
            params={"top_k": top_k},
            content=encode_png(np.zeros((8, 8, 1), np.uint8)),
            headers={"content-type": "image/png", "x-deadline-ms": deadline},
        )
        # a valid image with a deadline of a millisecond or so: 504 is the documented answer
        # when it runs out first (it does on a busy 2-core machine); never any other 5xx
        late = r.status_code == 504 and r.json().get("type") == "DeadlineExceeded"
        assert (r.status_code < 500 or late) and isinstance(r.json(), dict), r.text[:300]
    assert httpx.get(app + "/v2/health/ready").status_code == 200
