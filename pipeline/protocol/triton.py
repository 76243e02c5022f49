"""The parts of the v2 protocol as Triton speaks it, beyond KServe's core: pure functions
and one small per-process statistics book, no Ray, no web framework.

* ``model_config``: Triton's model-configuration JSON (``GET /v2/models/{m}/config``), which
  ``perf_analyzer`` and ``tritonclient.get_model_config`` read: ``max_batch_size``, inputs and
  outputs with ``TYPE_*`` data types and ``dims`` without the batch dimension,
  ``dynamic_batching`` from Ferry's buckets and batch wait.
* ``Stats``: the statistics extension (``GET /v2/models/{m}/stats``, ``/v2/models/stats``):
  success and fail counts and cumulative nanoseconds of queue, compute_input (decoding and
  resizing), compute_infer (the GPU) and compute_output (softmax, top-k), per model. Each
  ingress replica keeps its own book; the routes answer the sum over replicas
  (``merge``, gathered by ``deployments/triton_stats.py``).
* ``request_options``: a request's ``parameters.priority`` (Triton: 1 is the highest level;
  it takes the high-priority lane) and ``parameters.timeout`` (microseconds; the request's
  deadline), and which outputs asked for ``parameters.classification`` (top-k).
* ``encode``: the response, FP32 and BYTES tensors (classification answers are BYTES
  ``"score:index:label"``), JSON or binary, with flat ``parameters`` (strings, numbers and
  booleans only, as the protocol allows).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.errors import InvalidInput, ModelNotFound

VERSION = "1"
EXTENSIONS = ("binary_tensor_data", "classification", "model_configuration", "statistics")
TYPES = {
    "BOOL": "TYPE_BOOL",
    "UINT8": "TYPE_UINT8",
    "UINT16": "TYPE_UINT16",
    "UINT32": "TYPE_UINT32",
    "UINT64": "TYPE_UINT64",
    "INT8": "TYPE_INT8",
    "INT16": "TYPE_INT16",
    "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64",
    "FP16": "TYPE_FP16",
    "FP32": "TYPE_FP32",
    "FP64": "TYPE_FP64",
    "BYTES": "TYPE_STRING",
}
# Ferry's stage timings (ms) -> Triton's statistics durations
STAGES = {
    "queue": "queue",
    "preprocess": "compute_input",
    "gpu": "compute_infer",
    "postprocess": "compute_output",
}


def check_version(model: str, version: str) -> None:
    """Every model has one version, "1"."""
    if version != VERSION:
        raise ModelNotFound("no such model version", model=model, version=version[:32])


def model_config(
    name: str,
    metadata: dict[str, Any],
    engine: str,
    max_batch_size: int,
    buckets: tuple[int, ...],
    max_wait_ms: float,
    queue_timeout_ms: float | None = None,
    max_queue_size: int = 0,
) -> dict[str, Any]:
    """Triton's configuration of a model from its v2 metadata (``v2.model_metadata``);
    ``queue_timeout_ms`` its queue-time budget (None: none; Triton's 0), ``max_queue_size``
    the scheduler's queue bound (0: none). A request's own
    ``parameters.timeout`` is its deadline (504), not an override of the budget."""

    def tensors(ts: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            {"name": t["name"], "data_type": TYPES[t["datatype"]], "dims": list(t["shape"][1:])}
            for t in ts
        ]

    return {
        "name": name,
        "platform": "ferry",
        "backend": engine,
        "versions": [VERSION],
        "max_batch_size": max_batch_size,
        "input": tensors(metadata["inputs"]),
        "output": tensors(metadata["outputs"]),
        "dynamic_batching": {
            "preferred_batch_size": list(buckets),
            "max_queue_delay_microseconds": int(round(max_wait_ms * 1e3)),
            "default_queue_policy": {
                "timeout_action": "REJECT",
                "default_timeout_microseconds": int(round((queue_timeout_ms or 0) * 1e3)),
                "allow_timeout_override": False,
                "max_queue_size": max_queue_size,
            },
        },
        "instance_group": [{"kind": "KIND_AUTO", "count": 1}],
    }


def model_control(model: str, action: str) -> None:
    """Ferry runs in Triton's model-control mode NONE: the models are the config's, loaded
    when the replicas start, the same on every replica. A load or unload is refused with a
    JSON error, as Triton refuses it in that mode (a new config is a ``serve deploy``)."""
    raise InvalidInput(
        f"explicit model {action} is not allowed: model control mode is NONE (the served "
        "models are the config's; change it and redeploy)",
        model=model[:64],
        action=action,
    )


def repository_index(
    models: list[str], refused: dict[str, str] | None = None
) -> list[dict[str, str]]:
    """Every model READY, but those ``refused`` at load: UNAVAILABLE, with the reason."""
    out = []
    for m in models:
        why = (refused or {}).get(m)
        row = {"name": m, "version": VERSION, "state": "READY" if why is None else "UNAVAILABLE"}
        out.append(row if why is None else {**row, "reason": why})
    return out


@dataclass
class _ModelBook:
    success: list[float] = field(default_factory=lambda: [0, 0.0])  # count, ns
    fail: list[float] = field(default_factory=lambda: [0, 0.0])
    durations: dict[str, list[float]] = field(
        default_factory=lambda: {v: [0, 0.0] for v in STAGES.values()}
    )
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0


class Stats:
    """Per-model counters of this process (the statistics extension)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._books: dict[str, _ModelBook] = {}
        # set by the ingress (deployments/triton_stats.py): told, at most every
        # ``publish_every_s``, that this book changed (it then publishes a copy, ``books``)
        self.publish: Any = None
        self.publish_every_s = 0.05
        # -inf: the first change tells at once, however young the clock (time.monotonic
        # counts from boot, and a fresh machine's is below an interval of an hour)
        self._published = float("-inf")

    def books(self) -> dict[str, _ModelBook]:
        """A copy of this process's book (per model)."""
        with self._lock:
            return {
                m: _ModelBook(
                    list(b.success),
                    list(b.fail),
                    {k: list(v) for k, v in b.durations.items()},
                    b.inference_count,
                    b.execution_count,
                    b.last_inference_ms,
                )
                for m, b in self._books.items()
            }

    def record(
        self, model: str, ok: bool, total_ms: float, timings_ms: dict | None, n: int
    ) -> None:
        """One answered request of ``n`` items; ``timings_ms`` are Ferry's stage times of a
        success (each item's, as the answer reports them)."""
        with self._lock:
            b = self._books.setdefault(model, _ModelBook())
            which = b.success if ok else b.fail
            which[0] += 1
            which[1] += total_ms * 1e6
            if not ok:
                return
            b.inference_count += n
            b.execution_count += 1
            b.last_inference_ms = int(time.time() * 1e3)
            for ours, theirs in STAGES.items():  # equal counts, as perf_analyzer requires
                ms = (timings_ms or {}).get(ours)
                d = b.durations[theirs]
                d[0] += 1
                d[1] += ms * 1e6 if isinstance(ms, int | float) else 0.0
        now = time.monotonic()
        if self.publish is not None and now - self._published >= self.publish_every_s:
            self._published = now
            self.publish()

    def model_stats(
        self, models: list[str], books: dict[str, _ModelBook] | None = None
    ) -> dict[str, Any]:
        """The statistics of ``models``: from ``books`` (the sum over replicas, ``merge``)
        when given, else from this process's own book."""
        out = []
        with self._lock:
            for m in models:
                b = (self._books if books is None else books).get(m, _ModelBook())

                def pair(p: list[float]) -> dict[str, int]:
                    return {"count": int(p[0]), "ns": int(p[1])}

                out.append(
                    {
                        "name": m,
                        "version": VERSION,
                        "last_inference": b.last_inference_ms,
                        "inference_count": b.inference_count,
                        "execution_count": b.execution_count,
                        "inference_stats": {
                            "success": pair(b.success),
                            "fail": pair(b.fail),
                            **{k: pair(v) for k, v in b.durations.items()},
                        },
                        "batch_stats": [],
                    }
                )
        return {"model_stats": out}


def merge(books: list[dict[str, _ModelBook]]) -> dict[str, _ModelBook]:
    """The sum of several replicas' books. perf_analyzer subtracts two snapshots in
    unsigned 64-bit integers: snapshots of different replicas' own books (each GET goes to
    any replica) could go backwards, and the difference wraps to ~1.8e19 ns."""
    out: dict[str, _ModelBook] = {}
    for book in books:
        for m, b in book.items():
            t = out.setdefault(m, _ModelBook())
            for mine, theirs in ((t.success, b.success), (t.fail, b.fail)):
                mine[0] += theirs[0]
                mine[1] += theirs[1]
            for k, v in b.durations.items():
                d = t.durations.setdefault(k, [0, 0.0])
                d[0] += v[0]
                d[1] += v[1]
            t.inference_count += b.inference_count
            t.execution_count += b.execution_count
            t.last_inference_ms = max(t.last_inference_ms, b.last_inference_ms)
    return out


@dataclass(frozen=True)
class RequestOptions:
    priority_high: bool = False
    deadline: float | None = None  # epoch seconds
    classification: dict[str, int] = field(default_factory=dict)  # output -> top k


def request_options(head: bytes, now: float) -> RequestOptions:
    """``parameters.priority``, ``parameters.timeout`` and outputs'
    ``parameters.classification`` of a v2 request's JSON header (already validated as JSON by
    ``v2.parse_infer``)."""
    if b'"parameters"' not in head:
        return RequestOptions()
    try:
        req = json.loads(head)
    except ValueError:
        return RequestOptions()
    if not isinstance(req, dict):
        return RequestOptions()
    params = req.get("parameters")
    outputs = [
        (o.get("name"), o.get("parameters") if isinstance(o, dict) else None)
        for o in req.get("outputs") or []
        if isinstance(o, dict)
    ]
    return options(params if isinstance(params, dict) else {}, outputs, now)


def options(params: dict[str, Any], outputs: list[tuple[Any, Any]], now: float) -> RequestOptions:
    """A request's options from its ``parameters`` (``priority``, ``timeout``) and its
    outputs' (name, ``parameters``) (``classification``), as plain values -- whatever the
    transport (JSON, protobuf's ``InferParameter``) carried them in."""
    prio = params.get("priority")
    if prio is not None and (type(prio) is not int or prio < 0):
        raise InvalidInput("parameters.priority must be a non-negative integer", priority=str(prio))
    timeout = params.get("timeout")
    deadline = None
    if timeout is not None:
        if type(timeout) is not int or not 0 < timeout <= 3_600_000_000:
            raise InvalidInput(
                "parameters.timeout must be microseconds in (0, 3600000000]", timeout=str(timeout)
            )
        deadline = now + timeout / 1e6
    classes: dict[str, int] = {}
    for name, p in outputs:
        k = p.get("classification") if isinstance(p, dict) else None
        if k is None:
            continue
        if type(k) is not int or not 1 <= k <= 1000:
            raise InvalidInput(
                "parameters.classification must be an integer in [1, 1000]", k=str(k)
            )
        classes[str(name)] = k
    return RequestOptions(prio == 1, deadline, classes)


def classify(scores: np.ndarray, k: int, label: Any) -> np.ndarray:
    """Top-k of each row as BYTES strings ``"score:index:label"`` (Triton's classification
    extension), shape [N, k]."""
    scores = np.asarray(scores, dtype=np.float32)
    k = min(k, scores.shape[-1])
    idx = np.argsort(-scores, axis=-1, kind="stable")[:, :k]
    out = np.empty(idx.shape, dtype=object)
    for r in range(idx.shape[0]):
        for j, i in enumerate(idx[r]):
            out[r, j] = f"{scores[r, i]:f}:{int(i)}:{label(int(i))}".encode()
    return out


def flat(params: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested parameters flattened to ``a.b`` keys of strings, numbers and booleans."""
    out: dict[str, Any] = {}
    for k, v in params.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flat(v, key + "."))
        elif isinstance(v, str | int | float | bool):
            out[key] = v
        elif v is not None:
            out[key] = str(v)
    return out


def output_tensor(arr: np.ndarray) -> tuple[str, np.ndarray]:
    """An answer's tensor as the protocol sends it: (datatype, values) -- FP32, or BYTES for
    an object array of bytes (the classification extension's strings)."""
    if arr.dtype == object:
        return "BYTES", arr
    return "FP32", np.ascontiguousarray(arr, dtype="<f4")


def raw_bytes(datatype: str, arr: np.ndarray) -> bytes:
    """A tensor's raw form (the binary extension, gRPC's ``raw_output_contents``): its
    little-endian values, or for BYTES each element as a 4-byte little-endian length and its
    bytes."""
    if datatype == "BYTES":
        return b"".join(len(x).to_bytes(4, "little") + x for x in arr.ravel())
    return arr.tobytes()


def encode(
    model: str,
    request_id: str | None,
    tensors: dict[str, np.ndarray],
    binary: frozenset[str],
    params: dict[str, Any] | None = None,
) -> tuple[bytes, dict[str, str]]:
    """The response body and headers (HTTP): each tensor as ``output_tensor`` makes it, in
    JSON or, where asked, binary (``raw_bytes``)."""
    outs, blobs = [], []
    for name, given in tensors.items():
        datatype, arr = output_tensor(given)
        o: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(arr.shape)}
        if name in binary:
            b = raw_bytes(datatype, arr)
            o["parameters"] = {"binary_data_size": len(b)}
            blobs.append(b)
        elif datatype == "BYTES":
            o["data"] = [x.decode() for x in arr.ravel()]
        else:
            o["data"] = arr.ravel().tolist()
        outs.append(o)
    resp: dict[str, Any] = {"model_name": model, "model_version": VERSION, "outputs": outs}
    if request_id is not None:
        resp["id"] = request_id
    if params:
        resp["parameters"] = flat(params)
    head = json.dumps(resp).encode()
    if not blobs:
        return head, {"content-type": "application/json"}
    return head + b"".join(blobs), {
        "content-type": "application/octet-stream",
        "inference-header-content-length": str(len(head)),
    }
