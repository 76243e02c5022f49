"""The NCCL transport: the payload goes GPU to GPU over NCCL, the envelope over Ray.

One ``NcclEndpoint`` per process and device. It holds one *link* (``nccl_link.Link``: a
two-rank NCCL communicator) per (sender endpoint, receiver endpoint) pair, in one
direction: rank 0 sends, rank 1 receives. Links open lazily on first use and are reused.
To open one, the sender makes a unique id (``nccl.get_unique_id()``) and publishes it under
``src->dst#generation`` in a named Ray actor, the rendezvous; its envelope carries the
generation. The receiver, on the first envelope of that generation, fetches the id. A link
that was aborted (a transfer passed its deadline) is replaced by one of a new generation on
next use; a watchdog thread sweeps every link for deadlines and completed sends.

Receivers land tensors in memory from cupy's pool, allocated on the caller's stream; the
link's stream waits until the caller's earlier work is done before writing, so a block the
caller freed and got back cannot be written while it is still being read.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import ray

from ..device import is_device_array
from ..errors import InvalidInput, TransportError
from ..threads import name_os_thread
from .base import Envelope, Receiver, Sender, check_array
from .nccl_link import Link, Transfer, nccl_type, rendezvous

logger = logging.getLogger(__name__)


def device_uuid(device: int) -> str:
    """The physical GPU behind a device ordinal (ordinals differ between processes)."""
    import cupy  # optional: cupy

    props = cupy.cuda.runtime.getDeviceProperties(device)
    uuid_ = props.get("uuid", b"")
    if isinstance(uuid_, bytes) and uuid_:
        return uuid_.hex()
    return f"pci-{props.get('pciDomainID', 0)}-{props['pciBusID']}-{props.get('pciDeviceID', 0)}"


@dataclass(frozen=True)
class NcclToken:
    """The envelope's token: which link the payload is on."""

    src: str
    dst: str
    generation: int


# --------------------------------------------------------------------------- endpoint


class NcclEndpoint:
    """This process's end of every NCCL link it sends or receives on, for one device."""

    def __init__(
        self,
        device: int | None = None,
        timeout_s: float = 30.0,
        name: str | None = None,
        watchdog_interval_s: float = 0.05,
    ) -> None:
        import cupy  # optional: cupy

        self.device = cupy.cuda.Device().id if device is None else int(device)
        self.timeout_s = float(timeout_s)
        self.id = (
            name or f"{os.uname().nodename}-{os.getpid()}-gpu{self.device}-{uuid.uuid4().hex[:6]}"
        )
        self.gpu = device_uuid(self.device)  # NCCL cannot link two ranks on one GPU
        self._lock = threading.Lock()
        self._out: dict[str, Link] = {}  # by receiver id
        self._in: dict[str, Link] = {}  # by sender id
        self._opening: dict[str, threading.Lock] = {}  # by sender id
        self._generation = itertools.count()
        self._rendezvous: Any = None
        self._closed = threading.Event()
        self._watchdog = threading.Thread(
            target=self._watch, args=(watchdog_interval_s,), name="ferry-nccl-watchdog", daemon=True
        )
        self._watchdog.start()

    def _rv(self) -> Any:
        if self._rendezvous is None:
            self._rendezvous = rendezvous()
        return self._rendezvous

    def sender(self, dst: str, channel: str | None = None) -> NcclSender:
        return NcclSender(self, dst, channel or f"{self.id}->{dst}")

    def receiver(self, channel: str | None = None) -> NcclReceiver:
        return NcclReceiver(self, channel or f"->{self.id}")

    def link_to(self, dst: str) -> Link:
        """The open link to ``dst``, or a new one (new generation) if there is none or it failed."""
        from cupy.cuda import nccl  # optional: cupy

        with self._lock:
            link = self._out.get(dst)
            if link is not None and link.failed is None:
                return link
            if link is not None:  # aborted: let its worker thread go
                link.close()
            gen = next(self._generation)
            uid = nccl.get_unique_id()
            self._rv().publish.remote(f"{self.id}->{dst}#{gen}", uid)
            link = Link(self, dst, gen, 0, uid, self.timeout_s)
            self._out[dst] = link
        logger.info("NCCL link to %s opening (generation %d)", dst, gen)
        return link

    def link_from(self, src: str, generation: int, deadline: float) -> Link:
        """The link from ``src`` for an envelope of ``generation``; one thread opens it while
        any others receiving from ``src`` wait for it."""
        with self._lock:
            opening = self._opening.setdefault(src, threading.Lock())
        if not opening.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise TransportError("the NCCL link did not open in time", peer=src)
        try:
            return self._link_from(src, generation, deadline)
        finally:
            opening.release()

    def _link_from(self, src: str, generation: int, deadline: float) -> Link:

        with self._lock:
            link = self._in.get(src)
        if link is not None:
            if link.generation == generation:
                if link.failed is not None:
                    raise link.failed
                return link
            if link.generation > generation:
                raise TransportError(
                    "stale envelope: its link was aborted and replaced",
                    generation=generation,
                    current=link.generation,
                    peer=src,
                )
            link.fail("the sender opened a new link")
            link.close()
        key = f"{src}->{self.id}#{generation}"
        wait = max(0.1, deadline - time.monotonic())
        try:
            uid = ray.get(self._rv().fetch.remote(key, wait), timeout=wait + 5.0)
        except Exception as exc:  # noqa: BLE001
            raise TransportError("NCCL rendezvous failed", detail=str(exc), key=key) from None
        if uid is None:
            raise TransportError("no NCCL unique id was published in time", key=key)
        with self._lock:
            link = Link(self, src, generation, 1, uid, self.timeout_s)
            self._in[src] = link
        logger.info("NCCL link from %s opening (generation %d)", src, generation)
        return link

    def _watch(self, interval: float) -> None:
        name_os_thread()
        while not self._closed.wait(interval):
            now = time.monotonic()
            with self._lock:
                links = list(self._out.values()) + list(self._in.values())
            for link in links:
                if link.failed is None:
                    try:
                        link.sweep(now)
                    except Exception:  # noqa: BLE001 - the watchdog never dies
                        logger.exception("NCCL watchdog")

    def stats(self) -> dict[str, Any]:
        with self._lock:
            out = {
                k: (v.generation, v.failed is None, len(v.pending)) for k, v in self._out.items()
            }
            inn = {k: (v.generation, v.failed is None, len(v.pending)) for k, v in self._in.items()}
        return {"id": self.id, "device": self.device, "out": out, "in": inn}

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            links = list(self._out.values()) + list(self._in.values())
            self._out.clear()
            self._in.clear()
        for link in links:
            link.close()


# --------------------------------------------------------------------------- the two ends


class NcclSender(Sender):
    transport = "nccl"

    def __init__(self, endpoint: NcclEndpoint, dst: str, channel: str) -> None:
        super().__init__(channel)
        self.endpoint = endpoint
        self.dst = dst

    def send(self, array: Any, meta: dict[str, Any] | None = None) -> Envelope:
        """Enqueue the send and return at once; the tensor is kept alive until it is sent.

        The send starts when the caller's current stream reaches this point (an event, not
        a host wait). ``wait(envelope)`` blocks until it completed, or raises."""
        import cupy  # optional: cupy

        shape, dtype = check_array(array)
        ntype = nccl_type(dtype)
        if not is_device_array(array):
            raise InvalidInput(
                "the nccl transport sends device (cupy) arrays; host arrays go by object_store",
                got=type(array).__name__,
            )
        if array.device.id != self.endpoint.device:
            raise InvalidInput(
                "array is on another device than this endpoint",
                array_device=array.device.id,
                endpoint_device=self.endpoint.device,
            )
        link = self.endpoint.link_to(self.dst)
        seq = link.next_seq()
        ready = cupy.cuda.Event(block=False, disable_timing=True)
        ready.record(cupy.cuda.get_current_stream())
        t = Transfer(seq, array, time.monotonic() + self.endpoint.timeout_s)
        count = int(array.size)  # bool is one byte, carried as uint8
        link.submit_send(t, count, ntype, ready)
        token = NcclToken(self.endpoint.id, self.dst, link.generation)
        return Envelope(self.channel, self.transport, seq, shape, dtype, dict(meta or {}), token)

    def wait(self, envelope: Envelope, timeout: float | None = None) -> None:
        """Until the send of ``envelope`` completed; ``TransportError`` if it failed or timed out."""
        tok: NcclToken = envelope.token
        link = self.endpoint._out.get(tok.dst)
        if link is None or link.generation != tok.generation:
            raise TransportError("the link of this send is gone (aborted)", seq=envelope.seq)
        with link.lock:
            t = link.pending.get(envelope.seq)
        if t is None:  # already settled by the watchdog
            if link.failed is not None:
                raise link.failed
            return
        deadline = t.deadline if timeout is None else min(t.deadline, time.monotonic() + timeout)
        link.wait_open(deadline)
        link.wait(t, deadline)


class NcclReceiver(Receiver):
    transport = "nccl"

    def __init__(self, endpoint: NcclEndpoint, channel: str) -> None:
        super().__init__(channel)
        self.endpoint = endpoint

    def recv(self, envelope: Envelope, timeout: float | None = None) -> tuple[Any, dict[str, Any]]:
        """The tensor, on this endpoint's device, complete; the caller's current stream waits
        on the receive's event. ``TransportError`` (link aborted) when it does not arrive
        within ``timeout`` (default: the endpoint's)."""
        return self.recv_many([envelope], timeout)[0]

    def recv_many(
        self, envelopes: list[Envelope], timeout: float | None = None
    ) -> list[tuple[Any, dict[str, Any]]]:
        """Post every receive first, then wait for them: the link's stream never idles
        between tensors of one call."""
        return self.post(envelopes, timeout).wait()

    def post(self, envelopes: list[Envelope], timeout: float | None = None) -> Posted:
        """Enqueue the receives and return at once (only opening a link waits, for the peer).

        Receives wait for earlier sequence numbers on their own, without holding a thread,
        so callers that take envelopes out of order on a bounded pool cannot deadlock:
        post from the pool, then poll ``Posted.done()`` from an event loop."""
        import cupy  # optional: cupy

        deadline = time.monotonic() + (self.endpoint.timeout_s if timeout is None else timeout)
        posted = []
        with cupy.cuda.Device(self.endpoint.device):
            caller = cupy.cuda.get_current_stream()
            for envelope in envelopes:
                self.check(envelope)
                tok = envelope.token
                if not isinstance(tok, NcclToken) or tok.dst != self.endpoint.id:
                    raise TransportError(
                        "envelope is addressed to another endpoint",
                        to=getattr(tok, "dst", None),
                        here=self.endpoint.id,
                    )
                ntype = nccl_type(envelope.dtype)
                link = self.endpoint.link_from(tok.src, tok.generation, deadline)
                link.wait_open(deadline)
                out = cupy.empty(envelope.shape, dtype=envelope.dtype)
                ready = cupy.cuda.Event(block=False, disable_timing=True)
                ready.record(caller)
                t = Transfer(envelope.seq, out, deadline)
                count = int(out.size)
                link.submit_recv(t, count, ntype, ready)
                posted.append((link, t, out, envelope.meta))
        return Posted(self.endpoint.device, posted, deadline)


class Posted:
    """Receives in flight: ``done()`` polls (and enforces the deadline), ``wait()`` blocks."""

    def __init__(self, device: int, posted: list[tuple], deadline: float) -> None:
        self.device = device
        self.posted = posted
        self.deadline = deadline

    def done(self) -> bool:
        for link, t, _, _ in self.posted:
            if t.error is not None:
                return True
            if not t.complete():
                if time.monotonic() > self.deadline:
                    link.fail(f"receive {t.seq} did not complete by its deadline")
                    return True
                return False
        return True

    def wait(self) -> list[tuple[Any, dict[str, Any]]]:
        import cupy  # optional: cupy

        results = []
        with cupy.cuda.Device(self.device):
            caller = cupy.cuda.get_current_stream()
            for link, t, out, meta in self.posted:
                link.wait(t, self.deadline)
                if t.done_event is not None:
                    caller.wait_event(t.done_event)
                results.append((out, meta))
        return results
