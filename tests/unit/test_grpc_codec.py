"""The gRPC front without Ray: tritonclient's stubs beside Ray Serve on one protobuf, the
protobuf messages to and from Ferry's typed requests (the same checks as HTTP's), and the
client's deadline carried through Serve's own gRPC server (a real one, on loopback)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import time

import grpc
import numpy as np
import pytest
import tomllib
from tritonclient.grpc import model_config_pb2, service_pb2_grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import deserialize_bytes_tensor

from deployments import grpc_codec, grpc_proxy
from deployments.grpc_service import Call
from pipeline.engines.base import TensorInfo
from pipeline.errors import InvalidInput
from pipeline.protocol import triton, v2

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DIGITS = v2.Signature(
    (TensorInfo("image", "uint8", (-1, 8, 8, 1)),),
    (TensorInfo("logits", "float32", (-1, 10)),),
)


def test_tritonclient_grpc_and_ray_serve_import_together_on_protobuf_7():
    """tritonclient[grpc] pins protobuf below 7, Ray Serve 2.60 (grpcio-reflection) needs
    7.35 or later: the project installs tritonclient without that extra, and both work."""
    import google.protobuf
    import tritonclient.grpc as tg
    from ray import serve

    major, minor = (int(p) for p in google.protobuf.__version__.split(".")[:2])
    assert (major, minor) >= (7, 35), google.protobuf.__version__
    assert serve.start and tg.InferenceServerClient


def test_the_install_never_asks_for_tritonclients_grpc_extra():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    wanted = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        wanted += extra
    tritonclient = [w for w in wanted if w.startswith("tritonclient")]
    assert any(w.startswith("tritonclient>=") for w in project["dependencies"])
    for w in tritonclient:
        extras = re.findall(r"\[([^\]]*)\]", w)
        assert not any({"grpc", "all"} & {e.strip() for e in x.split(",")} for x in extras), w


def request(x: np.ndarray, datatype: str = "UINT8", raw: bool = True) -> pb.ModelInferRequest:
    req = pb.ModelInferRequest(model_name="digits", id="r1")
    t = req.inputs.add(name="image", datatype=datatype, shape=list(x.shape))
    if raw:
        req.raw_input_contents.append(x.tobytes())
    else:
        t.contents.uint_contents.extend(int(v) for v in x.ravel())
    return req


def test_raw_and_typed_contents_parse_to_the_same_tensor():
    x = np.arange(2 * 64, dtype=np.uint8).reshape(2, 8, 8, 1)
    for raw in (True, False):
        got = grpc_codec.parse_infer(request(x, raw=raw), DIGITS, 8)
        assert got.id == "r1" and got.outputs == ("logits", "probabilities")
        np.testing.assert_array_equal(got.images, x)
    pixels = request(x.astype(np.float32), "FP32")  # numbers for a UINT8 input: pixels
    np.testing.assert_array_equal(grpc_codec.parse_infer(pixels, DIGITS, 8).images, x)


@pytest.mark.parametrize(
    "change, says",
    [
        (lambda r: r.inputs[0].__setattr__("name", "bogus"), "unknown input 'bogus'"),
        (lambda r: r.inputs[0].__setattr__("datatype", "INT32"), "datatype does not match"),
        (lambda r: r.inputs[0].shape.__setitem__(2, 9), "byte count does not match"),
        (lambda r: r.raw_input_contents.append(b"x"), "one entry"),
        (lambda r: r.inputs[0].contents.uint_contents.append(1), "both raw_input_contents"),
        (lambda r: r.outputs.add(name="nope"), "unknown output 'nope'"),
        (lambda r: r.inputs.add(name="image"), "exactly one input tensor"),
    ],
)
def test_a_bad_message_is_refused_as_http_refuses_its_json(change, says):
    req = request(np.zeros((1, 8, 8, 1), np.uint8))
    change(req)
    with pytest.raises(InvalidInput, match=says):
        grpc_codec.parse_infer(req, DIGITS, 8)


def test_typed_contents_must_fit_the_datatype_and_fp16_has_none():
    req = pb.ModelInferRequest(model_name="digits")
    t = req.inputs.add(name="image", datatype="UINT8", shape=[1, 8, 8, 1])
    t.contents.uint_contents.extend([300] * 64)  # no uint8
    with pytest.raises(InvalidInput, match="does not fit its datatype"):
        grpc_codec.parse_infer(req, DIGITS, 8)
    t.datatype = "FP16"
    with pytest.raises(InvalidInput, match="FP16 has no typed contents"):
        grpc_codec.parse_infer(req, DIGITS, 8)


def test_encoded_images_come_raw_or_as_bytes_contents():
    blobs = [b"\xff\xd8one", b"\x89PNGtwo"]
    raw = pb.ModelInferRequest(model_name="digits_encoded")
    raw.inputs.add(name="image_bytes", datatype="BYTES", shape=[2, 1])
    raw.raw_input_contents.append(b"".join(len(b).to_bytes(4, "little") + b for b in blobs))
    typed = pb.ModelInferRequest(model_name="digits_encoded")
    typed.inputs.add(
        name="image_bytes", datatype="BYTES", shape=[2]
    ).contents.bytes_contents.extend(blobs)
    for req in (raw, typed):
        assert grpc_codec.parse_encoded(req, ("logits",), 8).images == blobs
    typed.inputs[0].shape[0] = 3
    with pytest.raises(InvalidInput, match="number of elements"):
        grpc_codec.parse_encoded(typed, ("logits",), 8)


def test_options_read_whichever_parameter_field_the_client_set():
    req = request(np.zeros((1, 8, 8, 1), np.uint8))
    req.parameters["priority"].uint64_param = 1
    req.parameters["timeout"].int64_param = 2_000_000
    req.outputs.add(name="logits").parameters["classification"].int64_param = 3
    opts = grpc_codec.options(req, now=100.0)
    assert opts == triton.RequestOptions(True, 102.0, {"logits": 3})
    req.parameters["timeout"].string_param = "soon"
    with pytest.raises(InvalidInput, match="parameters.timeout"):
        grpc_codec.options(req, now=100.0)


def test_the_answer_carries_every_output_raw_and_parameters_flat():
    probs = np.array([[0.25, 0.75]], np.float32)
    top = triton.classify(probs, 1, str)
    resp = grpc_codec.infer_response(
        "digits",
        "r1",
        {"probabilities": probs, "top": top},
        {"random_weights": False, "batch_size": 4, "timings_ms": {"total": 1.5}},
    )
    assert resp.id == "r1" and resp.model_version == "1"
    assert [(o.name, o.datatype, list(o.shape)) for o in resp.outputs] == [
        ("probabilities", "FP32", [1, 2]),
        ("top", "BYTES", [1, 1]),
    ]
    np.testing.assert_array_equal(np.frombuffer(resp.raw_output_contents[0], "<f4"), probs[0])
    assert deserialize_bytes_tensor(resp.raw_output_contents[1])[0] == b"0.750000:1:1"
    p = resp.parameters
    assert p["random_weights"].bool_param is False and p["batch_size"].int64_param == 4
    assert p["timings_ms.total"].double_param == 1.5


def test_the_http_configuration_json_is_the_grpc_message():
    meta = v2.model_metadata("digits", DIGITS)
    cfg = triton.model_config("digits", meta, "native", 16, (1, 2, 4), 5.0, 1000.0, 64)
    msg = grpc_codec.message(model_config_pb2.ModelConfig, cfg)
    assert msg.max_batch_size == 16 and list(msg.input[0].dims) == [8, 8, 1]
    assert msg.input[0].data_type == model_config_pb2.TYPE_UINT8
    q = msg.dynamic_batching.default_queue_policy
    assert q.default_timeout_microseconds == 1_000_000 and q.max_queue_size == 64


class Context:
    def __init__(self, metadata):
        self.metadata = metadata

    def invocation_metadata(self):
        return self.metadata


def test_a_calls_deadline_is_its_own_or_x_deadline_ms_whichever_is_first():
    own_deadline = time.time() + 3600
    own = (grpc_proxy.DEADLINE_KEY, f"{own_deadline:.6f}")
    call = Call("ModelInfer", Context([own, ("x-deadline-ms", "1000")]))
    before = time.time()
    got = call.deadline(None)
    assert before + 1 <= got <= time.time() + 1  # x-deadline-ms's 1 s: the earlier
    assert Call("ModelInfer", Context([own])).deadline(None) == pytest.approx(own_deadline)
    assert Call("ModelInfer", Context([])).deadline(None) is None
    before = time.time()
    assert Call("ModelInfer", Context([])).deadline(3000.0) >= before + 3  # the default
    assert Call("ModelInfer", Context([("x-request-id", "abc")])).request_id == "abc"


class StandIn:
    """The servicer Serve hands the add function: its methods are never called (Serve's
    factory makes every handler)."""

    def __getattr__(self, name):
        return None


def test_the_clients_deadline_reaches_the_handler_through_serves_grpc_server():
    """Serve's own gRPC server (``gRPCGenericServer``, as its proxy runs it), the service
    added by ``add_inference_service``: each handler Serve's factory makes is handed the
    call's deadline as metadata, and a client's own entry of that name is dropped."""
    from ray.serve._private.grpc_util import gRPCGenericServer

    def factory(service_method, streaming_type):
        async def handler(request, context):
            seen = [list(m) for m in context.invocation_metadata()]
            return pb.ModelMetadataResponse(name=json.dumps(seen)).SerializeToString()

        return handler

    async def main():
        server = gRPCGenericServer(factory)
        grpc_proxy.add_inference_service(StandIn(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                call = service_pb2_grpc.GRPCInferenceServiceStub(ch).ModelMetadata
                forged = ((grpc_proxy.DEADLINE_KEY, "1.0"),)
                with_deadline = await call(pb.ModelMetadataRequest(), timeout=30, metadata=forged)
                without = await call(pb.ModelMetadataRequest(), metadata=forged)
        finally:
            await server.stop(0)
        return json.loads(with_deadline.name), json.loads(without.name), time.time()

    seen, without, now = asyncio.run(main())
    (deadline,) = [float(v) for k, v in seen if k == grpc_proxy.DEADLINE_KEY]
    # the client's 30 s, not the forged entry; the timeout as gRPC sends it, read against the
    # server's clock, can land a little past the client's (CI saw 94 ms): a second's slack
    assert now < deadline <= now + 31
    assert not [v for k, v in without if k == grpc_proxy.DEADLINE_KEY]
