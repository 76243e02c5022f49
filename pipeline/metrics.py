"""Ferry's metrics on the Ray metrics endpoint (the Ray dashboard and Prometheus read them).

Every function is a no-op when Ray is not initialized in this process (unit tests, the
CLI), so callers never branch on it. Metric objects are made once per process.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

logger = logging.getLogger(__name__)

LATENCY_BOUNDARIES_MS = [0.5, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
BATCH_BOUNDARIES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]

_lock = threading.Lock()
_metrics: dict[str, Any] | None = None


def _get() -> dict[str, Any] | None:
    global _metrics
    if _metrics is not None:
        return _metrics
    try:
        import ray

        if not ray.is_initialized():
            return None
        from ray.util import metrics as m
    except Exception:  # pragma: no cover - ray missing
        return None
    with _lock:
        if _metrics is None:
            _metrics = {
                "stage": m.Histogram(
                    "ferry_stage_latency_ms",
                    "Time spent in a pipeline stage, per item",
                    boundaries=LATENCY_BOUNDARIES_MS,
                    tag_keys=("stage", "model"),
                ),
                "batch": m.Histogram(
                    "ferry_batch_size",
                    "Items in a GPU batch (before padding)",
                    boundaries=BATCH_BOUNDARIES,
                    tag_keys=("model",),
                ),
                "queue": m.Gauge(
                    "ferry_queue_depth", "Items waiting in the inference queue", tag_keys=("model",)
                ),
                "pool_in_use": m.Gauge(
                    "ferry_pool_bytes_in_use", "Device pool bytes held by batches in flight"
                ),
                "pool_held": m.Gauge(
                    "ferry_pool_bytes_reserved", "Device pool bytes held from the driver"
                ),
                "pool_hwm": m.Gauge("ferry_pool_high_water_bytes", "Highest pool bytes in use"),
                "rejected": m.Counter(
                    "ferry_rejected_total", "Requests refused, by reason", tag_keys=("reason",)
                ),
                "requests": m.Counter(
                    "ferry_requests_total", "HTTP requests answered", tag_keys=("route", "code")
                ),
            }
    return _metrics


def observe_stage(stage: str, model: str, ms: float) -> None:
    """One observation per call or batch (not per item: a record costs tens of microseconds)."""
    m = _get()
    if m is not None:
        m["stage"].observe(ms, tags={"stage": stage, "model": model})


def observe_batch(model: str, size: int) -> None:
    m = _get()
    if m is not None:
        m["batch"].observe(size, tags={"model": model})


def set_queue_depth(model: str, depth: int) -> None:
    m = _get()
    if m is not None:
        m["queue"].set(depth, tags={"model": model})


def set_pool(stats: dict[str, Any]) -> None:
    m = _get()
    if m is not None:
        m["pool_in_use"].set(stats["bytes_in_use"])
        m["pool_held"].set(stats["bytes_held"])
        m["pool_hwm"].set(stats["high_water_bytes"])


def count_rejected(reason: str) -> None:
    m = _get()
    if m is not None:
        m["rejected"].inc(tags={"reason": reason})


def count_request(route: str, code: int) -> None:
    m = _get()
    if m is not None:
        m["requests"].inc(tags={"route": route, "code": str(code)})
