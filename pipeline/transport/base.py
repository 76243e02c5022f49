"""Moving tensors between actors: the channel interface and the choice of transport.

A channel has two ends in two processes. The sending end turns an array into a small
``Envelope`` -- shape, dtype, sequence number, caller metadata and a transport token --
that travels in the ordinary Ray call; the receiving end turns the envelope back into an
array. What moves the bytes is the transport:

* ``object_store``: device to host, ``ray.put``, ``ray.get``, host to device (zero copy on
  one node for host arrays). Works everywhere.
* ``nccl``: the payload goes over NCCL (NVLink on one host, the network between hosts),
  only the envelope over Ray (``pipeline.transport.nccl``).

``choose_transport`` picks one automatically (NCCL when both ends hold CUDA devices and
NCCL loads, else the object store); configuration can force any.
"""

from __future__ import annotations

import itertools
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np

from ..errors import InvalidInput, TransportError

TransportName = Literal["auto", "object_store", "nccl"]

# dtypes every transport carries (NCCL has a type for each of them)
DTYPES = ("bool", "int8", "uint8", "int32", "int64", "float16", "float32", "float64")


@dataclass(frozen=True)
class Envelope:
    """What travels in the Ray call: everything but the payload."""

    channel: str
    transport: str
    seq: int
    shape: tuple[int, ...]
    dtype: str
    meta: dict[str, Any] = field(default_factory=dict)
    token: Any = None  # the ObjectRef (object store), the link's NcclToken (nccl)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


def check_array(array: Any, what: str = "array") -> tuple[tuple[int, ...], str]:
    """Shape and dtype of a sendable array; clear errors for what no transport carries."""
    if not hasattr(array, "shape") or not hasattr(array, "dtype"):
        raise InvalidInput(f"{what} must be a numpy or cupy array", got=type(array).__name__)
    dt = np.dtype(array.dtype).name
    if dt not in DTYPES:
        raise InvalidInput(f"{what} has a dtype no transport carries", dtype=dt, supported=DTYPES)
    flags = array.flags
    if not flags["C_CONTIGUOUS"]:
        raise InvalidInput(
            f"{what} must be C-contiguous (call ascontiguousarray first)",
            shape=tuple(array.shape),
            strides=tuple(array.strides),
        )
    return tuple(int(d) for d in array.shape), dt


class Sender(ABC):
    transport: ClassVar[str]

    def __init__(self, channel: str) -> None:
        self.channel = channel
        self._seq = itertools.count()

    def next_seq(self) -> int:
        return next(self._seq)

    @abstractmethod
    def send(self, array: Any, meta: dict[str, Any] | None = None) -> Envelope:
        """Start moving ``array``; the envelope goes to the receiver in a Ray call."""

    def close(self) -> None:  # noqa: B027 - optional
        pass


class Receiver(ABC):
    transport: ClassVar[str]

    def __init__(self, channel: str) -> None:
        self.channel = channel

    @abstractmethod
    def recv(self, envelope: Envelope, timeout: float | None = None) -> tuple[Any, dict[str, Any]]:
        """The array the envelope stands for (on this end's device) and its metadata."""

    def check(self, envelope: Envelope) -> None:
        if envelope.transport != self.transport:
            raise TransportError(
                "envelope came over another transport",
                expected=self.transport,
                got=envelope.transport,
                channel=envelope.channel,
            )

    def close(self) -> None:  # noqa: B027 - optional
        pass


def nccl_available() -> bool:
    try:
        from cupy.cuda import nccl  # optional: cupy

        return bool(getattr(nccl, "available", True)) and nccl.get_version() > 0
    except Exception:
        return False


def choose_transport(
    preferred: TransportName,
    sender_cuda: bool,
    receiver_cuda: bool,
    nccl_ok: bool | None = None,
) -> str:
    """The transport for one hop. ``auto``: NCCL between CUDA ends when NCCL loads,
    otherwise the object store. A forced NCCL without CUDA ends fails."""
    if preferred == "object_store":
        return "object_store"
    ok = nccl_available() if nccl_ok is None else nccl_ok
    if preferred == "nccl":
        if not (sender_cuda and receiver_cuda and ok):
            raise TransportError(
                "the nccl transport needs CUDA on both ends and a loadable NCCL",
                sender_cuda=sender_cuda,
                receiver_cuda=receiver_cuda,
                nccl=ok,
            )
        return "nccl"
    if preferred != "auto":
        raise InvalidInput("unknown transport", transport=preferred)
    if sender_cuda and receiver_cuda and ok:
        return "nccl"
    return "object_store"
