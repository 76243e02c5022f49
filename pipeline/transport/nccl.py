"""The NCCL transport: the payload goes GPU to GPU over NCCL, the envelope over Ray.

One ``NcclEndpoint`` per process and device. It holds one *link* -- a two-rank NCCL
communicator -- per (sender endpoint, receiver endpoint) pair, in one direction: rank 0
sends, rank 1 receives. Links open lazily on first use and are reused:

1. The sender makes a unique id (``nccl.get_unique_id()``) and publishes it under
   ``src->dst#generation`` in a named Ray actor, the rendezvous; its envelope carries the
   generation. The receiver, on the first envelope of that generation, fetches the id.
2. Both ends create their rank of the communicator on the link's own worker thread (NCCL
   init blocks until both ranks have joined), then exchange one warm-up value, which also
   sets up NCCL's point-to-point connection before any payload waits on it.
3. Each ``send`` / ``recv`` is enqueued by that one worker thread, in sequence order, on
   the link's own stream. The sender's stream waits on an event recorded on the caller's
   stream (the tensor is ready); the caller's stream waits on the receive's completion
   event. Streams hand over through events only.

Nothing hangs: every transfer has a deadline. A send or receive that has not completed by
then -- the peer died, or its envelope never arrived -- aborts the communicator
(``ncclCommAbort``), fails every transfer still on the link with ``TransportError``, and the
next use opens a new link under a new generation. A watchdog thread enforces deadlines of
sends nobody waits for and lets go of tensors once their send has completed.

Receivers land tensors in memory from cupy's pool, allocated on the caller's stream; the
link's stream waits until the caller's earlier work is done before writing, so a block the
caller freed and got back cannot be written while it is still being read.

Limit: a peer that never joins leaves the init call blocked in its thread (cupy offers only
the blocking ``ncclCommInitRank``); the caller gets its ``TransportError`` at the deadline
and the next use opens a fresh link, but that one thread stays parked.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..device import is_device_array
from ..errors import InvalidInput, TransportError
from ..threads import name_os_thread, thread_pool
from .base import DTYPES, Envelope, Receiver, Sender, check_array

logger = logging.getLogger(__name__)

RENDEZVOUS_NAME = "ferry_nccl_rendezvous"
RENDEZVOUS_NAMESPACE = "ferry"

# dtype -> the NCCL type name in cupy.cuda.nccl (bool travels as bytes)
NCCL_TYPES = {
    "bool": "NCCL_UINT8",
    "int8": "NCCL_INT8",
    "uint8": "NCCL_UINT8",
    "int32": "NCCL_INT32",
    "int64": "NCCL_INT64",
    "float16": "NCCL_FLOAT16",
    "float32": "NCCL_FLOAT32",
    "float64": "NCCL_FLOAT64",
}
assert set(NCCL_TYPES) == set(DTYPES)


def nccl_type(dtype: Any) -> int:
    """NCCL's type code for a numpy dtype; ``InvalidInput`` for one NCCL cannot carry."""
    name = np.dtype(dtype).name
    if name not in NCCL_TYPES:
        raise InvalidInput(
            "the nccl transport cannot carry this dtype", dtype=name, supported=sorted(NCCL_TYPES)
        )
    from cupy.cuda import nccl

    return int(getattr(nccl, NCCL_TYPES[name]))


def device_uuid(device: int) -> str:
    """The physical GPU behind a device ordinal (ordinals differ between processes)."""
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(device)
    uuid_ = props.get("uuid", b"")
    if isinstance(uuid_, bytes) and uuid_:
        return uuid_.hex()
    return f"pci-{props.get('pciDomainID', 0)}-{props['pciBusID']}-{props.get('pciDeviceID', 0)}"


# --------------------------------------------------------------------------- rendezvous


class Rendezvous:
    """A named Ray actor that hands unique ids from the sending end to the receiving end."""

    def __init__(self) -> None:
        import asyncio

        self._asyncio = asyncio
        self._ids: dict[str, tuple] = {}
        self._ready: dict[str, Any] = {}

    def _event(self, key: str) -> Any:
        ev = self._ready.get(key)
        if ev is None:
            ev = self._ready[key] = self._asyncio.Event()
        return ev

    async def publish(self, key: str, unique_id: tuple) -> None:
        self._ids[key] = unique_id
        self._event(key).set()

    async def fetch(self, key: str, timeout_s: float) -> tuple | None:
        """The id published under ``key`` (taken: each id is fetched once), or None."""
        try:
            await self._asyncio.wait_for(self._event(key).wait(), timeout_s)
        except self._asyncio.TimeoutError:
            self._ready.pop(key, None)
            return None
        self._ready.pop(key, None)
        return self._ids.pop(key, None)

    async def pending(self) -> int:
        return len(self._ids)


def rendezvous() -> Any:
    """The rendezvous actor, created by whoever asks first (detached: it outlives them)."""
    import ray

    actor = ray.remote(num_cpus=0)(Rendezvous)
    return actor.options(
        name=RENDEZVOUS_NAME,
        namespace=RENDEZVOUS_NAMESPACE,
        lifetime="detached",
        get_if_exists=True,
    ).remote()


@dataclass(frozen=True)
class NcclToken:
    """The envelope's token: which link the payload is on."""

    src: str
    dst: str
    generation: int


# --------------------------------------------------------------------------- transfers


def _wait_event(event: Any, deadline: float) -> bool:
    """Poll a CUDA event until it completes (True) or the deadline passes (False)."""
    pause = 2e-5
    while not event.done:
        if time.monotonic() >= deadline:
            return bool(event.done)
        time.sleep(pause)
        pause = min(pause * 2, 2e-4)
    return True


class Transfer:
    """One send or receive on a link: enqueued by the worker, completed on the device."""

    __slots__ = ("seq", "array", "deadline", "enqueued", "done_event", "error", "settled")

    def __init__(self, seq: int, array: Any, deadline: float) -> None:
        self.seq = seq
        self.array = array  # kept alive until the device is done with it
        self.deadline = deadline
        self.enqueued = threading.Event()
        self.done_event: Any = None  # cupy Event after enqueueing; None for empty tensors
        self.error: TransportError | None = None
        self.settled = False

    def fail(self, err: TransportError) -> None:
        if self.error is None and not self.settled:
            self.error = err
        self.enqueued.set()

    def complete(self) -> bool:
        return self.enqueued.is_set() and (self.done_event is None or bool(self.done_event.done))


class Link:
    """One communicator between two endpoints, one direction (rank 0 sends, rank 1 receives)."""

    def __init__(
        self,
        endpoint: NcclEndpoint,
        peer: str,
        generation: int,
        rank: int,
        unique_id: tuple,
        timeout_s: float,
    ) -> None:
        import cupy

        self.endpoint = endpoint
        self.peer = peer
        self.generation = generation
        self.rank = rank
        self.timeout_s = timeout_s
        self.comm: Any = None
        self.failed: TransportError | None = None
        self.lock = threading.Lock()
        self.pending: dict[int, Transfer] = {}  # not yet settled, in seq order
        self._seq = itertools.count()
        self._next_recv = 0
        self._parked: dict[int, tuple] = {}  # receives that arrived before their turn
        with cupy.cuda.Device(endpoint.device):
            self.stream = cupy.cuda.Stream(non_blocking=True)
        self.worker = thread_pool(1, f"ferry-nccl-{peer[:12]}")
        self.opened = Transfer(-1, None, time.monotonic() + timeout_s)
        self.worker.submit(self._open, unique_id)

    # ------------------------------------------------------------------ worker side
    def _open(self, unique_id: tuple) -> None:
        import cupy
        from cupy.cuda import nccl

        t = self.opened
        try:
            with cupy.cuda.Device(self.endpoint.device):
                comm = nccl.NcclCommunicator(2, unique_id, self.rank)
                with self.lock:
                    if self.failed is not None:  # gave up on us while we waited for the peer
                        comm.abort()
                        t.fail(self.failed)
                        return
                    self.comm = comm
                # the warm-up: one value across, which also connects the p2p channel
                probe = cupy.full((1,), 7 if self.rank == 0 else 0, dtype=cupy.int32)
                if self.rank == 0:
                    comm.send(probe.data.ptr, 1, nccl.NCCL_INT32, 1, self.stream.ptr)
                else:
                    comm.recv(probe.data.ptr, 1, nccl.NCCL_INT32, 0, self.stream.ptr)
                ev = cupy.cuda.Event(block=False, disable_timing=True)
                ev.record(self.stream)
                t.array, t.done_event = probe, ev
        except Exception as exc:  # noqa: BLE001 - any NCCL/CUDA failure fails the link
            t.fail(TransportError("could not open the NCCL link", detail=str(exc), peer=self.peer))
        t.enqueued.set()

    def _enqueue(self, t: Transfer, op: str, count: int, ntype: int, after: Any) -> None:
        import cupy

        try:
            with self.lock:
                if self.failed is not None:
                    t.fail(self.failed)
                    return
                comm = self.comm
            with cupy.cuda.Device(self.endpoint.device):
                self.stream.wait_event(after)
                if count:
                    ptr = t.array.data.ptr
                    if op == "send":
                        comm.send(ptr, count, ntype, 1, self.stream.ptr)
                    else:
                        comm.recv(ptr, count, ntype, 0, self.stream.ptr)
                ev = cupy.cuda.Event(block=False, disable_timing=True)
                ev.record(self.stream)
                t.done_event = ev
        except Exception as exc:  # noqa: BLE001
            t.fail(TransportError(f"NCCL {op} failed", detail=str(exc), peer=self.peer))
        t.enqueued.set()

    # ------------------------------------------------------------------ caller side
    def wait_open(self, deadline: float) -> None:
        t = self.opened
        if t.settled and t.error is None:
            return
        if not t.enqueued.wait(max(0.0, deadline - time.monotonic())):
            self.fail("the peer did not join the NCCL link in time")
        elif t.error is None and not _wait_event(t.done_event, deadline):
            self.fail("the warm-up exchange did not complete in time")
        if t.error is not None or self.failed is not None:
            raise t.error or self.failed  # type: ignore[misc]
        if self.rank == 1 and int(t.array.get()[0]) != 7:
            self.fail("the warm-up value arrived corrupted")
            raise self.failed  # type: ignore[misc]
        t.settled = True

    def next_seq(self) -> int:
        return next(self._seq)

    def submit_send(self, t: Transfer, count: int, ntype: int, ready: Any) -> None:
        with self.lock:
            if self.failed is not None:
                raise self.failed
            self.pending[t.seq] = t
        self.worker.submit(self._enqueue, t, "send", count, ntype, ready)

    def submit_recv(self, t: Transfer, count: int, ntype: int, ready: Any) -> None:
        """Receives are enqueued in sequence order, whatever order their envelopes came in."""
        with self.lock:
            if self.failed is not None:
                raise self.failed
            if t.seq < self._next_recv or t.seq in self._parked:
                raise TransportError("this tensor was already received", seq=t.seq, peer=self.peer)
            self.pending[t.seq] = t
            self._parked[t.seq] = (t, count, ntype, ready)
            while self._next_recv in self._parked:
                job = self._parked.pop(self._next_recv)
                self.worker.submit(self._enqueue, job[0], "recv", *job[1:])
                self._next_recv += 1

    def wait(self, t: Transfer, deadline: float) -> None:
        """Until ``t`` completes on the device; at the deadline the link is aborted."""
        if not t.enqueued.wait(max(0.0, deadline - time.monotonic())):
            if self.rank == 1 and t.seq > self._next_recv:
                self.fail(
                    f"receive {t.seq} waited for tensor {self._next_recv} of this link, "
                    "whose envelope never arrived"
                )
            else:
                self.fail(f"transfer {t.seq} was never started (an earlier one is stuck)")
        elif (
            t.error is None and t.done_event is not None and not _wait_event(t.done_event, deadline)
        ):
            what = "send" if self.rank == 0 else "receive"
            self.fail(
                f"{what} {t.seq} did not complete in {self.timeout_s:g} s: "
                "the peer died or never took it"
            )
        if t.error is not None:
            self.settle(t)
            raise t.error
        self.settle(t)

    def settle(self, t: Transfer) -> None:
        with self.lock:
            t.settled = True
            t.array = None
            self.pending.pop(t.seq, None)

    def fail(self, reason: str) -> None:
        """Abort the communicator and fail everything still on the link."""
        with self.lock:
            if self.failed is None:
                self.failed = TransportError(
                    reason, peer=self.peer, generation=self.generation, endpoint=self.endpoint.id
                )
            err = self.failed
            comm, self.comm = self.comm, None
            pending = list(self.pending.values()) + [job[0] for job in self._parked.values()]
            self._parked.clear()
        if comm is not None:
            try:
                comm.abort()
            except Exception:  # noqa: BLE001 - already broken is fine
                logger.exception("ncclCommAbort failed")
        for t in pending:
            t.fail(err)
        self.opened.fail(err)
        logger.warning("NCCL link %s aborted: %s", self.peer, reason)

    def sweep(self, now: float) -> None:
        """Watchdog: let go of completed sends, abort on a transfer past its deadline."""
        with self.lock:
            items = list(self.pending.values())
        for t in items:
            if t.error is not None:
                continue
            if t.complete():
                if self.rank == 0:  # receives are settled by their caller
                    self.settle(t)
            elif now > t.deadline:
                self.fail(f"transfer {t.seq} passed its deadline ({self.timeout_s:g} s)")
                return

    def close(self) -> None:
        with self.lock:
            comm, self.comm = self.comm, None
            if self.failed is None:
                self.failed = TransportError("link closed", peer=self.peer)
        if comm is not None:
            with contextlib.suppress(Exception):
                comm.destroy()
        self.worker.shutdown(wait=False, cancel_futures=True)


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
        import cupy

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
        from cupy.cuda import nccl

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
        import ray

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
        import cupy

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
        import cupy

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
        import cupy

        results = []
        with cupy.cuda.Device(self.device):
            caller = cupy.cuda.get_current_stream()
            for link, t, out, meta in self.posted:
                link.wait(t, self.deadline)
                if t.done_event is not None:
                    caller.wait_event(t.done_event)
                results.append((out, meta))
        return results
