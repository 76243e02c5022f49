"""Ferry's metrics on the Ray metrics endpoint (the Ray dashboard and Prometheus read them).

Every function is a no-op when Ray is not initialized in this process (unit tests, the
CLI), so callers never branch on it. Metric objects are made once per process, at the first
record, from the metric classes installed with ``use_metric_classes``: in Serve replicas
``deployments`` installs ``ray.serve.metrics`` (which adds the ``deployment``, ``replica`` and
``application`` labels, so a gauge stays one series per replica), elsewhere (a plain Ray
actor, a benchmark) ``ray.util.metrics`` serves. The classes are injected rather than
imported here because ``pipeline/`` never imports ``ray.serve``: the runtime stays usable
without Serve, and only the Serve layer knows it runs in a replica.

Callers only append to a buffer; a thread of its own (``ferry-metrics``) hands the records
to Ray every ``FLUSH_S``. Ray's record call releases the GIL, and a thread that gives the GIL
up while another Python thread runs waits up to the switch interval (5 ms) to get it back:
measured in a replica with one busy Python thread beside it, one ``Histogram.observe``
took 4.4 ms of the caller's time against 3.2 us alone. On the event loop that wait was a
stall of every request in the replica; on the flushing thread it delays only the metrics.
Gauges keep their last value per flush and counters their sum (one record each); every
gauge is set again every ``refresh_s()`` (5 s), changed or not, since Ray drops a gauge that
is not (``metrics_buffer.Buffer``).

Histograms are kept in the process (``metrics_buffer.Histograms``: per label set, a running
count per bucket and the exact sum) and exported as Prometheus reads a histogram -- ``<name>_bucket{le=...}``
(cumulative), ``<name>_count`` and ``<name>_sum``, each a Ray gauge set to the running total
(a Ray counter would be named ``..._total``) -- so a flush makes a bounded number of Ray
calls (label sets x buckets) whatever the request rate. Recording each observation
through Ray (about 5 a request: a request's total and each item's preprocess, queue, gpu and
postprocess times) cost 17% more CPU per request in the one-process replica on two cores,
most of it GIL hand-offs between the flushing thread and the event loop (benchmarks/
RESULTS.md, "Histograms kept in the replica"). ``histogram_quantile`` reads these series as
it reads Ray's own histograms; the ``_sum`` is exact (Ray's is estimated from bucket
midpoints). Past ``MAX_PENDING`` records waiting, new ones are dropped and counted
(``ferry_metrics_dropped_total``), so a stuck exporter cannot grow the replica's memory; the
histograms' cells are bounded by their label sets.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import ray
from ray.util import metrics as ray_metrics

from .metrics_buffer import (  # noqa: F401  (Histograms and the bounds: this module's API too)
    BATCH_BOUNDARIES,
    FLUSH_S,
    HISTOGRAMS,
    LATENCY_BOUNDARIES_MS,
    MAX_PENDING,
    Buffer,
    Histograms,
)

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_metrics: dict[str, Any] | None = None
_classes: Any = None  # a module with Counter, Gauge, Histogram; None: ray.util.metrics


def use_metric_classes(module: Any) -> None:
    """Make this process's metrics from ``module``'s ``Counter``, ``Gauge`` and
    ``Histogram`` (``ray.serve.metrics`` in a Serve replica). Takes effect for metrics not
    made yet; call it before the first record."""
    global _classes
    _classes = module


def _get() -> dict[str, Any] | None:
    global _metrics
    if _metrics is not None:
        return _metrics
    try:
        if not ray.is_initialized():
            return None
    except Exception:  # pragma: no cover - ray missing
        return None
    m = _classes if _classes is not None else ray_metrics
    with _lock:
        if _metrics is None:
            _metrics = _make(m)
    return _metrics


EXECUTOR_COUNTS = {
    "batches": "batches run",
    "items": "items run in batches",
    "padded_items": "padding rows that filled batches to their buckets",
    "graph_replays": "batches replayed from a CUDA graph",
    "eager_runs": "batches run eagerly (no graph)",
    "captures": "CUDA graphs captured",
}


def _make(m: Any) -> dict[str, Any]:
    """Every Ferry metric, from the metric classes of module ``m``. Prometheus sees each
    name with Ray's ``ray_`` prefix (``ray_ferry_stage_latency_ms_bucket``, ...)."""
    model = ("model",)
    return {
        **_histogram(
            m,
            "stage",
            "ferry_stage_latency_ms",
            "Time one item spent in a pipeline stage (each item of a batch or group "
            "observed once; stage total: a request from arrival to its answer)",
            ("stage", "model"),
        ),
        "stage_us": m.Counter(
            "ferry_stage_duration_us_total",
            "Cumulative microseconds items spent in a stage (the histogram's sum, in us)",
            tag_keys=("stage", "model"),
        ),
        **_histogram(
            m,
            "batch",
            "ferry_batch_size",
            "Items in a GPU batch (before padding to its bucket)",
            model,
        ),
        "batches": m.Counter("ferry_batches_total", "GPU batches run", tag_keys=model),
        "batch_items": m.Counter(
            "ferry_batch_items_total",
            "Items in the GPU batches run (before padding)",
            tag_keys=model,
        ),
        "groups": m.Counter(
            "ferry_ingress_groups_total",
            "Calls the ingress sent downstream, each a coalesced group of requests",
            tag_keys=model,
        ),
        "group_items": m.Counter(
            "ferry_ingress_group_items_total",
            "Images and tensor rows in the ingress's calls downstream (over groups: the mean "
            "group)",
            tag_keys=model,
        ),
        "queue": m.Gauge(
            "ferry_queue_depth", "Items waiting in the inference queue", tag_keys=model
        ),
        "pool_in_use": m.Gauge(
            "ferry_pool_bytes_in_use", "Device pool bytes held by batches in flight"
        ),
        "pool_held": m.Gauge("ferry_pool_bytes_reserved", "Device pool bytes held from the driver"),
        "pool_hwm": m.Gauge("ferry_pool_high_water_bytes", "Highest pool bytes in use"),
        **{
            f"executor_{k}": m.Gauge(f"ferry_executor_{k}", f"The executor's {text} so far")
            for k, text in EXECUTOR_COUNTS.items()
        },
        "rejected": m.Counter(
            "ferry_rejected_total", "Requests refused, by reason", tag_keys=("reason",)
        ),
        "requests": m.Counter(
            "ferry_requests_total",
            "Requests answered, by model (empty: not a model's route), route, status code and "
            "protocol (http: the route's template and HTTP status; grpc: the method and gRPC "
            "status name)",
            tag_keys=("model", "route", "code", "protocol"),
        ),
        **_device_metrics(m),
    }


def _histogram(m: Any, key: str, name: str, text: str, tags: tuple) -> dict[str, Any]:
    """The three series Prometheus reads as histogram ``name`` (``Histograms`` sets them):
    gauges holding the replica's running totals, since Ray names a counter ``..._total``."""
    return {
        f"{key}_bucket": m.Gauge(
            f"{name}_bucket", f"{text}: observations at or below le", tag_keys=(*tags, "le")
        ),
        f"{key}_count": m.Gauge(f"{name}_count", f"{text}: observations", tag_keys=tags),
        f"{key}_sum": m.Gauge(f"{name}_sum", f"{text}: the observed values summed", tag_keys=tags),
    }


def _device_metrics(m: Any) -> dict[str, Any]:
    """The GPU's own readings (NVML) and the exporter's drops."""
    return {
        "gpu_util": m.Gauge(
            "ferry_gpu_utilization",
            "Fraction of the last sample period a kernel ran on the GPU (NVML)",
            tag_keys=("gpu",),
        ),
        "gpu_mem_used": m.Gauge(
            "ferry_gpu_memory_used_bytes",
            "GPU memory in use, all processes (NVML)",
            tag_keys=("gpu",),
        ),
        "gpu_mem_total": m.Gauge(
            "ferry_gpu_memory_total_bytes", "GPU memory in all (NVML)", tag_keys=("gpu",)
        ),
        "gpu_jpeg_util": m.Gauge(
            "ferry_gpu_jpeg_utilization",
            "Fraction of the last sample period the GPU's JPEG engines were busy (NVML)",
            tag_keys=("gpu",),
        ),
        "dropped": m.Counter(
            "ferry_metrics_dropped_total",
            "Metric records dropped because too many waited to be exported",
        ),
    }


_buffer: Buffer | None = None


def _buffered() -> Buffer | None:
    """This process's buffer, made (and its thread started) at the first record; None
    where Ray is not up."""
    global _buffer
    if _buffer is None:
        m = _get()
        if m is None:
            return None
        with _lock:
            if _buffer is None:
                _buffer = Buffer(m, refresh_s=refresh_s())
                _buffer.start()
    return _buffer


def refresh_s() -> float:
    """How often the buffer sets every gauge again: half the interval at which Ray's metrics
    agent drops a gauge not set again (twice the report interval, which Ray floors at 1 s):
    5 s at Ray's default."""
    return max(ray._config.metrics_report_interval_ms(), 1000) / 2000


def _put(name: str, op: str, value: float, tags: tuple = ()) -> None:
    buf = _buffer or _buffered()
    if buf is not None:
        buf.put(name, op, value, tags)


def flush() -> None:
    """Export what waits now, without waiting for the flushing thread."""
    if _buffer is not None:
        _buffer.flush()


def observe_stage(stage: str, model: str, ms: float, n: int = 1) -> None:
    """``n`` items each spent ``ms`` in ``stage`` (a batch or group passes as one)."""
    tags = (("stage", stage), ("model", model))
    buf = _buffer or _buffered()
    if buf is not None:
        buf.observe("stage", ms, tags, n)
        buf.put("stage_us", "inc", ms * 1e3 * n, tags)


def observe_items(stage: str, model: str, ms: list[float]) -> None:
    """Each item's own time in ``stage``."""
    tags = (("stage", stage), ("model", model))
    buf = _buffer or _buffered()
    if buf is not None and ms:
        buf.observe_each("stage", ms, tags)
        buf.put("stage_us", "inc", sum(ms) * 1e3, tags)


def observe_batch(model: str, size: int) -> None:
    tags = (("model", model),)
    _put("batch", "observe", int(size), tags)
    _put("batches", "inc", 1, tags)
    _put("batch_items", "inc", int(size), tags)


def observe_group(model: str, size: int) -> None:
    """One call the ingress sent downstream: a coalesced group of requests, ``size`` images
    or tensor rows in all."""
    tags = (("model", model),)
    _put("groups", "inc", 1, tags)
    _put("group_items", "inc", int(size), tags)


def set_queue_depth(model: str, depth: int) -> None:
    _put("queue", "set", depth, (("model", model),))


def set_pool(stats: dict[str, Any]) -> None:
    _put("pool_in_use", "set", stats["bytes_in_use"])
    _put("pool_held", "set", stats["bytes_held"])
    _put("pool_hwm", "set", stats["high_water_bytes"])


def set_executor(counts: dict[str, Any]) -> None:
    """The executor's running counts (``Counters.snapshot``): batches, their items and the
    padding rows that filled them to their buckets; batches replayed from a CUDA graph, run
    eagerly, and graphs captured -- past the warm-up, a capture means a batch got an arena
    its bucket had not had before."""
    for k in EXECUTOR_COUNTS:
        if k in counts:
            _put(f"executor_{k}", "set", counts[k])


def set_gpu(gpu: str, sample: dict[str, float]) -> None:
    """One NVML sample of a GPU (``pipeline.gpu_metrics``): keys ``utilization``,
    ``memory_used_bytes``, ``memory_total_bytes`` and, where NVML reports it,
    ``jpeg_utilization``."""
    tags = (("gpu", gpu),)
    for key, name in (
        ("utilization", "gpu_util"),
        ("memory_used_bytes", "gpu_mem_used"),
        ("memory_total_bytes", "gpu_mem_total"),
        ("jpeg_utilization", "gpu_jpeg_util"),
    ):
        if key in sample:
            _put(name, "set", sample[key], tags)


def count_rejected(reason: str) -> None:
    _put("rejected", "inc", 1, (("reason", reason),))


def count_request(model: str, route: str, code: int | str, protocol: str = "http") -> None:
    """One answer: ``model`` the request's model ("" for other routes), ``route`` its
    template (``/v1/models/{model}/classify``) or gRPC method
    (``/inference.GRPCInferenceService/ModelInfer``), ``code`` the HTTP status or the gRPC
    status name (``INVALID_ARGUMENT``), ``protocol`` ``http`` or ``grpc``."""
    tags = (("model", model), ("route", route), ("code", str(code)), ("protocol", protocol))
    _put("requests", "inc", 1, tags)
