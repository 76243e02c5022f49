"""One NCCL link: a two-rank communicator between two endpoints, in one direction.

Rank 0 sends, rank 1 receives. The sending endpoint (``nccl.py``) makes a unique id and
publishes it in the rendezvous, a named Ray actor (below); the receiving endpoint fetches it
on the first envelope of the link's generation. Both then open the link:

1. Both ends create their rank of the communicator on the link's own worker thread (NCCL
   init blocks until both ranks have joined), then exchange one warm-up value, which also
   sets up NCCL's point-to-point connection before any payload waits on it.
2. Each ``send`` / ``recv`` is enqueued by that one worker thread, in sequence order, on
   the link's own stream. The sender's stream waits on an event recorded on the caller's
   stream (the tensor is ready); the caller's stream waits on the receive's completion
   event. Streams hand over through events only.

Nothing hangs: every transfer has a deadline. A send or receive that has not completed by
then -- the peer died, or its envelope never arrived -- aborts the communicator
(``ncclCommAbort``) and fails every transfer still on the link with ``TransportError``;
the endpoint opens a new link under a new generation on next use. The endpoint's watchdog
calls ``Link.sweep`` to enforce deadlines of sends nobody waits for and to let go of
tensors once their send has completed.

Limit: a peer that never joins leaves the init call blocked in its thread (cupy offers only
the blocking ``ncclCommInitRank``); the caller gets its ``TransportError`` at the deadline
and the next use opens a fresh link, but that one thread stays parked.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import time
from typing import Any, Protocol

import numpy as np
import ray

from ..errors import InvalidInput, TransportError
from ..threads import thread_pool
from .base import DTYPES


class Endpoint(Protocol):
    """What a link uses of its endpoint (``nccl.NcclEndpoint``): the device it runs on and
    its id (named in errors)."""

    device: int
    id: str

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
    from cupy.cuda import nccl  # optional: cupy

    return int(getattr(nccl, NCCL_TYPES[name]))


# --------------------------------------------------------------------------- rendezvous


class Rendezvous:
    """A named Ray actor that hands unique ids from the sending end to the receiving end."""

    def __init__(self) -> None:

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

    actor = ray.remote(num_cpus=0)(Rendezvous)
    return actor.options(
        name=RENDEZVOUS_NAME,
        namespace=RENDEZVOUS_NAMESPACE,
        lifetime="detached",
        get_if_exists=True,
    ).remote()


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
        endpoint: Endpoint,
        peer: str,
        generation: int,
        rank: int,
        unique_id: tuple,
        timeout_s: float,
    ) -> None:
        import cupy  # optional: cupy

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
        import cupy  # optional: cupy
        from cupy.cuda import nccl  # optional: cupy

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
        import cupy  # optional: cupy

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
