"""Preprocessing throughput and its CPU cost: JPEG decode + resize to ResNet-50's input.

    python benchmarks/bench_decode.py [--out benchmarks/results/decode.json] [--seconds 3]
        [--corpus chelsea,photos] [--batches 4,16,64] [--threads 1,4,8]
        [--backends auto,hardware,hardware@0.6,cuda,hybrid] [--procs 1,8] [--mps] [--no-peer]
        [--peer-decoders torchvision,nvimgcodec] [--rounds 1,2] [--in-flight 2]

The JPEGs of ``bench_e2e``'s corpora (``loadtest.corpus``: ``chelsea``, one 451x300 photo,
quality 90; ``photos``, 16 photos of 640x480 to 1920x1080, quality 85), ``batch`` of them a
call, made into uint8 224x224x3 batches by:

* ``cpu_simplejpeg_<t>t``: Ferry's CPU stage (``PreprocessStage``): simplejpeg at the
  smallest DCT scale that suffices, Pillow's bilinear resize and centre crop, on ``t``
  worker threads. The baseline, and what a Ray Serve replica can do without a GPU.
* ``gpu_<backend>``: Ferry's GPU stage fused into the inference replica
  (``PreprocessGpuStage(local=True)``): nvImageCodec decodes the call's JPEGs on the GPU
  (nvJPEG's hardware engines, its CUDA decoder, or hybrid; ``hardware@0.6``: the engines
  take 0.6 of each call, the CUDA decoder the rest), the antialiased resize
  kernel fits them into one device batch; two calls in flight (``--in-flight``), one
  decode round at a time (``--rounds 1,2``: also with two at once, each its own decoder,
  ``preprocess.decode_rounds``: ``gpu_<backend>_r2``).
* ``peer_torchvision``: the expert Ray Serve peer's own code for the same step
  (``benchmarks/peers/rayserve_expert.ExpertCore``: torchvision's batched
  ``decode_jpeg(..., device="cuda")`` -- nvJPEG's hardware engines for baseline JPEGs --
  then an antialiased resize and crop per group of same-sized images), one call at a time
  as its replica's GPU thread runs it, each waited for. Where torch, torchvision or CUDA
  is missing, or with ``--no-peer``, it has no row. ``--peer-decoders nvimgcodec`` adds
  ``peer_nvimgcodec`` (the peer's nvImageCodec form); with ``--procs 8`` each peer row is
  also run in 8 processes (``peer_torchvision_x8p``), as its 8 replicas share the GPU, and
  each ``gpu_<backend>_x8p`` row is set against it.

``--procs 8`` also runs each GPU row in 8 processes at once, each its own decoder and CUDA
context on the one GPU, started together (``gpu_<backend>_x8p``: their images a second
summed, their CPU over their images): Ferry's 8 replicas sharing a GPU, without Serve --
end to end their nvImageCodec threads took 0.5-3.1 ms of CPU an image (``e2e.json``, H200
and H100 runs), the decoder alone in one process 0.18-0.22. ``--mps`` runs everything under
a CUDA MPS server; ``--host-wait auto,sleep`` runs each N-process row with CUDA's default
host waits (a spinning thread while a process has fewer contexts than cores) and with
sleeping ones.

The batch size matters on the GPU: Ferry's replica decodes what arrived during its last
round (a few images a call at 64 clients), the peer a whole ``@serve.batch`` (up to 128).

``cpu_ms_per_img`` is the process's CPU time (all its threads: user + system) per image.
On a node whose cores are the end-to-end limit that is the number that matters: at the
same throughput it is how many cores preprocessing takes from the HTTP and Serve work.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import table, write_json  # noqa: E402
from benchmarks.decode_rows import Rows, add_row, ratios, result_doc  # noqa: E402
from loadtest.corpus import corpus  # noqa: E402


def _config(gpu: bool = False, host_wait: str = "auto", **pre):
    from pipeline.config import PipelineConfig

    return PipelineConfig.model_validate(
        {
            "models": [{"name": "resnet50", "arch": "resnet50"}],
            "executor": {"backend": "cupy" if gpu else "numpy", "host_wait": host_wait},
            "preprocess": pre,
            "placement": "split",  # decoding in the process that owns the executor
            "inference_deployment": {"num_gpus": 1 if gpu else 0},
        }
    )


async def _rate(run, items, seconds: float, in_flight: int, ready=None) -> tuple[float, float, int]:
    """(img/s, CPU ms per image, images) of calling ``run(items)`` with ``in_flight``
    calls outstanding for about ``seconds``; ``ready()`` between the warm-up and the span."""
    for _ in range(2):
        await run(items)
    if ready is not None:
        ready()
    done = 0
    t0, c0 = time.perf_counter(), time.process_time()

    async def worker():  # one call at least, however late it starts
        nonlocal done
        while True:
            rows = await run(items)
            assert not rows.errors, rows.errors
            done += len(rows.owner)
            if time.perf_counter() - t0 >= seconds:
                break

    await asyncio.gather(*(worker() for _ in range(in_flight)))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return done / wall, cpu * 1e3 / max(1, done), done


def _stage(path: str, host_wait: str = "auto", rounds: int = 1):
    """The decode stage a row measures: ``cpu_<t>t``, Ferry's CPU stage on ``t`` threads;
    else Ferry's GPU decode stage (``local``) for backend ``path`` (``hardware@0.6``: the
    engines' share) with the process's CUDA host waits (``executor.host_wait``: it holds
    from the process's first context on) and ``rounds`` decode rounds at once
    (``preprocess.decode_rounds``: each its own decoder)."""
    from pipeline.stages.decode import PreprocessStage
    from pipeline.stages.preprocess_gpu import PreprocessGpuStage

    if path.startswith("cpu_"):
        return PreprocessStage(_config(threads=int(path[4:].rstrip("t"))))
    kind, _, load = path.partition("@")
    share = {"gpu_decode_hw_load": float(load)} if load else {}
    cfg = _config(
        True,
        host_wait,
        decoder="nvimgcodec",
        gpu_decode_backend=kind,
        threads=4,
        decode_rounds=rounds,
        **share,
    )
    return PreprocessGpuStage(cfg, 0, local=True)


def _stage_rate(
    path: str,
    items: list,
    seconds: float,
    host_wait: str = "auto",
    ready=None,
    rounds: int = 1,
    in_flight: int = 2,
) -> tuple[float, float, int]:
    """``_rate`` of a new ``_stage(path, host_wait, rounds)``, ``in_flight`` calls
    outstanding; the stage is closed after."""
    core = _stage(path, host_wait, rounds)
    try:
        run = lambda it: core.run("resnet50", it)  # noqa: E731
        return asyncio.run(_rate(run, items, seconds, in_flight, ready))
    finally:
        core.close()


def _items(name: str, batch: int) -> list:
    """``batch`` of corpus ``name``'s JPEGs as the decode stages take them."""
    from pipeline.models.repository import model_card
    from pipeline.stages.messages import Encoded

    target = model_card(_config().models[0]).target()
    c = corpus(name)
    checked = [Encoded.checked(b, "image/jpeg", target, 1 << 31, 1 << 36) for b in c.bodies]
    return [checked[i % len(checked)] for i in range(batch)]


def _one_of_many(
    backend: str, wait: str, name: str, batch: int, seconds: float, start, out, stage: dict
) -> None:
    """One of ``--procs``' processes: its warm-up, then the span once all are warm
    (``peer_<decoder>``: the peer's decode and resize, else Ferry's stage ``backend`` with
    ``stage``'s rounds and calls in flight)."""
    if backend.startswith("peer_"):
        bodies = _bodies(name, batch)
        out.put(_peer_rate(bodies, seconds, backend[len("peer_") :], start.wait))
        return
    out.put(_stage_rate(backend, _items(name, batch), seconds, wait, start.wait, **stage))


def _many_rate(
    backend: str,
    name: str,
    batch: int,
    seconds: float,
    procs: int,
    wait: str = "auto",
    rounds: int = 1,
    in_flight: int = 2,
):
    """(img/s, CPU ms per image, images) of ``procs`` processes decoding at once, each as
    ``_rate`` (or ``_peer_rate``, for ``peer_<decoder>``) does, with host waits ``wait``
    (and Ferry's stage ``rounds`` rounds at once, ``in_flight`` calls outstanding); their
    spans start together (a barrier after every warm-up)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    start, out = ctx.Barrier(procs), ctx.Queue()
    stage = {"rounds": rounds, "in_flight": in_flight}
    args = (backend, wait, name, batch, seconds, start, out, stage)
    ps = [ctx.Process(target=_one_of_many, args=args) for _ in range(procs)]
    for p in ps:
        p.start()
    got = [out.get(timeout=seconds + 300) for _ in ps]
    for p in ps:
        p.join(60)
    done = sum(n for _, _, n in got)
    cpu = sum(ms * n for _, ms, n in got)
    return sum(r for r, _, _ in got), cpu / max(1, done), done


def _bodies(name: str, batch: int) -> list[bytes]:
    """``batch`` of corpus ``name``'s JPEG bodies, as the peer takes them."""
    c = corpus(name)
    return [c.bodies[i % len(c.bodies)] for i in range(batch)]


def _peer_rate(
    bodies: list[bytes], seconds: float, decoder: str = "torchvision", ready=None
) -> tuple[float, float, int]:
    """(img/s, CPU ms per image, images) of the expert peer's decode (``decoder``:
    ``expert_decoders``) and resize of ``bodies``, call after call on one thread as its
    replica's GPU thread runs them: each call's nvJPEG decode waits for its own stream, its
    resize is not waited for (the next call's decode overlaps it), and the span ends when
    the device has finished; ``ready()`` between the warm-up and the span."""
    import torch

    from benchmarks.peers.rayserve_expert import ExpertCore, bucket_of

    core = ExpertCore(compile=False, decoder=decoder)  # the model is not run here: no compile
    x = core.inputs[bucket_of(len(bodies), core.buckets)]

    def once() -> int:
        n = len(core._fill(core._decode(bodies), x))
        assert n == len(bodies), f"the peer decoded {n} of {len(bodies)}"
        return n

    for _ in range(2):
        once()
    torch.cuda.synchronize()
    if ready is not None:
        ready()
    done, t0, c0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        done += once()
    torch.cuda.synchronize()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return done / wall, cpu * 1e3 / max(1, done), done


def _peer_available() -> bool:
    try:
        import torch
        import torchvision  # noqa: F401
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/decode.json")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--corpus", default="chelsea", help="loadtest.corpus names, comma-separated")
    ap.add_argument("--batches", default="64", help="images per call, comma-separated")
    ap.add_argument("--threads", default="1,4,8", help="CPU stage thread counts")
    ap.add_argument("--backends", default="auto,hardware,cuda,hybrid")
    ap.add_argument("--procs", default="1", help="GPU rows' process counts, comma-separated")
    ap.add_argument(
        "--rounds",
        default="1",
        help="preprocess.decode_rounds of the GPU rows, comma-separated (_r<N> in a row's "
        "path where N > 1)",
    )
    ap.add_argument("--in-flight", type=int, default=2, help="calls outstanding a process")
    ap.add_argument("--mps", action="store_true", help="under a CUDA MPS server")
    ap.add_argument(
        "--host-wait",
        default="auto",
        help="executor.host_wait of the --procs processes, comma-separated (auto,sleep: "
        "each N-process row in both; _sleep ends a row's path where it is not auto)",
    )
    ap.add_argument("--no-peer", action="store_true", help="no peer_<decoder> rows")
    ap.add_argument(
        "--peer-decoders",
        default="torchvision",
        help="the peer's decoders (expert_decoders: torchvision,nvimgcodec), comma-separated",
    )
    args = ap.parse_args()
    from benchmarks.mps import mps_server

    corpora = [corpus(c) for c in args.corpus.split(",") if c]
    with mps_server(args.mps) as on:

        def save(rows: list, complete: bool = False) -> None:
            """The JSON of ``rows`` with their ratios; ``complete``: every row asked for."""
            rows = copy.deepcopy(list(rows))
            ratios(rows)
            write_json(args.out, result_doc(args, corpora, on, rows, complete))

        rows = _measure(args, corpora, Rows(save))
    ratios(rows)
    cols = [
        "corpus",
        "batch",
        "path",
        "img_s",
        "cpu_ms_per_img",
        "img_s_vs_cpu_1t",
        "img_s_vs_peer",
    ]
    print(table(rows, cols))
    save(rows, complete=True)
    return 0


def _measure(args: argparse.Namespace, corpora: list, rows: Rows) -> Rows:
    """Every row the arguments ask for, of ``corpora`` (``--corpus``), added to ``rows``."""
    from pipeline import gpu_decode

    gpu = gpu_decode.available()
    if not gpu:
        print("nvImageCodec is not installed: no gpu_ rows")
    peer = not args.no_peer and _peer_available()
    for c in corpora:
        for batch in [int(x) for x in args.batches.split(",") if x]:
            bodies = _bodies(c.name, batch)
            items = _items(c.name, batch)
            for t in [int(x) for x in args.threads.split(",") if x]:
                got = _stage_rate(f"cpu_{t}t", items, args.seconds, in_flight=args.in_flight)
                add_row(rows, f"cpu_simplejpeg_{t}t", c.name, batch, got)
            for b, r in [(b, r) for b in _list(args.backends) for r in _list(args.rounds)]:
                if not gpu:
                    break
                stage = {"rounds": int(r), "in_flight": args.in_flight}
                path = f"gpu_{b}" + ("" if r == "1" else f"_r{r}")
                for n in [int(x) for x in _list(args.procs)]:
                    if n == 1:
                        got = _stage_rate(b, items, args.seconds, **stage)
                        add_row(rows, path, c.name, batch, got)
                        continue
                    for w in _list(args.host_wait):
                        got = _many_rate(b, c.name, batch, args.seconds, n, w, **stage)
                        tail = "" if w == "auto" else f"_{w}"
                        add_row(rows, f"{path}_x{n}p{tail}", c.name, batch, got)
            if peer and batch > 128:
                print(f"no peer row at {batch} a call: the peer's batches stop at 128")
            elif peer:
                _peer_rows(rows, args, c.name, bodies)
    return rows


def _list(arg: str) -> list[str]:
    """A comma-separated argument's items."""
    return [x for x in arg.split(",") if x]


def _peer_rows(rows: Rows, args: argparse.Namespace, name: str, bodies: list[bytes]) -> None:
    """The peer's rows of one corpus and batch: each of ``--peer-decoders`` in each of
    ``--procs`` processes (``peer_<decoder>``, ``peer_<decoder>_x<N>p``)."""
    for dec in [x for x in args.peer_decoders.split(",") if x]:
        for n in [int(x) for x in args.procs.split(",") if x]:
            path = f"peer_{dec}" + ("" if n == 1 else f"_x{n}p")
            try:
                if n == 1:
                    measured = _peer_rate(bodies, args.seconds, dec)
                else:
                    measured = _many_rate(f"peer_{dec}", name, len(bodies), args.seconds, n)
            except Exception as exc:  # the peer's failure must not lose Ferry's rows
                print(f"{path} failed on {name} x{len(bodies)}: {exc!r}")
            else:
                add_row(rows, path, name, len(bodies), measured)


if __name__ == "__main__":
    sys.exit(main())
