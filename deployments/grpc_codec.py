"""The Open Inference Protocol's protobuf messages to and from Ferry's typed requests and
answers: the gRPC half of what ``pipeline/protocol`` does for JSON, built from the same
pieces (``v2.input_spec``, ``from_bytes``, ``from_values``, ``model_input``,
``encoded.input_rows``, ``triton.options``, ``output_tensor``, ``raw_bytes``), so a tensor
is checked by one set of rules whichever way it came. Pure functions; the messages are
tritonclient's (``deployments/grpc_proxy.py`` says why).

* An input tensor comes as ``raw_input_contents`` (what ``tritonclient.grpc`` and
  ``perf_analyzer`` send: little-endian values, or for BYTES each element as a 4-byte
  length and its bytes) or in its datatype's typed ``contents`` field (``CONTENTS``).
* Every output goes back as ``raw_output_contents``, FP32 or (classification) BYTES.
* Parameters (``priority``, ``timeout``, an output's ``classification``) are read from
  whichever ``InferParameter`` field the client set.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message
from tritonclient.grpc import service_pb2 as pb

from pipeline.errors import InvalidInput
from pipeline.protocol import encoded, triton, v2
from pipeline.protocol.validate import optional_str

# KServe v2's typed contents field of each datatype; FP16 has none (raw only)
CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def param_value(p: pb.InferParameter) -> Any:
    """An ``InferParameter``'s value, from whichever of its fields is set (None: none)."""
    which = p.WhichOneof("parameter_choice")
    return None if which is None else getattr(p, which)


def params_of(params: Any) -> dict[str, Any]:
    """A ``parameters`` map as plain values."""
    return {k: param_value(v) for k, v in params.items()}


def options(request: pb.ModelInferRequest, now: float) -> triton.RequestOptions:
    """The request's ``priority``, ``timeout`` and its outputs' ``classification``."""
    outputs = [(o.name, params_of(o.parameters)) for o in request.outputs]
    return triton.options(params_of(request.parameters), outputs, now)


def _one_input(request: pb.ModelInferRequest, names: list[str]) -> tuple[Any, bytes | None]:
    """The request's one input tensor and its raw contents (None: in ``contents``)."""
    if len(request.inputs) != 1:
        raise InvalidInput("a request needs exactly one input tensor", inputs=names)
    if len(request.raw_input_contents) > 1:
        raise InvalidInput(
            "raw_input_contents must hold one entry, the one input's",
            entries=len(request.raw_input_contents),
        )
    t = request.inputs[0]
    raw = request.raw_input_contents[0] if request.raw_input_contents else None
    if raw is not None and t.HasField("contents"):
        raise InvalidInput("input has both raw_input_contents and contents")
    return t, raw


def _requested(request: pb.ModelInferRequest, known: tuple[str, ...]) -> tuple[str, ...]:
    """The outputs asked for by name (none named: every output)."""
    spec = [{"name": o.name} for o in request.outputs] or None
    return v2.requested(spec, known)[0]


def parse_infer(
    request: pb.ModelInferRequest, sig: v2.Signature, max_batch: int
) -> v2.InferRequest:
    """A ``ModelInferRequest`` of a model's own tensor, checked as ``v2.parse_infer`` checks
    an HTTP one."""
    t, raw = _one_input(request, [i.name for i in sig.inputs])
    shape, dt_name, own_dt = v2.input_spec(t.name, t.datatype, list(t.shape), sig)
    if raw is not None:
        arr = v2.from_bytes(raw, shape, dt_name)
    elif dt_name not in CONTENTS:
        raise InvalidInput(
            f"{dt_name} has no typed contents field: send it as raw_input_contents",
            datatype=dt_name,
        )
    else:
        arr = v2.from_values(list(getattr(t.contents, CONTENTS[dt_name])), shape, dt_name)
    arr = v2.model_input(arr, own_dt, sig, max_batch)
    outputs = _requested(request, sig.output_names)
    return v2.InferRequest(optional_str(request.id or None, "id"), arr, outputs, frozenset())


def parse_encoded(
    request: pb.ModelInferRequest, output_names: tuple[str, ...], max_images: int
) -> encoded.EncodedRequest:
    """A ``ModelInferRequest`` to an encoded view: its image files, as ``encoded.parse``
    reads an HTTP one (``bytes_contents`` holds each file as it is: no base64)."""
    t, raw = _one_input(request, [encoded.INPUT])
    n = encoded.input_rows(t.name, t.datatype, list(t.shape), max_images)
    if raw is not None:
        images = encoded.elements(memoryview(raw), n)
    else:
        images = list(t.contents.bytes_contents)
        if len(images) != n:
            raise InvalidInput(
                "number of elements does not match the shape", elements=len(images), rows=n
            )
    outputs = _requested(request, output_names)
    # every output rides raw (raw_output_contents): an image answer is its bytes, no base64;
    # the request's parameters carry a task view's options, as over HTTP
    rid = optional_str(request.id or None, "id")
    return encoded.EncodedRequest(
        rid, images, outputs, frozenset(output_names), params_of(request.parameters)
    )


def set_param(p: pb.InferParameter, value: Any) -> None:
    """``p`` holding ``value`` (a flat parameter: bool, int, float or string)."""
    if isinstance(value, bool):
        p.bool_param = value
    elif isinstance(value, int):
        p.int64_param = value
    elif isinstance(value, float):
        p.double_param = value
    else:
        p.string_param = str(value)


def infer_response(
    model: str, request_id: str | None, outputs: dict[str, Any], params: dict[str, Any]
) -> pb.ModelInferResponse:
    """A v2 answer as ``ModelInferResponse``: every output in ``raw_output_contents`` (in the
    order of ``outputs``), Ferry's parameters flat."""
    resp = pb.ModelInferResponse(
        model_name=model, model_version=triton.VERSION, id=request_id or ""
    )
    for k, v in triton.flat(params).items():
        set_param(resp.parameters[k], v)
    for name, given in outputs.items():
        datatype, arr = triton.output_tensor(given)
        resp.outputs.add(name=name, datatype=datatype, shape=list(arr.shape))
        resp.raw_output_contents.append(triton.raw_bytes(datatype, arr))
    return resp


def message(cls: type[Message], value: dict[str, Any]) -> Message:
    """A protobuf message of ``cls`` from the JSON answer the HTTP route gives (metadata,
    configuration, statistics, the repository index): one source for both protocols. Keys
    the message has no field for (``versions`` of a configuration) are dropped."""
    return json_format.ParseDict(value, cls(), ignore_unknown_fields=True)
