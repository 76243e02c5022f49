"""Every error is Ferry's JSON with the right status: the cases of issue 17 as regression
tests, then property-based fuzzing (hypothesis) of the pure parsers -- v2 JSON bodies, the
binary extension's header, image headers, query and header parameters: only FerryErrors
with a 4xx status come out, and their answer always renders as JSON."""

from __future__ import annotations

import json
import struct

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.requests import Request

from deployments.http_errors import error_response
from deployments.ingress_http import app, deadline_of, multipart_image, priority_of
from pipeline.engines.base import TensorInfo
from pipeline.errors import FerryError, InvalidInput
from pipeline.imaging import plan_decode
from pipeline.models.registry import model_info
from pipeline.protocol import v2
from pipeline.protocol.v2 import Signature
from pipeline.protocol.validate import finite_float, header_int, shape_of

DIGITS = Signature(
    (TensorInfo("image", "uint8", (-1, 8, 8, 1)),), (TensorInfo("logits", "float32", (-1, 10)),)
)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _4xx(fn, *args):
    """Call the parser; its error, if any, must be a 4xx FerryError whose answer renders."""
    try:
        return fn(*args)
    except FerryError as exc:
        assert 400 <= exc.http_status < 500, exc
        resp = error_response(exc, "rid-1")
        body = json.loads(resp.body)
        assert resp.status_code == exc.http_status and body["request_id"] == "rid-1"
        assert isinstance(body["error"], str)
        return exc


def _infer(body: dict | bytes, header_length=None):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return v2.parse_infer(raw, header_length, DIGITS, 8)


def _img(**over):
    t = {"name": "image", "shape": [1, 8, 8, 1], "datatype": "UINT8", "data": [0] * 64}
    t.update(over)
    return {"inputs": [t]}


def _deep(n: int, leaf="0") -> bytes:
    return ("[" * n + leaf + "]" * n).encode()


REGRESSIONS = [
    ("shape element 10**30", _img(shape=[10**30, 8, 8, 1])),
    ("shape wraps to 0", _img(shape=[2**32, 2**32, 1, 1], data=[])),
    ("shape with a boolean", _img(shape=[True, 8, 8, 1])),
    ("outputs[].parameters a list", {**_img(), "outputs": [{"name": "logits", "parameters": []}]}),
    ("inputs[].parameters a string", _img(parameters="binary_data_size")),
    ("inputs[].parameters a number", _img(parameters=5)),
    ("datatype a list", _img(datatype=["UINT8"])),
    ("data a string", _img(data="0" * 64)),
    ("id an object", {**_img(), "id": {"a": 1}}),
    ("binary_data_size a boolean", _img(parameters={"binary_data_size": True})),
    ("outputs an object", {**_img(), "outputs": {"name": "logits"}}),
]


@pytest.mark.parametrize("name,body", REGRESSIONS, ids=[n for n, _ in REGRESSIONS])
def test_v2_regressions_are_400(name, body):
    exc = _4xx(_infer, body)
    assert isinstance(exc, InvalidInput), (name, exc)


@pytest.mark.parametrize(
    "raw",
    [
        _deep(10_000),
        b'{"inputs": [{"name": "image", "shape": [1, 8, 8, 1], "datatype": "UINT8", "data": '
        + _deep(100_000)
        + b"}]}",
        b'{"id": ' + b"9" * 5000 + b"}",  # past Python's integer-string limit
    ],
    ids=["json 10000 deep", "data 100000 deep", "5000-digit integer"],
)
def test_deep_or_huge_json_is_400(raw):
    assert isinstance(_4xx(_infer, raw), InvalidInput)


def _request(headers: dict[str, str] | None = None, query: bytes = b"") -> Request:
    return Request(
        {
            "type": "http",
            "method": "POST",
            "path": "/",
            "query_string": query,
            "headers": [(k.encode(), v.encode("latin-1")) for k, v in (headers or {}).items()],
        }
    )


@pytest.mark.parametrize("value", ["nan", "1e400", "-inf", "inf", "0", "-5", "3600001", "x"])
def test_bad_deadlines_are_400_with_a_json_body(value):
    exc = _4xx(deadline_of, _request({"x-deadline-ms": value}), None)
    assert isinstance(exc, InvalidInput)


def test_header_integers_refuse_unicode_digits_and_huge_values():
    for raw in ("²", "١٢", "1" * 30, "-1", "", " ", "0x10"):
        assert isinstance(_4xx(header_int, raw, "h"), InvalidInput), raw
    assert header_int(" 42 ", "h") == 42 and header_int(None, "h") is None


def test_an_error_whose_fields_hold_nan_deep_lists_and_huge_ints_renders():
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    exc = InvalidInput("bad", value=float("nan"), shape=deep, big=10**40, s="x" * 10_000)
    body = json.loads(error_response(exc, "r").body)
    assert body["detail"]["value"] == "nan" and len(body["detail"]["s"]) < 200
    boom = json.loads(error_response(RuntimeError("bug"), "r-500").body)
    assert boom == {"error": "internal error", "request_id": "r-500"}


async def test_fastapi_404_and_405_are_ferry_json():
    import deployments.ingress  # noqa: F401  (registers the routes on ingress_http's app)

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        r = await c.get("/nope", headers={"x-request-id": "abc"})
        assert r.status_code == 404 and r.json()["request_id"] == "abc"
        assert r.json()["error"] == "no such route"
        r = await c.delete("/v2/health/live")
        assert r.status_code == 405 and "request_id" in r.json(), r.text
        assert "allow" in r.headers


# ---------------------------------------------------------------- property-based fuzzing
json_leaf = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
json_values = st.recursive(
    json_leaf,
    lambda kids: (
        st.lists(kids, max_size=5) | st.dictionaries(st.text(max_size=6), kids, max_size=5)
    ),
    max_leaves=30,
)
dims = st.one_of(
    st.integers(-2, 10), st.sampled_from([8, 2**31, 2**32, 2**63, 10**30]), st.booleans(), json_leaf
)
tensor = st.fixed_dictionaries(
    {},
    optional={
        "name": json_values,
        "shape": st.lists(dims, max_size=6) | json_values,
        "datatype": st.sampled_from(list(v2.DTYPES) + ["BYTES", "uint8", ""]) | json_values,
        "data": st.lists(st.integers(-300, 300) | st.floats(), max_size=80) | json_values,
        "parameters": st.fixed_dictionaries(
            {}, optional={"binary_data_size": st.integers(-1, 300) | json_values}
        )
        | json_values,
    },
)
output = st.fixed_dictionaries(
    {},
    optional={
        "name": st.sampled_from(["probabilities", "logits", "x"]) | json_values,
        "parameters": st.fixed_dictionaries({}, optional={"binary_data": json_values})
        | json_values,
    },
)
infer_body = st.fixed_dictionaries(
    {},
    optional={
        "id": json_values,
        "inputs": st.lists(tensor, max_size=3) | json_values,
        "outputs": st.lists(output, max_size=3) | json_values,
        "parameters": json_values,
    },
)


@FUZZ
@given(body=infer_body | json_values)
def test_fuzz_v2_json_bodies(body):
    _4xx(_infer, json.dumps(body).encode())


@FUZZ
@given(head=infer_body, blob=st.binary(max_size=300), hl=st.integers(-5, 400) | st.none())
def test_fuzz_v2_binary_extension(head, blob, hl):
    raw = json.dumps(head).encode()
    length = len(raw) if hl is None else hl
    _4xx(_infer, raw + blob, length)


@FUZZ
@given(raw=st.binary(max_size=200))
def test_fuzz_v2_raw_bytes(raw):
    _4xx(_infer, raw)


def _png(w: int, h: int, tail: bytes) -> bytes:
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + struct.pack(">II", w, h) + tail


def _jpeg(h: int, w: int, marker: int, tail: bytes) -> bytes:
    return b"\xff\xd8\xff" + bytes([marker]) + b"\x00\x11\x08" + struct.pack(">HH", h, w) + tail


image_headers = st.one_of(
    st.builds(_png, st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1), st.binary(max_size=40)),
    st.builds(
        _jpeg,
        st.integers(0, 65535),
        st.integers(0, 65535),
        st.sampled_from([0xC0, 0xC1, 0xC2, 0xC4, 0xDA, 0xE0, 0xFE]),
        st.binary(max_size=40),
    ),
    st.binary(max_size=64),
)
content_types = st.sampled_from(
    [None, "", "image/jpeg", "image/png", "image/gif", "application/octet-stream", "x; y"]
) | st.text(max_size=20)


@FUZZ
@given(data=image_headers, ct=content_types, model=st.sampled_from(["digits", "resnet50"]))
def test_fuzz_image_headers(data, ct, model):
    target = model_info(model).target()
    _4xx(plan_decode, data, ct, target, 40_000_000, 512 << 20)


header_text = st.text(
    alphabet=st.characters(min_codepoint=32, max_codepoint=255), max_size=30
) | st.sampled_from(["nan", "1e400", "-0", "1e-400", "²", "Infinity", "0x1p3"])


@FUZZ
@given(deadline=header_text, priority=header_text, hl=header_text, query=st.binary(max_size=40))
def test_fuzz_query_and_header_parameters(deadline, priority, hl, query):
    req = _request({"x-deadline-ms": deadline, "x-priority": priority}, query)
    _4xx(deadline_of, req, None)
    priority_of(req)
    _4xx(header_int, hl, "Inference-Header-Content-Length")
    _4xx(finite_float, deadline, "x", 0.0, 1.0)


@FUZZ
@given(body=st.binary(max_size=300), ct=st.text(max_size=60))
def test_fuzz_multipart(body, ct):
    _4xx(multipart_image, body, "multipart/form-data; " + ct)


@FUZZ
@given(v=json_values | st.lists(dims, max_size=8))
def test_fuzz_shapes(v):
    got = _4xx(shape_of, v, "t")
    if isinstance(got, tuple):
        n = 1
        for d in got:
            n *= d
        assert n <= 2**31 and all(type(d) is int and d >= 0 for d in got)


def test_valid_v2_requests_still_parse():
    req = _infer(_img(data=list(range(64))))
    assert req.images.shape == (1, 8, 8, 1) and req.outputs == DIGITS.output_names
    arr = np.arange(64, dtype=np.uint8).tobytes()
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "image",
                    "shape": [1, 8, 8, 1],
                    "datatype": "UINT8",
                    "parameters": {"binary_data_size": 64},
                }
            ],
            "outputs": [{"name": "logits", "parameters": {"binary_data": True}}],
        }
    ).encode()
    req = _infer(head + arr, len(head))
    assert req.binary_outputs == frozenset({"logits"}) and req.images.ravel()[63] == 63
