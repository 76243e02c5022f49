"""v2 BYTES tensors of encoded images (pipeline/protocol/encoded.py): parsing the binary
and JSON forms as tritonclient and perf_analyzer send them, the errors, the merge."""

from __future__ import annotations

import asyncio
import base64
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.errors import InvalidInput, UnsupportedMediaType
from pipeline.imaging import Target, encode_jpeg, encode_png, plan_decode
from pipeline.protocol import encoded as te

OUTS = ("logits", "probabilities")


def images() -> list[bytes]:
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (20, 30, 3), dtype=np.uint8)
    return [encode_jpeg(a), encode_png(a), encode_png(a[:, :, :1])]


def binary_body(blobs: list[bytes], shape=None, outputs=None) -> tuple[bytes, int]:
    """What tritonclient sends for ``InferInput(..., "BYTES").set_data_from_numpy(arr,
    binary_data=True)``: each element a 4-byte little-endian length and its bytes."""
    data = b"".join(len(b).to_bytes(4, "little") + b for b in blobs)
    head = {
        "inputs": [
            {
                "name": te.INPUT,
                "shape": shape or [len(blobs), 1],
                "datatype": "BYTES",
                "parameters": {"binary_data_size": len(data)},
            }
        ]
    }
    if outputs is not None:
        head["outputs"] = outputs
    h = json.dumps(head).encode()
    return h + data, len(h)


def test_binary_elements_come_back_byte_for_byte():
    blobs = images()
    body, hl = binary_body(blobs, outputs=[{"name": "probabilities"}])
    req = te.parse(body, hl, OUTS, 64)
    assert req.images == blobs and req.outputs == ("probabilities",)


def test_tritonclient_serialises_bytes_as_parse_reads_them():
    from tritonclient.utils import serialize_byte_tensor

    blobs = images()
    data = serialize_byte_tensor(np.array(blobs, dtype=object)).item()
    body, hl = binary_body(blobs)
    assert data == body[hl:]


def test_json_elements_are_base64_flat_or_one_a_row():
    blobs = images()
    for data in (
        [base64.b64encode(b).decode() for b in blobs],
        [[base64.b64encode(b).decode()] for b in blobs],
    ):
        body = {"inputs": [{"name": te.INPUT, "shape": [3], "datatype": "BYTES", "data": data}]}
        assert te.parse(json.dumps(body).encode(), None, OUTS, 8).images == blobs


@pytest.mark.parametrize(
    "change, message",
    [
        ({"datatype": "UINT8"}, "BYTES"),
        ({"shape": [3, 2]}, "shape"),
        ({"shape": [0, 1]}, "batch size"),
        ({"shape": [9, 1]}, "batch size"),
        ({"data": ["not base64!"] * 3}, "base64"),
        ({"data": [1, 2, 3]}, "strings"),
        ({"data": ["aGk="]}, "number of elements"),
    ],
)
def test_bad_json_requests_are_400s(change, message):
    t = {"name": te.INPUT, "shape": [3, 1], "datatype": "BYTES", "data": ["aGk="] * 3, **change}
    with pytest.raises(InvalidInput, match=message):
        te.parse(json.dumps({"inputs": [t]}).encode(), None, OUTS, 8)


def test_an_input_or_output_name_the_view_does_not_have_is_a_400_naming_its_own():
    t = {"name": "bogus", "shape": [3, 1], "datatype": "BYTES", "data": ["aGk="] * 3}
    with pytest.raises(InvalidInput) as info:
        te.parse(json.dumps({"inputs": [t]}).encode(), None, OUTS, 8)
    assert info.value.message == "unknown input 'bogus'; the model's inputs: image_bytes"
    assert info.value.fields == {"input": "bogus", "inputs": ["image_bytes"]}
    body, hl = binary_body(images(), outputs=[{"name": "bogus"}])
    with pytest.raises(InvalidInput) as info:
        te.parse(body, hl, OUTS, 8)
    assert (
        info.value.message == "unknown output 'bogus'; the model's outputs: logits, probabilities"
    )
    assert info.value.fields["outputs"] == list(OUTS)


def test_truncated_or_padded_binary_data_is_a_400():
    body, hl = binary_body(images())
    head = json.loads(body[:hl])
    for data, message in (
        (body[hl:-5], "runs past|ends before"),
        (body[hl:] + b"xx", "past the shape"),
    ):
        head["inputs"][0]["parameters"]["binary_data_size"] = len(data)
        h = json.dumps(head).encode()
        with pytest.raises(InvalidInput, match=message):
            te.parse(h + data, len(h), OUTS, 8)


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=64), st.integers(1, 4))
def test_any_binary_part_parses_or_is_a_400(junk, n):
    head = {
        "inputs": [
            {
                "name": te.INPUT,
                "shape": [n, 1],
                "datatype": "BYTES",
                "parameters": {"binary_data_size": len(junk)},
            }
        ]
    }
    h = json.dumps(head).encode()
    try:
        req = te.parse(h + junk, len(h), OUTS, 8)
    except InvalidInput:
        return
    assert len(req.images) == n and sum(4 + len(b) for b in req.images) == len(junk)


def test_every_image_is_checked_and_the_bad_row_named():
    good = images()
    target = Target(8, 8, 1, "stretch")

    def check(d):
        return plan_decode(d, None, target, 1 << 24, 1 << 28)

    te.checked(good, check)
    with pytest.raises(UnsupportedMediaType) as e:
        te.checked([*good, b"GIF89a not an image"], check)
    assert e.value.fields["element"] == 3


def test_views_metadata_and_merge():
    assert te.views(["digits", "resnet50", "resnet50_encoded"]) == {
        "digits_encoded": "digits",  # (resnet50_encoded is a model of its own)
        "resnet50_encoded_encoded": "resnet50_encoded",
    }
    meta = {"name": "digits", "inputs": [{"name": "image"}], "outputs": [{"name": "logits"}]}
    view = te.metadata("digits_encoded", meta)
    assert view["inputs"] == [{"name": te.INPUT, "datatype": "BYTES", "shape": [-1, 1]}]
    assert view["outputs"] == meta["outputs"] and meta["name"] == "digits"
    rows = [
        {
            "outputs": {"logits": np.full((1, 3), i, np.float32)},
            "timings_ms": {"total": float(i), "gpu": 1.0},
            "batch_size": i,
            "random_weights": False,
        }
        for i in (1, 4, 2)
    ]

    def futures(values):
        loop = asyncio.get_running_loop()
        out = [loop.create_future() for _ in values]
        for f, v in zip(out, values, strict=True):
            if isinstance(v, BaseException):
                f.set_exception(v)
            elif v is not None:
                f.set_result(v)
        return out

    async def ok():
        return await te.answer(
            futures(rows), lambda r: {**r, "timings_ms": {**r["timings_ms"], "done": 1}}
        )

    out = asyncio.run(ok())
    np.testing.assert_array_equal(out["outputs"]["logits"][:, 0], [1, 4, 2])
    assert out["timings_ms"] == {"total": 4.0, "gpu": 1.0, "done": 1} and out["batch_size"] == 4

    shared = InvalidInput("bad image")  # a group's failure: every item of it has this one

    async def failing():
        futs = futures([rows[0], shared, None])  # the last still out
        try:
            await te.answer(futs)
        finally:
            assert futs[2].cancelled()  # withdrawn: a failed request costs no more work

    with pytest.raises(InvalidInput) as e:
        asyncio.run(failing())
    assert e.value.fields["element"] == 1
    assert "element" not in shared.fields  # another request's answer names its own row
