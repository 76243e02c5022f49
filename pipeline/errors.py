"""Ferry's errors: one root, structured fields, safe to pickle across actor boundaries.

Every subclass keeps its structured fields in ``self.fields`` and rebuilds itself from
them when unpickled (Ray sends exceptions between processes), so a caller on the other
side of a Serve hop can still read ``err.fields["limit_bytes"]`` or map the class to an
HTTP status.
"""

from __future__ import annotations

from typing import Any


class FerryError(Exception):
    """Root of every error Ferry raises on purpose."""

    http_status: int = 500

    def __init__(self, message: str = "", **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fields: dict[str, Any] = dict(fields)

    def __reduce__(self):
        return (_rebuild, (type(self), self.message, self.fields))

    def __str__(self) -> str:
        if not self.fields:
            return self.message
        detail = ", ".join(f"{k}={v!r}" for k, v in self.fields.items())
        return f"{self.message} ({detail})" if self.message else detail

    def __eq__(self, other: object) -> bool:  # handy in tests of the pickle round trip
        return (
            type(self) is type(other)
            and self.message == other.message  # type: ignore[attr-defined]
            and self.fields == other.fields  # type: ignore[attr-defined]
        )

    __hash__ = Exception.__hash__


def _rebuild(cls: type[FerryError], message: str, fields: dict[str, Any]) -> FerryError:
    return cls(message, **fields)


class InvalidInput(FerryError):
    """The request or the tensor spec is wrong; the fields name the offending values."""

    http_status = 400


class UnsupportedMediaType(InvalidInput):
    """The body is of a type Ferry does not read (HTTP 415)."""

    http_status = 415


class PayloadTooLarge(InvalidInput):
    """The body or the image is larger than the configured limit (HTTP 413)."""

    http_status = 413


class ResourceExhausted(FerryError):
    """A reservation would pass the pool's hard limit, or no staging slot came in time."""

    http_status = 503


class QueueFull(FerryError):
    """The bounded queue is full: retry after ``retry_after_s``."""

    http_status = 503


class DeadlineExceeded(FerryError):
    """The request's deadline passed before it reached the GPU."""

    http_status = 504


class DeviceError(FerryError):
    """The device failed (a CUDA error, a kernel that did not compile, a lost device)."""

    http_status = 500


class TransportError(FerryError):
    """A tensor transfer between actors failed or timed out."""

    http_status = 500


class ModelNotFound(FerryError):
    """No model of that name is served here."""

    http_status = 404


class ModelRefused(InvalidInput):
    """A model file Ferry cannot run (an op, attribute, opset or dtype it does not support),
    refused when the model loads; the fields name the node, the op and what is supported."""


__all__ = [
    "FerryError",
    "InvalidInput",
    "UnsupportedMediaType",
    "PayloadTooLarge",
    "ResourceExhausted",
    "QueueFull",
    "DeadlineExceeded",
    "DeviceError",
    "TransportError",
    "ModelNotFound",
    "ModelRefused",
]
