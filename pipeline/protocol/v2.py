"""The Open Inference Protocol (KServe v2) over HTTP: JSON tensors and the binary tensor
data extension (``Inference-Header-Content-Length``). Pure functions, no Ray, no web
framework. Client bytes become numpy arrays with ``np.frombuffer``: nothing is unpickled.

A request carries the model's *own* input tensor, by its name, datatype and shape, as
Triton's do (FP32 NCHW for a torchvision model, UINT8 NHWC for the built-ins), and gets
back every output by its own name -- plus ``probabilities``, the softmax of a classifier's
first output. An input or output name the model does not have is a 400 that lists the
names it has. The specs come from the loaded engine (``Signature``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.engines.base import TensorInfo
from pipeline.errors import InvalidInput

from .validate import element_count, json_loads, object_list, optional_str, params_of, shape_of

HEADER_LEN = "inference-header-content-length"

DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
NAMES = {v.name: k for k, v in DTYPES.items()}
PIXELS_AS = ("FP16", "FP32", "FP64")  # also taken for a UINT8 input, values in [0, 255]
PROBABILITIES = "probabilities"


@dataclass(frozen=True)
class Signature:
    """A model's own tensors, as its engine declares them (batch dimension -1)."""

    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]

    @property
    def output_names(self) -> tuple[str, ...]:
        """Every output a request may ask for: the model's own, and ``probabilities`` for a
        classifier ([N, classes] first output) that has no output of that name."""
        own = tuple(o.name for o in self.outputs)
        if len(self.outputs[0].shape) == 2 and PROBABILITIES not in own:
            return (*own, PROBABILITIES)
        return own

    @classmethod
    def of(cls, engine: Any) -> Signature:
        return cls(tuple(engine.inputs), tuple(engine.outputs))


@dataclass
class InferRequest:
    id: str | None
    images: np.ndarray  # the model's own input tensor [N, ...], validated against it
    outputs: tuple[str, ...]
    binary_outputs: frozenset[str]


def split_body(body: bytes, header_length: int | None) -> tuple[bytes, memoryview]:
    """The JSON header and the binary part of a body (binary tensor data extension)."""
    if header_length is None:
        return body, memoryview(b"")
    if header_length < 0 or header_length > len(body):
        raise InvalidInput(
            "Inference-Header-Content-Length exceeds the body",
            header_length=header_length,
            body_bytes=len(body),
        )
    return body[:header_length], memoryview(body)[header_length:]


def binary_size(params: dict[str, Any], binary: memoryview) -> int:
    """An input's ``binary_data_size``, which must be the whole binary part (one input)."""
    size = params["binary_data_size"]
    if type(size) is not int or size != len(binary):
        raise InvalidInput(
            "binary_data_size does not match the binary part of the body",
            binary_data_size=size,
            binary_bytes=len(binary),
        )
    return size


def parse_infer(
    body: bytes, header_length: int | None, sig: Signature, max_batch: int
) -> InferRequest:
    """Decode a v2 infer request (JSON, and the binary tensor extension) and check it against
    the model's own input tensor."""
    head, binary = split_body(body, header_length)
    req = json_loads(head)
    names = [i.name for i in sig.inputs]
    if (
        not isinstance(req, dict)
        or not isinstance(req.get("inputs"), list)
        or len(req["inputs"]) != 1
    ):
        raise InvalidInput("a request needs exactly one input tensor", inputs=names)
    t = object_list(req["inputs"], "inputs", 1, 1)[0]
    shape, dt_name, own_dt = input_spec(t.get("name"), t.get("datatype"), t.get("shape"), sig)
    params = params_of(t, "inputs[0]")
    if "binary_data_size" in params:
        binary_size(params, binary)
        arr = from_bytes(binary, shape, dt_name)
    else:
        data = t.get("data")
        if data is None:
            raise InvalidInput("input has neither data nor binary_data_size")
        if not isinstance(data, list):
            raise InvalidInput("input data must be a list", got=type(data).__name__)
        arr = from_values(data, shape, dt_name)
    outputs, binary_out = requested(req.get("outputs"), sig.output_names)
    rid = optional_str(req.get("id"), "id")
    return InferRequest(rid, model_input(arr, own_dt, sig, max_batch), outputs, binary_out)


def input_spec(name: Any, datatype: Any, shape: Any, sig: Signature) -> tuple[tuple, str, str]:
    """What a request says of its one input, checked against the model's own: a name it has,
    a shape (``validate.shape_of``), a datatype the protocol knows and the input takes;
    (shape, the datatype, the model's own datatype). Every transport's parser calls this."""
    check_name("input", name, [i.name for i in sig.inputs])
    shape = shape_of(shape, "input")
    if not isinstance(datatype, str) or datatype not in DTYPES:
        raise InvalidInput("unknown or unsupported datatype", datatype=datatype)
    own_dt = NAMES[np.dtype(sig.inputs[0].dtype).name]
    if datatype != own_dt and not (own_dt == "UINT8" and datatype in PIXELS_AS):
        raise InvalidInput(
            "datatype does not match the model's input", datatype=datatype, expected=own_dt
        )
    return shape, datatype, own_dt


def from_bytes(raw: bytes | memoryview, shape: tuple, dt_name: str) -> np.ndarray:
    """An input's values from its raw little-endian bytes (a 400 where their count does not
    match the shape and datatype); no copy."""
    dt = DTYPES[dt_name]
    count = element_count(shape)
    if len(raw) != count * dt.itemsize:
        raise InvalidInput(
            "byte count does not match the shape and datatype",
            bytes=len(raw),
            expected=count * dt.itemsize,
            shape=shape,
            datatype=dt_name,
        )
    return np.frombuffer(raw, dtype=dt, count=count).reshape(shape)


def from_values(data: Any, shape: tuple, dt_name: str) -> np.ndarray:
    """An input's values from a list of numbers (JSON ``data``, gRPC's typed contents); a 400
    where they do not fit the datatype or their count does not match the shape."""
    try:
        arr = np.asarray(data, dtype=DTYPES[dt_name])
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise InvalidInput(
            "input data does not fit its datatype", datatype=dt_name, detail=str(exc)[:200]
        ) from None
    if arr.size != element_count(shape):
        raise InvalidInput(
            "number of elements does not match the shape", elements=int(arr.size), shape=shape
        )
    return arr.reshape(shape)


def model_input(arr: np.ndarray, own_dt: str, sig: Signature, max_batch: int) -> np.ndarray:
    """An input's values as the model takes them: its shape but the batch the model's, a
    batch of 1 to ``max_batch`` rows, numbers sent for a UINT8 input rounded to pixels."""
    shape, want = arr.shape, tuple(sig.inputs[0].shape[1:])
    if len(shape) != len(sig.inputs[0].shape) or tuple(shape[1:]) != want:
        raise InvalidInput(
            "input shape does not match the model's input", shape=shape, expected=[-1, *want]
        )
    if not 1 <= shape[0] <= max_batch:
        raise InvalidInput("batch size out of range", batch=shape[0], max_batch=max_batch)
    if own_dt == "UINT8" and arr.dtype != np.uint8:
        arr = _as_pixels(arr)
    return np.ascontiguousarray(arr)


def _as_pixels(arr: np.ndarray) -> np.ndarray:
    """Numbers sent for a uint8 image input, checked to be pixels and rounded to uint8."""
    f = arr.astype(np.float64)
    if not np.isfinite(f).all():
        raise InvalidInput("input contains NaN or infinity")
    if f.min() < 0 or f.max() > 255:
        raise InvalidInput(
            "pixel values must lie in [0, 255]", min=float(f.min()), max=float(f.max())
        )
    return np.rint(f).astype(np.uint8)


def check_name(kind: str, name: Any, names: list[str] | tuple[str, ...]) -> str:
    """``name`` if the model has an input (``kind`` "input") or output of that name; else a
    400 that lists the names it has, as Triton's "unexpected inference input" does."""
    if isinstance(name, str) and name in names:
        return name
    shown = (
        repr(name[:64]) if isinstance(name, str) else "(no name)" if name is None else "(no string)"
    )
    raise InvalidInput(
        f"unknown {kind} {shown}; the model's {kind}s: {', '.join(names)}",
        **{kind: str(name)[:64], f"{kind}s": list(names)},
    )


def requested(spec: Any, known: tuple[str, ...]) -> tuple[tuple[str, ...], frozenset[str]]:
    if spec is None:  # every output
        return known, frozenset()
    names, binary = [], set()
    for i, o in enumerate(object_list(spec, "outputs", 1, max(1, len(known)) * 4)):
        name = check_name("output", o.get("name"), known)
        names.append(name)
        if params_of(o, f"outputs[{i}]").get("binary_data"):
            binary.add(name)
    return tuple(names), frozenset(binary)


def _tensor(t: TensorInfo) -> dict[str, Any]:
    return {"name": t.name, "datatype": NAMES[np.dtype(t.dtype).name], "shape": list(t.shape)}


def model_metadata(name: str, sig: Signature, platform: str = "ferry") -> dict[str, Any]:
    """The model's real specs: its own inputs and outputs (and ``probabilities``)."""
    outs = [_tensor(o) for o in sig.outputs]
    if PROBABILITIES in sig.output_names and all(o.name != PROBABILITIES for o in sig.outputs):
        first = sig.outputs[0]
        outs.append({"name": PROBABILITIES, "datatype": "FP32", "shape": list(first.shape)})
    return {
        "name": name,
        "versions": ["1"],
        "platform": platform,
        "inputs": [_tensor(i) for i in sig.inputs],
        "outputs": outs,
    }
