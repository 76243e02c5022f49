"""Ferry's errors: one root, structured fields, safe to pickle across actor boundaries.

Every error keeps its structured fields in ``self.fields`` (what an error answer's
``detail`` shows) and rebuilds itself from them when unpickled (Ray sends exceptions between
processes). Fields that code reads are typed constructor arguments and attributes of their
class, as CuPy's ``OutOfMemoryError(size, total, limit)`` has them -- ``QueueFull.retry_after_s``
and ``.reason``, ``DeadlineExceeded.request_id`` and ``.reason``, ``Unavailable.reason``,
``ModelNotFound.model``, ``ResourceExhausted.requested_bytes``, ``InvalidInput.node`` -- so a
caller on the other side of a Serve hop reads ``err.reason``, not a dict key. A typed field
left at its default stays out of ``fields`` (an answer's ``detail`` shows what was said).
"""

from __future__ import annotations

import math
import reprlib
from typing import Any

# Fields often carry what the client sent (a shape, a header): shown cut short, and never
# by a ``repr`` that recurses through a 100,000-deep list or prints a 5,000-digit integer.
_SHORT = reprlib.Repr()
_SHORT.maxlevel = 3
_SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxdict = 8
_SHORT.maxstring = _SHORT.maxother = 160
_SHORT.maxlong = 40


def short_repr(v: Any) -> str:
    """``repr`` cut short: bounded in length and depth whatever ``v`` is."""
    try:
        return _SHORT.repr(v)
    except Exception:  # a repr that itself fails
        return f"<{type(v).__name__}>"


def json_safe(v: Any) -> Any:
    """A field value as JSON can carry it: finite numbers, booleans, None and short strings
    as they are; everything else (NaN, infinity, lists, objects) as a short repr."""
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, int):
        return v if abs(v) < 1 << 63 else short_repr(v)
    if isinstance(v, float):
        return v if math.isfinite(v) else repr(v)
    if isinstance(v, str):
        return v if len(v) <= 160 else v[:160] + "..."
    return short_repr(v)


class FerryError(Exception):
    """Root of every error Ferry raises on purpose."""

    http_status: int = 500
    closes_connection: bool = False  # the answer ends the connection (a body left unread)

    def __init__(self, message: str = "", **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fields: dict[str, Any] = dict(fields)

    def __reduce__(self):
        return (_rebuild, (type(self), self.message, self.fields))

    def __str__(self) -> str:
        if not self.fields:
            return self.message
        detail = ", ".join(f"{k}={short_repr(v)}" for k, v in self.fields.items())
        return f"{self.message} ({detail})" if self.message else detail

    def __eq__(self, other: object) -> bool:  # handy in tests of the pickle round trip
        return (
            type(self) is type(other)
            and self.message == other.message  # type: ignore[attr-defined]
            and self.fields == other.fields  # type: ignore[attr-defined]
        )

    __hash__ = Exception.__hash__

    def public_detail(self) -> dict[str, Any]:
        """The fields as a JSON-safe object (what an error response carries)."""
        return {str(k)[:64]: json_safe(v) for k, v in self.fields.items()}


def _rebuild(cls: type[FerryError], message: str, fields: dict[str, Any]) -> FerryError:
    return cls(message, **fields)


class InvalidInput(FerryError):
    """The request or the tensor spec is wrong; the fields name the offending values.
    ``node``: the graph node whose planning found it (``at_node``), where one did."""

    http_status = 400

    def __init__(self, message: str = "", *, node: str | None = None, **fields: Any) -> None:
        super().__init__(message, **({} if node is None else {"node": node}), **fields)
        self.node = node

    def at_node(self, name: str) -> None:
        """Name the graph node this was found planning, unless one is named already."""
        if self.node is None:
            self.node = name
            self.fields["node"] = name


class UnsupportedMediaType(InvalidInput):
    """The body is of a type Ferry does not read (HTTP 415)."""

    http_status = 415


class NotAcceptable(InvalidInput):
    """No encoder for any media type the request's ``Accept`` takes (HTTP 406)."""

    http_status = 406


class PayloadTooLarge(InvalidInput):
    """The body or the image is larger than the configured limit (HTTP 413)."""

    http_status = 413


class ResourceExhausted(FerryError):
    """A reservation would pass the pool's hard limit, or no staging slot came in time.
    ``requested_bytes`` and ``limit_bytes``: the reservation and the limit, where known."""

    http_status = 503

    def __init__(
        self,
        message: str = "",
        *,
        requested_bytes: int | None = None,
        limit_bytes: int | None = None,
        **fields: Any,
    ) -> None:
        typed = {"requested_bytes": requested_bytes, "limit_bytes": limit_bytes}
        super().__init__(message, **{k: v for k, v in typed.items() if v is not None}, **fields)
        self.requested_bytes = requested_bytes
        self.limit_bytes = limit_bytes


class RetryLater(FerryError):
    """A 503 the client may retry after ``retry_after_s`` (the answer's Retry-After), with
    ``reason``: the class's ``default_reason`` unless given (a default left unsaid stays
    out of ``fields``, so the error's detail shows only what was said)."""

    http_status = 503
    default_reason: str | None = None

    def __init__(
        self,
        message: str = "",
        *,
        retry_after_s: float = 1.0,
        reason: str | None = None,
        **fields: Any,
    ) -> None:
        given = {} if reason is None else {"reason": reason}
        super().__init__(message, retry_after_s=retry_after_s, **given, **fields)
        self.retry_after_s = float(retry_after_s)
        self.reason = self.default_reason if reason is None else reason


class QueueFull(RetryLater):
    """The bounded queue is full: retry after ``retry_after_s`` (the answer's Retry-After).
    ``reason`` (the rejection metric's label): ``queue_full`` unless the queue-time budget
    refused it (``queue_budget``, ``queue_timeout``: ``pipeline.queue_budget``)."""

    default_reason = "queue_full"


class UploadsFull(QueueFull):
    """A replica is reading as many request bodies as it may: retry after
    ``retry_after_s`` (the body was not read, so the connection closes)."""

    closes_connection = True


class RequestTimeout(InvalidInput):
    """The client stopped sending its request body (HTTP 408; the connection closes)."""

    http_status = 408
    closes_connection = True


class ClientClosedRequest(RequestTimeout):
    """The client closed the connection before its answer (nginx's and Triton's 499): no
    one reads what is sent back, and the metrics count it apart from errors and slow
    clients."""

    http_status = 499


class Unavailable(RetryLater):
    """This replica cannot take work now (it is draining: its device failed, its
    scheduler is wedged, or it was told to stop). Nothing was run: retry, on another
    replica, after ``retry_after_s``. ``reason``, when given: why it drains (a device
    error, a wedge, a stop)."""


class DeadlineExceeded(FerryError):
    """The request's deadline passed before it reached the GPU, or no answer came in time;
    ``request_id``: whose; ``reason`` (the rejection metric's label): ``deadline``."""

    http_status = 504

    def __init__(
        self,
        message: str = "",
        *,
        request_id: str | None = None,
        reason: str | None = None,
        **fields: Any,
    ) -> None:
        if reason is not None:
            fields["reason"] = reason
        if request_id is not None:
            fields["request_id"] = request_id
        super().__init__(message, **fields)
        self.request_id = request_id
        self.reason = "deadline" if reason is None else reason


class DeviceError(FerryError):
    """The device failed (a CUDA error, a kernel that did not compile, a lost device)."""

    http_status = 500


class NonFiniteOutput(FerryError):
    """The model computed NaN or infinity for this request -- in float16 most often an
    overflow of large activations or logits. Never sent on as a score; the fields name the
    model and the compute dtype, and serving it in float32 (the entry's ``precision``) is
    the fix to try. Not retryable: the same input gives the same output."""

    http_status = 500
    retryable = False


class TransportError(FerryError):
    """A tensor transfer between actors failed or timed out."""

    http_status = 500


class ModelNotFound(FerryError):
    """No model of that name is served here; ``served``: the names that are."""

    http_status = 404

    def __init__(
        self, message: str = "", *, model: str, served: list[str] | None = None, **fields: Any
    ) -> None:
        if served is not None:
            fields["served"] = list(served)
        super().__init__(message, model=model, **fields)
        self.model = model
        self.served = None if served is None else list(served)


class ModelRefused(InvalidInput):
    """A model file Ferry cannot run (an op, attribute, opset or dtype it does not support),
    refused when the model loads; the fields name the node, the op and what is supported."""


__all__ = [
    "json_safe",
    "short_repr",
    "FerryError",
    "InvalidInput",
    "UnsupportedMediaType",
    "PayloadTooLarge",
    "ResourceExhausted",
    "RetryLater",
    "QueueFull",
    "UploadsFull",
    "RequestTimeout",
    "ClientClosedRequest",
    "Unavailable",
    "DeadlineExceeded",
    "DeviceError",
    "TransportError",
    "ModelNotFound",
    "ModelRefused",
]
