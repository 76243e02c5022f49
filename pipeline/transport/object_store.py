"""The object-store transport: device to host, ``ray.put``; ``ray.get``, host to device.

It works between any two Ray processes, on one node (shared memory, zero copy for host
arrays) or across nodes (Ray moves the object). A GPU sender copies into host memory first
and a GPU receiver copies back -- the path NCCL exists to avoid, kept as the fallback and as
the baseline the NCCL channel is measured against.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import ray
from ray.exceptions import GetTimeoutError, RayError

from ..device import is_device_array
from ..errors import TransportError
from .base import Envelope, Receiver, Sender, check_array


class ObjectStoreSender(Sender):
    transport = "object_store"

    def send(self, array: Any, meta: dict[str, Any] | None = None) -> Envelope:

        shape, dtype = check_array(array)
        host = array.get() if is_device_array(array) else np.asarray(array)
        try:
            ref = ray.put(host)
        except Exception as exc:  # object store full, Ray down
            raise TransportError(
                "could not put the tensor in the object store",
                detail=str(exc),
                channel=self.channel,
            ) from None
        return Envelope(
            self.channel, self.transport, self.next_seq(), shape, dtype, dict(meta or {}), ref
        )


class ObjectStoreReceiver(Receiver):
    transport = "object_store"

    def __init__(self, channel: str, to_device: bool = False) -> None:
        super().__init__(channel)
        self.to_device = to_device

    def recv(self, envelope: Envelope, timeout: float | None = None) -> tuple[Any, dict[str, Any]]:

        self.check(envelope)
        try:
            host = ray.get(envelope.token, timeout=timeout)
        except GetTimeoutError:
            raise TransportError(
                "tensor did not arrive in time",
                timeout_s=timeout,
                seq=envelope.seq,
                channel=envelope.channel,
            ) from None
        except RayError as exc:  # the owner died, the object was lost
            raise TransportError(
                "tensor was lost on the way",
                detail=str(exc),
                seq=envelope.seq,
                channel=envelope.channel,
            ) from None
        if tuple(host.shape) != envelope.shape or host.dtype.name != envelope.dtype:
            raise TransportError(
                "tensor does not match its envelope",
                shape=tuple(host.shape),
                expected=envelope.shape,
                dtype=host.dtype.name,
            )
        if self.to_device:
            import cupy  # optional: cupy

            return cupy.asarray(host), envelope.meta
        return host, envelope.meta
