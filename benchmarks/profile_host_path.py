"""Where the executor's host time per batch goes: the model benchmark's Ferry loop
(``bench_models_harness.ferry_driver``: staged batches, 3 in flight, one thread, waits
without a timeout) under cProfile, and the functions that took the most of it.

    python benchmarks/profile_host_path.py --model resnet18 --batch 1 --steps 3000

On the GPU (torch engine, ``compute_streams`` = in flight); on the CPU it profiles the
numpy path of the digits model, or with ``--model tiny`` a two-op ONNX classifier (a 4x4
image pooled to 3 logits) whose compute is next to nothing: the executor's own Python a
batch (prepare, commit, the finish), for A/B pairs of host-path changes with
``--no-profile``. cProfile slows every Python call alike, so read the shares, not the
microseconds.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import bench_models_harness as H  # noqa: E402
from pipeline.config import ExecutorConfig, ModelConfig  # noqa: E402
from pipeline.device import cuda_available  # noqa: E402
from pipeline.executor import GpuExecutor  # noqa: E402


def tiny_entry(folder: str) -> ModelConfig:
    """A two-node ONNX classifier written into ``folder``, [batch, 3, 4, 4] pooled to
    [batch, 3] logits (next to no compute a batch), as a model entry: a 4x4 image, pixels
    scaled to [0, 1] and not normalised further, so its logits are each channel's mean."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])
    nodes = [
        helper.make_node("GlobalAveragePool", ["x"], ["p"]),
        helper.make_node("Flatten", ["p"], ["y"], axis=1),
    ]
    graph = helper.make_graph(nodes, "tiny", [x], [y])
    path = os.path.join(folder, "tiny.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    image = {"height": 4, "width": 4, "mean": (0.0,) * 3, "std": (1.0,) * 3}
    return ModelConfig(name="tiny", engine="onnx", source=path, input=image)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument(
        "--batch-wait", choices=("sleep", "spin"), default="spin", help="executor.batch_wait"
    )
    ap.add_argument("--no-profile", action="store_true", help="time the steps without cProfile")
    args = ap.parse_args(argv)
    gpu = cuda_available()
    ex = GpuExecutor(
        ExecutorConfig(
            backend="cupy" if gpu else "numpy",
            buckets=(args.batch,),
            max_in_flight=H.IN_FLIGHT,
            compute_streams=H.IN_FLIGHT,
            pool_limit_fraction=0.3 if gpu else 0.05,
            batch_wait=args.batch_wait,
        )
    )
    name = args.model if gpu or args.model == "tiny" else "digits"
    # the tiny model's file lives as long as the executor (a precision probe may reload it)
    tmp = tempfile.TemporaryDirectory() if name == "tiny" else None
    if tmp is not None:
        ex.load_entry(tiny_entry(tmp.name))
    elif gpu:
        ex.load_entry(ModelConfig(name=name, engine="torch", source=name))
    else:
        ex.load_model(name, "digits")
    ex.warmup()
    d, facts = H.ferry_driver(ex, name, args.batch)
    for _ in range(300):
        d.step()
    d.drain()
    t0, c0 = time.perf_counter(), time.thread_time()
    prof = cProfile.Profile()
    if not args.no_profile:
        prof.enable()
    for _ in range(args.steps):
        d.step()
    d.drain()
    prof.disable()
    wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    print(
        f"{name} batch {args.batch} ({args.batch_wait}): {args.steps} steps"
        f"{'' if args.no_profile else ' under cProfile'}, "
        f"{1e6 * wall / args.steps:.1f} us wall and {1e6 * cpu / args.steps:.1f} us CPU a step; "
        f"{facts()}"
    )
    if not args.no_profile:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(args.top)
        print(out.getvalue())
    ex.close()
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
