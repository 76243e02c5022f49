"""Moving a GPU tensor between two actors on two GPUs: raw NCCL, Ferry's NCCL channel (over
NVLink and over NCCL's socket transport), and the object store, all in one run.

    python benchmarks/bench_transport.py [--out benchmarks/results/transport.json] [--quick]

Needs two CUDA devices and Ray. Each path moves a uint8 tensor of 1, 16, 64 and 512 MB
from an actor on GPU 0 to an actor on GPU 1:

* ``nccl_raw``: cupy's ``NcclCommunicator.send`` / ``recv`` on one stream, no Ray calls:
  the ceiling, and the peer the channel is compared with.
* ``ferry_nccl``: ``NcclSender.send`` -> envelope in a Ray call -> ``NcclReceiver.recv``
  (a fresh tensor from the receiver's pool, checked against the envelope, handed over).
* ``ferry_nccl_socket``: the same with ``NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1``: NCCL's
  network transport over TCP, standing in for two nodes without RDMA.
* ``object_store``: device to host, ``ray.put``, envelope, ``ray.get``, host to device.

``gb_s`` streams ``k`` transfers with all of them in flight; the Ferry paths carry their
envelopes 16 to a Ray call (``recv_many`` posts all 16 receives before waiting), as Ferry's
hops carry batches, and ``gb_s_one_envelope_per_call`` is the same with one envelope per
call. ``p50_us`` is the median of transfers made one at a time, from the send call until
the receiving end holds the tensor (the Ray call included for the Ferry paths).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import machine, table, today, write_json  # noqa: E402

MB = 1 << 20
SIZES = [1 * MB, 16 * MB, 64 * MB, 512 * MB]
# (streamed k, one-at-a-time k) per size, per kind of path
K_FAST = {1 * MB: (400, 50), 16 * MB: (200, 30), 64 * MB: (160, 20), 512 * MB: (40, 6)}
K_SLOW = {1 * MB: (40, 20), 16 * MB: (16, 8), 64 * MB: (8, 5), 512 * MB: (3, 3)}
PER_CALL = 16  # envelopes per Ray call when streaming: hops carry batches
SOCKET_ENV = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_IB_DISABLE": "1"}


def row(path: str, nbytes: int, streamed: dict, single: dict, k: int) -> dict:
    lat = np.array(single["lat_s"]) * 1e6
    return {
        "bytes": nbytes,
        "path": path,
        "gb_s": nbytes * k / streamed["seconds"] / 1e9,
        "p50_us": float(np.percentile(lat, 50)),
        "p99_us": float(np.percentile(lat, 99)),
        "k_streamed": k,
        "k_single": len(lat),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/transport.json")
    ap.add_argument("--quick", action="store_true", help="fewer transfers (a smoke run)")
    args = ap.parse_args()

    import ray
    from cupy.cuda import nccl

    from benchmarks.transport_peers import peer_actor

    scale = 4 if args.quick else 1
    ray.init(num_gpus=2, include_dashboard=False, log_to_driver=True)
    rows: list[dict] = []
    t_start = time.time()

    def progress(msg: str) -> None:
        print(f"[{time.time() - t_start:6.1f}s] {msg}", flush=True)

    # ---------------------------------------------------------------- raw NCCL
    a, b = peer_actor(), peer_actor()
    gpu_a, gpu_b = ray.get([a.gpu.remote(), b.gpu.remote()])
    assert (gpu_a["uuid"], gpu_a["visible"]) != (gpu_b["uuid"], gpu_b["visible"]), (gpu_a, gpu_b)
    progress(f"peers on GPUs {gpu_a} and {gpu_b}")
    uid = nccl.get_unique_id()
    ray.get([a.raw_open.remote(uid, 0), b.raw_open.remote(uid, 1)])
    for n in SIZES:
        k, k1 = (max(2, x // scale) for x in K_FAST[n])
        streamed = ray.get([a.raw_run.remote(0, n, k, False), b.raw_run.remote(1, n, k, False)])[1]
        single = ray.get([a.raw_run.remote(0, n, k1, True), b.raw_run.remote(1, n, k1, True)])[1]
        rows.append(row("nccl_raw", n, streamed, single, k))
        progress(f"nccl_raw {n // MB} MB: {rows[-1]['gb_s']:.1f} GB/s")
    ray.get([a.raw_close.remote(), b.raw_close.remote()])

    # ---------------------------------------------------------------- Ferry's channel
    def channel(path: str, tx, rx) -> None:
        rx_id = ray.get(rx.endpoint_id.remote())
        ray.get(tx.timed_send.remote(rx_id, rx, MB, 4, True))  # opens the link
        for n in SIZES:
            k, k1 = (max(2, x // scale) for x in (K_FAST if path == "ferry_nccl" else K_SLOW)[n])
            ray.get(tx.timed_send.remote(rx_id, rx, n, k, False, PER_CALL))  # pools grow here
            streamed = ray.get(tx.timed_send.remote(rx_id, rx, n, k, False, PER_CALL))
            single = ray.get(tx.timed_send.remote(rx_id, rx, n, k1, True))
            one_each = ray.get(tx.timed_send.remote(rx_id, rx, n, k, False, 1))
            rows.append(row(path, n, streamed, single, k))
            rows[-1]["gb_s_one_envelope_per_call"] = n * k / one_each["seconds"] / 1e9
            progress(f"{path} {n // MB} MB: {rows[-1]['gb_s']:.1f} GB/s")

    channel("ferry_nccl", a, b)

    # ---------------------------------------------------------------- object store
    ray.get(a.timed_object_store.remote(b, MB, 2, True))
    for n in SIZES:
        k, k1 = (max(2, x // scale) for x in K_SLOW[n])
        ray.get(a.timed_object_store.remote(b, n, 2, False))
        streamed = ray.get(a.timed_object_store.remote(b, n, k, False))
        single = ray.get(a.timed_object_store.remote(b, n, k1, True))
        rows.append(row("object_store", n, streamed, single, k))
        progress(f"object_store {n // MB} MB: {rows[-1]['gb_s']:.2f} GB/s")
    ray.kill(a)
    ray.kill(b)
    time.sleep(1.0)

    # ---------------------------------------------------------------- socket transport
    a2, b2 = peer_actor(SOCKET_ENV), peer_actor(SOCKET_ENV)
    channel("ferry_nccl_socket", a2, b2)

    def gb(path: str, n: int) -> float:
        return next(r["gb_s"] for r in rows if r["path"] == path and r["bytes"] == n)

    ratios = []
    for n in SIZES:
        ratios.append(
            {
                "bytes": n,
                "ferry_nccl_vs_raw": gb("ferry_nccl", n) / gb("nccl_raw", n),
                "ferry_nccl_vs_object_store": gb("ferry_nccl", n) / gb("object_store", n),
                "ferry_nccl_socket_vs_object_store": gb("ferry_nccl_socket", n)
                / gb("object_store", n),
            }
        )
    goals = {
        "ferry_nccl >= 0.8x nccl_raw at >= 64 MB": all(
            r["ferry_nccl_vs_raw"] >= 0.8 for r in ratios if r["bytes"] >= 64 * MB
        ),
        "ferry_nccl >= 10x object_store at 64 MB": next(
            r["ferry_nccl_vs_object_store"] for r in ratios if r["bytes"] == 64 * MB
        )
        >= 10,
    }
    write_json(
        args.out,
        {
            "machine": machine(),
            "date": today(),
            "gpus": [gpu_a, gpu_b],
            "method": "uint8 tensors GPU0 -> GPU1; gb_s: k transfers in flight; p50_us: one at a "
            "time, send call to tensor held by the receiver",
            "rows": rows,
            "ratios": ratios,
            "goals": goals,
        },
    )
    for r in rows:
        r["MB"] = r["bytes"] // MB
    print(table(rows, ["path", "MB", "gb_s", "p50_us", "p99_us", "k_streamed"]))
    print(table(ratios, list(ratios[0])))
    print(goals)
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
