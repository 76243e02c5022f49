"""Encoded images (JPEG, PNG) as v2 BYTES tensors, Triton's way: a model of its own.

A Triton user who sends encoded JPEGs sends them to a model that takes them -- a DALI
ensemble in front of the network, with its own name and a ``TYPE_STRING`` input. Ferry
does the same: every image model ``M`` also answers v2 as ``M_encoded``, whose one input,
``image_bytes``, is BYTES of shape ``[-1, 1]`` (one encoded image a row) and whose outputs
are ``M``'s. (Two inputs on one model would not do: ``perf_analyzer`` sends random data to
every input a model lists, and random bytes are no image.)

* Binary tensor data (tritonclient's ``binary_data=True``, perf_analyzer): each element is
  a 4-byte little-endian length and that many bytes -- the image file itself.
* JSON: each element is a string, and a JPEG is no UTF-8 string, so Ferry reads it as the
  image's standard base64 (``base64.b64encode(jpeg).decode()``).

Each image is checked from its header (``imaging.plan_decode``: 400/413/415 before any
decoding) and goes through exactly the path of ``POST /v1/models/M/classify``: the same
coalescer, decode plan and preprocessing (GPU decode where configured), batched with the
other requests of ``M``. Pure functions here; the ingress wires the route.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import copy
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.errors import FerryError, InvalidInput

from . import v2
from .validate import json_loads, object_list, optional_str, params_of, shape_of

SUFFIX = "_encoded"
INPUT = "image_bytes"


def views(models: Iterable[str]) -> dict[str, str]:
    """Each encoded view's name -> its model (none where a model already has that name)."""
    names = set(models)
    return {m + SUFFIX: m for m in names if m + SUFFIX not in names}


def metadata(view: str, model_meta: dict[str, Any]) -> dict[str, Any]:
    """The view's v2 metadata: the model's outputs, one BYTES input."""
    meta = copy.deepcopy(model_meta)
    meta["name"] = view
    meta["inputs"] = [{"name": INPUT, "datatype": "BYTES", "shape": [-1, 1]}]
    return meta


@dataclass
class EncodedRequest:
    id: str | None
    images: list[bytes]  # one encoded file a row
    outputs: tuple[str, ...]
    binary_outputs: frozenset[str]
    params: dict[str, Any] = field(default_factory=dict)  # the request's own ``parameters``


def elements(binary: memoryview, n: int) -> list[bytes]:
    """BYTES serialised as Triton does (the binary extension's part, gRPC's
    ``raw_input_contents``): ``n`` of (4-byte little-endian length, bytes)."""
    out, at = [], 0
    for i in range(n):
        if at + 4 > len(binary):
            raise InvalidInput("BYTES tensor ends before its elements", element=i, elements=n)
        size = int.from_bytes(binary[at : at + 4], "little")
        at += 4
        if at + size > len(binary):
            raise InvalidInput("BYTES element runs past the binary data", element=i, length=size)
        out.append(bytes(binary[at : at + size]))
        at += size
    if at != len(binary):
        raise InvalidInput(
            "binary data has bytes past the shape's elements", extra_bytes=len(binary) - at
        )
    return out


def _from_json(data: Any, n: int) -> list[bytes]:
    """BYTES in JSON: ``n`` base64 strings (a flat list, or one list a row)."""
    if not isinstance(data, list):
        raise InvalidInput("input data must be a list", got=type(data).__name__)
    flat = [e[0] if isinstance(e, list) and len(e) == 1 else e for e in data]
    if len(flat) != n:
        raise InvalidInput(
            "number of elements does not match the shape", elements=len(flat), rows=n
        )
    out = []
    for i, e in enumerate(flat):
        if not isinstance(e, str):
            raise InvalidInput("BYTES elements in JSON are strings", element=i)
        try:
            out.append(base64.b64decode(e, validate=True))
        except (binascii.Error, ValueError):
            raise InvalidInput(
                "BYTES elements in JSON are an image file in base64 (binary_data sends it raw)",
                element=i,
            ) from None
    return out


def parse(
    body: bytes, header_length: int | None, output_names: tuple[str, ...], max_images: int
) -> EncodedRequest:
    """A v2 infer request to an encoded view (JSON, and the binary tensor extension): its
    images, as the client sent them."""
    head, binary = v2.split_body(body, header_length)
    req = json_loads(head)
    if not isinstance(req, dict) or not isinstance(req.get("inputs"), list):
        raise InvalidInput("a request needs exactly one input tensor", inputs=[INPUT])
    t = object_list(req["inputs"], "inputs", 1, 1)[0]
    n = input_rows(t.get("name"), t.get("datatype"), t.get("shape"), max_images)
    params = params_of(t, "inputs[0]")
    if "binary_data_size" in params:
        v2.binary_size(params, binary)
        images = elements(binary, n)
    else:
        if t.get("data") is None:
            raise InvalidInput("input has neither data nor binary_data_size")
        images = _from_json(t["data"], n)
    outputs, binary_out = v2.requested(req.get("outputs"), output_names)
    rid = optional_str(req.get("id"), "id")
    return EncodedRequest(rid, images, outputs, binary_out, params_of(req, "request"))


def input_rows(name: Any, datatype: Any, shape: Any, max_images: int) -> int:
    """What a request says of the view's one input, checked (its name, BYTES, a shape of
    ``[N, 1]`` or ``[N]``, 1 to ``max_images`` rows): N. Every transport's parser calls this."""
    v2.check_name("input", name, [INPUT])
    if datatype != "BYTES":
        raise InvalidInput(
            "this model takes encoded images as BYTES (its model without the suffix "
            f"{SUFFIX!r} takes tensors)",
            datatype=str(datatype)[:16],
            expected="BYTES",
        )
    shape = shape_of(shape, "input")
    if len(shape) not in (1, 2) or (len(shape) == 2 and shape[1] != 1):
        raise InvalidInput("input shape must be [N, 1] (or [N])", shape=list(shape))
    n = shape[0]
    if not 1 <= n <= max_images:
        raise InvalidInput("batch size out of range", batch=n, max_batch=max_images)
    return n


def checked(images: list[bytes], check: Callable[[bytes], Any]) -> list[Any]:
    """``check`` (the header and decode plan) on every image, its results in row order; its
    error names the row."""
    out = []
    for i, data in enumerate(images):
        try:
            out.append(check(data))
        except FerryError as exc:
            exc.fields.setdefault("element", i)
            raise
    return out


async def answer(
    futures: list[asyncio.Future], finish: Callable[[Any], dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The answers of a request's images (one future an image, the classify path's
    ``Coalescer.submit_many``), each made by ``finish`` the answer ``merge`` reads (the
    ingress's ``Answer.body``), merged row for row. The first
    failure fails the request, naming its row, and withdraws the rows not yet answered:
    a refused request does not keep costing work."""
    try:
        await asyncio.wait(futures, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for f in futures:
            f.cancel()  # (no-op on those done)
    first: BaseException | None = None
    for i, f in enumerate(futures):
        exc = None if f.cancelled() else f.exception()  # (every failure retrieved)
        if exc is not None and first is None:
            if isinstance(exc, FerryError):  # (a copy: a group's failure is every item's)
                exc = copy.copy(exc)
                exc.fields.setdefault("element", i)
            first = exc
    if first is not None:
        raise first
    results = [f.result() for f in futures]
    if finish is not None:
        results = [finish(r) for r in results]
    return merge(results)


# A model of the tasks beyond classify answers its view with one BYTES output, a row an
# image: the encoded image, the mask's PNG (or its areas' JSON), the boxes' JSON. In JSON
# (not binary_data) an image or a mask is its base64, as the view's input reads one.
TASK_OUTPUT = {"image": "image", "segment": "mask", "detect": "boxes"}
TASK_PARAMS = ("quality", "size", "format", "score_threshold", "iou_threshold", "max_boxes")


def task_metadata(view: str, model_meta: dict[str, Any], kind: str) -> dict[str, Any]:
    """The view's v2 metadata for a model of task ``kind``: its one BYTES output."""
    meta = metadata(view, model_meta)
    meta["outputs"] = [{"name": TASK_OUTPUT[kind], "datatype": "BYTES", "shape": [-1, 1]}]
    return meta


def task_query(params: dict[str, Any]) -> tuple[dict[str, str], str | None]:
    """The task options among a request's ``parameters``, as a query's strings, and its
    ``accept`` (the media type of an image answer); Triton's own parameters pass by."""
    query = {k: str(v) for k, v in params.items() if k in TASK_PARAMS}
    accept = params.get("accept")
    return query, accept if isinstance(accept, str) else None


def task_outputs(kind: str, body: dict[str, Any], binary: frozenset[str]) -> dict[str, Any]:
    """One image's answer (``Answer.body``) as the view's output row, for ``merge``."""
    name = TASK_OUTPUT[kind]
    data = body.get("media")
    if data is None:
        data = json.dumps(body.get("result"), separators=(",", ":")).encode()
    elif name not in binary:
        data = base64.b64encode(data)
    row = np.empty((1, 1), dtype=object)
    row[0, 0] = data
    return {**body, "outputs": {name: row}}


def merge(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One answer of many single-row ones: outputs stacked, each timing the slowest row's,
    the largest GPU batch any row rode in."""
    names = results[0]["outputs"].keys()
    timings: dict[str, float] = {}
    for r in results:
        for k, v in r["timings_ms"].items():
            if isinstance(v, int | float):
                timings[k] = max(timings.get(k, v), v)
    return {
        "outputs": {k: np.concatenate([r["outputs"][k] for r in results]) for k in names},
        "timings_ms": timings,
        "batch_size": max(r["batch_size"] for r in results),
        "random_weights": any(r["random_weights"] for r in results),
    }
