"""The timing harnesses of ``bench_models.py``: Ferry's executor and the torch peers, each
from pinned host uint8 batches with ``IN_FLIGHT`` batches out, driven by one thread.

* ``ferry_driver``: prepare + commit in a loop, waiting on the oldest result once
  ``IN_FLIGHT`` are out. ``staged`` (the default) writes the batch into each pinned slot
  once and commits the slot's own rows (``PreparedBatch.staging``), as the peers replay from
  their pinned buffers; unstaged copies a numpy batch into the slot per commit (what a
  producer without access to the slot pays). ``pool=True`` submits from ``IN_FLIGHT``
  threads as the inference stage does (the earlier harness; kept for the diagnostics).
* ``torch_driver``: ``IN_FLIGHT`` torch streams, each with a pinned uint8 buffer, a device
  input and (``graphs``) a CUDA graph of copy-normalise-model; round-robin, one batch in
  flight per stream.

``interleaved`` times several systems at one batch size window by window in turn: each
rate is the median of its three windows after a short warm-up; ``spread`` is
(max - min) / median of the three. Beside each rate, the host's cost per batch:

* ``host_us_per_batch`` -- CPU time of the thread that drives the loop, per batch, with its
  waits on the device left out: for Ferry the whole step (prepare + commit, and the
  finishing of the batch it waits for, which that thread does itself; its event wait
  sleeps, so it costs no CPU time), for the torch peers the enqueue (copy in, replay, copy
  out, event record; their event wait spins, so it is left out by timing around it);
* ``cpu_us_per_batch`` -- CPU time of the whole process (every thread) per batch, waits
  included as they are: torch's spin counts here, Ferry's sleep does not.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import numpy as np

IN_FLIGHT = 3
WARM_S = 0.25


class HostClock:
    """CPU seconds the driving thread spent in the host part of its steps."""

    def __init__(self) -> None:
        self.s = 0.0

    def __enter__(self) -> HostClock:
        self._t0 = time.thread_time()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.s += time.thread_time() - self._t0


class Driver:
    """One system's loop: ``step()`` enqueues a batch (waiting on the oldest once
    ``IN_FLIGHT`` are out), ``drain()`` waits for all, ``close()`` tidies up; ``host``
    counts the host part of the steps and drains (``host_us_per_batch``), None where the
    work is on other threads."""

    def __init__(
        self, step: Any, drain: Any, close: Any = None, host: HostClock | None = None
    ) -> None:
        self.step, self.drain, self.close = step, drain, close or (lambda: None)
        self.host = host


def _us(s: float, n: int) -> float | None:
    return round(1e6 * s / n, 1) if n else None


def interleaved(drivers: dict[str, Driver], batch: int, seconds: float) -> dict[str, dict]:
    """{name: {img_s (the median), spread, host_us_per_batch, cpu_us_per_batch}}: each
    driver warmed up, then three rounds in which every driver runs one window of
    ``seconds / 3`` in turn (the order rotating), so a drift of the GPU's clocks falls on
    every system alike; the host figures are over the three windows."""
    names = list(drivers)
    for d in drivers.values():
        t_end = time.perf_counter() + WARM_S
        while time.perf_counter() < t_end:
            d.step()
        d.drain()
    rates: dict[str, list[float]] = {n: [] for n in names}
    cost = {n: [0.0, 0.0, 0] for n in names}  # host s, process CPU s, batches
    for r in range(3):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            d = drivers[name]
            h0 = d.host.s if d.host else 0.0
            n, t0, c0 = 0, time.perf_counter(), time.process_time()
            while time.perf_counter() - t0 < seconds / 3:
                d.step()
                n += 1
            d.drain()
            rates[name].append(n * batch / (time.perf_counter() - t0))
            c = cost[name]
            c[0] += (d.host.s if d.host else 0.0) - h0
            c[1] += time.process_time() - c0
            c[2] += n
    out = {}
    for name, rs in rates.items():
        rs.sort()
        host_s, cpu_s, n = cost[name]
        out[name] = {
            "img_s": rs[1],
            "spread": (rs[2] - rs[0]) / rs[1],
            "host_us_per_batch": _us(host_s, n) if drivers[name].host else None,
            "cpu_us_per_batch": _us(cpu_s, n),
        }
    return out


def timed(d: Driver, batch: int, seconds: float) -> dict:
    return interleaved({"one": d}, batch, seconds)["one"]


def agree(top1: np.ndarray, ref: np.ndarray) -> float:
    return round(float((top1 == ref).mean()), 4)


def chunks(u8: np.ndarray, b: int) -> list[np.ndarray]:
    """The photos in batches of exactly ``b`` (the last padded with the first photos)."""
    n = -(-len(u8) // b) * b
    padded = np.concatenate([u8, u8[np.arange(n - len(u8)) % len(u8)]])
    return [padded[i : i + b] for i in range(0, n, b)]


def random_batch(batch: int) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (batch, 224, 224, 3), dtype=np.uint8)


def ferry_driver(
    ex: Any, name: str, batch: int, staged: bool = True, pool: bool = False, bounded: bool = False
) -> tuple[Driver, Any]:
    """Ferry's executor at ``batch``, and a function of the facts of the run so far: the
    captures and eager runs since the start (0 once warmed up) and the wall time of
    prepare + commit per batch (``submit_wall_us_per_batch``). Its waits have no timeout:
    a thread that waits so blocks on the batch's event itself and finishes it (one
    wake-up), as torch's loop does; ``bounded`` waits with a timeout, which goes through
    the completion thread (two wake-ups: the earlier design, for the diagnostics)."""
    spec = ex.plan(name, batch).input_spec  # uint8 [N, H, W, C] of the image feed
    x = np.random.default_rng(0).integers(0, 256, spec.shape, dtype=spec.np_dtype)
    if staged:  # every slot of the ring gets the batch once; it stays there
        held = [ex.prepare(name, batch) for _ in range(ex.ring.slots)]
        for p in held:
            p.staging()[:] = x
        for r in [ex.commit(p, p.staging()) for p in held]:
            r.wait(60)
    before = ex.stats()
    out: deque = deque()
    host = [0.0, 0]

    def submit() -> Any:
        t0 = time.perf_counter()
        p = ex.prepare(name, batch)
        r = ex.commit(p, p.staging() if staged else x)
        host[0] += time.perf_counter() - t0
        host[1] += 1
        return r

    def facts() -> dict:
        after = ex.stats()
        return {
            "captures_timed": after["captures"] - before["captures"],
            "eager_runs_timed": after["eager_runs"] - before["eager_runs"],
            "submit_wall_us_per_batch": round(1e6 * host[0] / max(host[1], 1), 1),
        }

    if not pool:
        clock, limit = HostClock(), 60.0 if bounded else None

        def step() -> None:
            with clock:
                if len(out) >= IN_FLIGHT:
                    out.popleft().wait(limit)
                out.append(submit())

        def drain() -> None:
            with clock:
                while out:
                    out.popleft().wait(limit)

        return Driver(step, drain, host=clock), facts
    return _pool_driver(submit, out), facts


def _pool_driver(submit: Any, out: deque) -> Driver:
    """``submit`` run on ``IN_FLIGHT`` threads, as the inference stage submits."""
    from concurrent.futures import ThreadPoolExecutor

    workers = ThreadPoolExecutor(IN_FLIGHT, thread_name_prefix="bench-submit")

    def pstep() -> None:
        if len(out) >= IN_FLIGHT:
            out.popleft().result().wait(60)
        out.append(workers.submit(submit))

    def pdrain() -> None:
        while out:
            out.popleft().result().wait(60)

    return Driver(pstep, pdrain, workers.shutdown)


def ferry_top1(ex: Any, name: str, batch: int, u8: np.ndarray) -> np.ndarray:
    top = [ex.infer(name, c).argmax(1) for c in chunks(u8, batch)]
    return np.concatenate(top)[: len(u8)]


def torch_driver(fn: Any, batch: int, graphs: bool) -> Driver:
    import torch

    dev = torch.device("cuda")
    streams = [torch.cuda.Stream() for _ in range(IN_FLIGHT)]
    host = [torch.from_numpy(random_batch(batch)).pin_memory() for _ in streams]
    dev_in = [torch.empty_like(h, device=dev) for h in host]
    outs, replays = [], []
    with torch.inference_mode():
        for k, s in enumerate(streams):
            with torch.cuda.stream(s):
                dev_in[k].copy_(host[k], non_blocking=True)
                y = fn(dev_in[k]).float()
            torch.cuda.synchronize()
            if graphs:
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, stream=s, capture_error_mode="thread_local"):
                    y = fn(dev_in[k]).float()
                replays.append(g.replay)
            else:
                replays.append(lambda k=k: outs[k].copy_(fn(dev_in[k]).float()))
            outs.append(y)
    out_host = [torch.empty(o.shape, dtype=o.dtype).pin_memory() for o in outs]
    events = [torch.cuda.Event() for _ in streams]
    state = {"i": 0}
    clock = HostClock()

    def step() -> None:
        k = state["i"] % IN_FLIGHT
        state["i"] += 1
        events[k].synchronize()  # (torch's default event: a spinning wait, left out)
        with clock, torch.inference_mode(), torch.cuda.stream(streams[k]):
            dev_in[k].copy_(host[k], non_blocking=True)
            replays[k]()
            out_host[k].copy_(outs[k], non_blocking=True)
            events[k].record()

    return Driver(step, torch.cuda.synchronize, host=clock)


def torch_top1(fn: Any, batch: int, u8: np.ndarray) -> np.ndarray:
    import torch

    top = []
    with torch.inference_mode():
        for c in chunks(u8, batch):
            top.append(fn(torch.from_numpy(c).to("cuda")).argmax(1).cpu().numpy())
    return np.concatenate(top)[: len(u8)]


def eager_fn(model: Any) -> Any:
    import torch

    m = model.half().to(memory_format=torch.channels_last).eval()
    mean = torch.tensor([v * 255 for v in (0.485, 0.456, 0.406)], device="cuda").view(1, 3, 1, 1)
    scale = torch.tensor([1 / (v * 255) for v in (0.229, 0.224, 0.225)], device="cuda").view(
        1, 3, 1, 1
    )

    def fn(x: Any) -> Any:
        y = ((x.permute(0, 3, 1, 2).float() - mean) * scale).half()
        return m(y.contiguous(memory_format=torch.channels_last))

    return fn


def ferry_graphs_only(ex: Any, name: str, batch: int, reps: int = 60) -> dict:
    """The GPU alone: Ferry's captured graphs of ``batch`` replayed back to back, one stream
    (serial) and each on its own stream (as many as are captured), timed with events."""
    import torch

    streams = {s.name: s for s in ex.streams.compute}
    graphs = [
        (streams[k[4]], g)
        for k, (_, g) in ex.bound_graphs.items()
        if k[0] == name and k[1] == batch and k[2] == "image" and g is not None
    ]
    if not graphs:
        return {}
    ex.streams.synchronize()
    s0, g0 = graphs[0]
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ext = torch.cuda.ExternalStream(s0.raw.ptr)
    t0.record(ext)
    for _ in range(reps):
        g0.launch(s0.raw)
    t1.record(ext)
    t1.synchronize()
    serial = reps * batch / (t0.elapsed_time(t1) / 1e3)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        for s, g in graphs:
            g.launch(s.raw)
    torch.cuda.synchronize()
    spread = reps * len(graphs) * batch / (time.perf_counter() - t)
    return {
        "graph_serial_img_s": round(serial, 1),
        "graphs_on_own_streams_img_s": round(spread, 1),
        "graphs": len(graphs),
    }
