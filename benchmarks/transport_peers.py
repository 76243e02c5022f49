"""Ray actors at both ends of a channel, for ``bench_transport`` and ``tests/gpu``.

A ``TensorPeer`` owns one GPU (``num_gpus=1``), an ``NcclEndpoint`` and an object-store
channel. Payloads are made on the device from (seed, shape, dtype) by a fixed byte
pattern, so the receiving end checks them bit for bit without copying them to the host.
It also runs raw cupy NCCL send/recv, the peer the channel is measured against.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np


def pattern(seed: int, shape: tuple[int, ...], dtype: str) -> Any:
    """A deterministic device array whose bytes depend on seed and position."""
    import cupy

    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    i = cupy.arange(nbytes, dtype=cupy.uint64)
    b = (((i * np.uint64(2654435761)) + np.uint64(seed * 40503 + 17)) >> np.uint64(5)).astype(
        cupy.uint8
    )
    return b.view(dtype).reshape(shape)


def same_bytes(a: Any, b: Any) -> bool:
    import cupy

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(cupy.all(a.reshape(-1).view(cupy.uint8) == b.reshape(-1).view(cupy.uint8)))


class TensorPeer:
    """One end. Use through ``ray.remote(num_gpus=1)(TensorPeer)``."""

    def __init__(self, timeout_s: float = 20.0) -> None:
        import cupy

        from pipeline.transport.nccl import NcclEndpoint
        from pipeline.transport.object_store import ObjectStoreReceiver, ObjectStoreSender

        cupy.cuda.Device(0).use()
        self.ep = NcclEndpoint(0, timeout_s=timeout_s)
        self.rx = self.ep.receiver()
        self.os_tx = ObjectStoreSender("bench")
        self.os_rx = ObjectStoreReceiver("bench", to_device=True)
        self.got: list[dict] = []
        self._raw: Any = None
        self._cache: dict[tuple, Any] = {}

    # ------------------------------------------------------------------ identity
    def endpoint_id(self) -> str:
        return self.ep.id

    def gpu(self) -> dict:
        import os

        import cupy

        from pipeline.transport.nccl import device_uuid

        name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
        return {
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "uuid": device_uuid(0),
            "name": name.decode() if isinstance(name, bytes) else name,
        }

    def _payload(self, seed: int, shape: tuple, dtype: str) -> Any:
        key = (seed, tuple(shape), dtype)
        a = self._cache.get(key)
        if a is None:
            a = self._cache[key] = pattern(seed, tuple(shape), dtype)
        return a

    # ------------------------------------------------------------------ channel: sending
    def send(self, dst: str, cases: list[tuple]) -> list:
        """Send each (seed, shape, dtype) case; return the envelopes at once (no waiting)."""
        tx = self.ep.sender(dst)
        return [tx.send(self._payload(s, sh, dt), {"seed": s}) for s, sh, dt in cases]

    def wait(self, dst: str, envelopes: list) -> list[str]:
        tx = self.ep.sender(dst)
        out = []
        for env in envelopes:
            try:
                tx.wait(env)
                out.append("ok")
            except Exception as exc:  # noqa: BLE001 - reported to the test
                out.append(f"{type(exc).__name__}: {exc}")
        return out

    def stream_to(self, dst: str, receiver: Any, n: int, nbytes: int) -> dict:
        """Send ``n`` tensors of ``nbytes``, each envelope to ``receiver.take`` in its own call,
        waiting for each send; stop at the first failure and say when it came."""
        tx = self.ep.sender(dst)
        x = self._payload(1, (nbytes,), "uint8")
        last_ok = time.monotonic()
        for i in range(n):
            env = tx.send(x, {"seed": 1})
            receiver.take.remote(env)
            try:
                tx.wait(env)
            except Exception as exc:  # noqa: BLE001
                return {
                    "sent": i,
                    "error": type(exc).__name__,
                    "message": str(exc),
                    "after_last_ok_s": time.monotonic() - last_ok,
                }
            last_ok = time.monotonic()
        return {"sent": n, "error": None}

    # ------------------------------------------------------------------ channel: receiving
    def take(self, env: Any, check: bool = True) -> dict:
        arr, meta = self.rx.recv(env)
        ok = None
        if check:
            ok = same_bytes(arr, pattern(meta["seed"], env.shape, env.dtype))
        rec = {"seq": env.seq, "seed": meta["seed"], "shape": list(arr.shape), "ok": ok}
        self.got.append(rec)
        return rec

    def take_all(self, envs: list, check: bool = True) -> list[dict]:
        """Several envelopes in one call: every receive is posted before any is waited on."""
        out = []
        for env, (arr, meta) in zip(envs, self.rx.recv_many(envs), strict=True):
            ok = same_bytes(arr, pattern(meta["seed"], env.shape, env.dtype)) if check else None
            out.append({"seq": env.seq, "seed": meta["seed"], "shape": list(arr.shape), "ok": ok})
        self.got.extend(out)
        return out

    def received(self) -> list[dict]:
        return self.got

    def stats(self) -> dict:
        return self.ep.stats()

    # ------------------------------------------------------------------ timed runs
    def timed_send(
        self, dst: str, receiver: Any, nbytes: int, k: int, one_at_a_time: bool, per_call: int = 1
    ) -> dict:
        """Ferry's channel: ``k`` sends, their envelopes ``per_call`` to a Ray call to the
        receiver. Streamed (all in flight), or one at a time (latency: send to received)."""
        import ray

        tx = self.ep.sender(dst)
        x = self._payload(2, (nbytes,), "uint8")
        lat = []
        t0 = time.perf_counter()
        refs, group = [], []
        for _ in range(k):
            t1 = time.perf_counter()
            group.append(tx.send(x, {"seed": 2}))
            if len(group) < per_call and not one_at_a_time:
                continue
            ref = receiver.take_all.remote(group, False)
            group = []
            if one_at_a_time:
                ray.get(ref)
                lat.append(time.perf_counter() - t1)
            else:
                refs.append(ref)
        if group:
            refs.append(receiver.take_all.remote(group, False))
        ray.get(refs)
        return {"seconds": time.perf_counter() - t0, "lat_s": lat}

    def timed_object_store(self, receiver: Any, nbytes: int, k: int, one_at_a_time: bool) -> dict:
        import ray

        x = self._payload(3, (nbytes,), "uint8")
        lat = []
        refs = []
        t0 = time.perf_counter()
        for _ in range(k):
            t1 = time.perf_counter()
            env = self.os_tx.send(x, {"seed": 3})
            ref = receiver.take_object_store.remote(env)
            if one_at_a_time:
                ray.get(ref)
                lat.append(time.perf_counter() - t1)
            else:
                refs.append(ref)
        ray.get(refs)
        return {"seconds": time.perf_counter() - t0, "lat_s": lat}

    def take_object_store(self, env: Any) -> int:
        import cupy

        arr, _ = self.os_rx.recv(env, timeout=120)
        cupy.cuda.get_current_stream().synchronize()
        return int(arr.nbytes)

    # ------------------------------------------------------------------ raw NCCL, the peer
    def raw_open(self, unique_id: tuple, rank: int) -> int:
        from cupy.cuda import nccl

        self._raw = nccl.NcclCommunicator(2, unique_id, rank)
        return rank

    def raw_run(self, rank: int, nbytes: int, k: int, one_at_a_time: bool) -> dict:
        """``k`` raw ncclSend/ncclRecv of ``nbytes`` on one stream, timed on this end."""
        import cupy
        from cupy.cuda import nccl

        comm = self._raw
        stream = cupy.cuda.Stream(non_blocking=True)
        buf = self._payload(4, (nbytes,), "uint8") if rank == 0 else cupy.empty(nbytes, cupy.uint8)
        op = comm.send if rank == 0 else comm.recv
        peer = 1 - rank
        # one exchange first: connects and lines both ends up
        op(buf.data.ptr, nbytes, nccl.NCCL_UINT8, peer, stream.ptr)
        stream.synchronize()
        lat = []
        t0 = time.perf_counter()
        for _ in range(k):
            t1 = time.perf_counter()
            op(buf.data.ptr, nbytes, nccl.NCCL_UINT8, peer, stream.ptr)
            if one_at_a_time:
                stream.synchronize()
                lat.append(time.perf_counter() - t1)
        stream.synchronize()
        return {"seconds": time.perf_counter() - t0, "lat_s": lat}

    def raw_close(self) -> None:
        if self._raw is not None:
            self._raw.destroy()
            self._raw = None


def peer_actor(env_vars: dict[str, str] | None = None, timeout_s: float = 20.0) -> Any:
    """A ``TensorPeer`` actor on a GPU of its own (threaded: takes run concurrently)."""
    import ray

    opts: dict[str, Any] = {"num_gpus": 1, "num_cpus": 1, "max_concurrency": 32}
    if env_vars:
        opts["runtime_env"] = {"env_vars": env_vars}
    return ray.remote(TensorPeer).options(**opts).remote(timeout_s)
