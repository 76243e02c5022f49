"""Models benchmark: the 13 torchvision classifiers (random weights, randomised batch norms) at
batch 1, 32 and 128, fp16 on one GPU, from pinned host uint8 batches, three batches in flight.

Systems (rows ``{"model", "batch", "system", "img_s", "top1_agree", "spread",
"host_us_per_batch", "cpu_us_per_batch"}``; the host figures are defined in
``bench_models_harness.py``):

* ``ferry_torch``   -- Ferry's executor with the torch engine: torch.compile (default mode,
  freezing) in Ferry's CUDA graphs on Ferry's streams (3 compute streams, one per in-flight
  arena), fed from Ferry's pinned ring.
* ``torch_compile`` -- the same compiled function (the very kernels ferry_torch runs: one
  compile per model and batch, shared) in torch's own CUDA graphs, one per stream, 3
  streams, each fed from its own pinned uint8 buffer.
* ``torch_eager``   -- the module in fp16 channels-last, eager, same 3-stream harness.
* ``ferry_native``  -- Ferry's own op graph, where a native build exists (resnet50).
* ``ferry_onnx``    -- the onnx engine on the model exported with torch.onnx (TorchScript
  exporter, opset 17, dynamic batch), on the backend a GPU gets by default: the imported
  graph lowered to torch and served as ``ferry_torch`` is (its own compile).
* ``ferry_onnx_native`` -- the same file on the onnx engine's native backend (Ferry's ops on
  cupy, fp16, CUDA graphs). Both opt-in, for ``--onnx-models`` (resnet50 by default; ``all``).
* ``ferry_torch_dyn`` -- opt-in: ``ferry_torch`` compiled once for every batch size
  (``compile: dynamic``), a compile of its own.

Every harness (``bench_models_harness.py``) is driven by one thread with 3 batches out.
``top1_agree`` is the share of real photos (loadtest.corpus, through Ferry's CPU image
path) whose top-1 equals torch fp32's.

Cost: torch.compile takes ~10-40 s per model and batch. With ``--jobs N`` (default: all
models at once) each model gets its own process: the processes build and compile in
parallel (the CPU cores), then each times its systems in turn while the others wait idle
(nothing else runs on the GPU or the cores during a timed window). ``--diagnose`` adds, for
the first model, the harness and executor variants that explain the ratio (``diagnostics``
in the JSON). Results merge into the JSON (``--no-merge`` replaces it).

    python benchmarks/bench_models.py --models resnet50,mobilenet_v3_large --batches 1,32,128

Any torchvision classifier name works in ``--models``; the vision transformers of issue 29
(not yet in models.json) are ``--models vit_b_16,swin_t --systems
ferry_torch,torch_compile,ferry_onnx,ferry_onnx_native --onnx-models all``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import bench_models_harness as H  # noqa: E402
from benchmarks.common import commit, machine, table, today, write_json  # noqa: E402
from benchmarks.model_zoo import MODELS, make, normalised, photo_pixels  # noqa: E402

SYSTEMS = ("ferry_torch", "torch_compile", "torch_eager", "ferry_native")
OPTIONAL = ("ferry_onnx", "ferry_onnx_native", "ferry_torch_dyn")
NATIVE = {"resnet50"}  # architectures Ferry builds natively
FERRY = {k: f"ferry_{k}" for k in ("torch", "torch_dyn", "native", "onnx", "onnx_native")}
"""A model's Ferry executors (``ModelBench.exs``) by kind: the system each is timed as."""
COLS = ["model", "batch", "system", "img_s", "top1_agree", "spread", "host_us_per_batch"]


def ferry_executor(entry: Any, batches: list[int], args: Any) -> Any:
    """Ferry's executor of ``entry`` at ``batches``, warmed up, as the run's ``args`` set it
    (``compute_streams``, ``batch_wait``)."""
    from pipeline.config import ExecutorConfig
    from pipeline.executor import GpuExecutor

    ex = GpuExecutor(
        ExecutorConfig(
            backend="cupy",
            buckets=tuple(sorted(batches)),
            max_in_flight=H.IN_FLIGHT,
            compute_streams=args.compute_streams,
            pool_limit_fraction=0.4,
            batch_wait=args.batch_wait,
        )
    )
    if hasattr(entry, "engine") and hasattr(entry, "graph"):  # a LoadedModel (native)
        ex.load(entry)
    else:
        ex.load_entry(entry)
    ex.warmup()
    return ex


def _row(model: str, batch: int, system: str, timing: dict, agree: float) -> dict:
    return {
        "model": model,
        "batch": batch,
        "system": system,
        "img_s": round(timing["img_s"], 1),
        "top1_agree": agree,
        "spread": round(timing["spread"], 3),
        "host_us_per_batch": timing["host_us_per_batch"],
        "cpu_us_per_batch": timing["cpu_us_per_batch"],
    }


# ----------------------------------------------------------------------------- one model


class ModelBench:
    """Everything of one model built and compiled (``build``), then timed (``time``)."""

    def __init__(self, name: str, batches: list[int], systems: list[str], args: Any) -> None:
        self.name, self.batches, self.systems, self.args = name, batches, systems, args
        self.exs: dict[str, Any] = {}
        self.compile_s: dict[str, float] = {}

    def build(self, tmp: str) -> None:
        import torch

        from pipeline.config import ModelConfig

        name, systems = self.name, self.systems
        self.u8 = photo_pixels(20)
        model = make(name, device="cuda")
        with torch.inference_mode():
            x = torch.from_numpy(normalised(self.u8)).cuda()
            self.ref = model(x).argmax(1).cpu().numpy()
        sd = {k: v.cpu() for k, v in model.state_dict().items()}
        torch_fn = "ferry_torch" in systems or "torch_compile" in systems  # (that one's function)
        kinds = ["torch"] * torch_fn + ["torch_dyn"] * ("ferry_torch_dyn" in systems)
        if kinds:
            sd_path = os.path.join(tmp, f"{name}.pt")
            torch.save(sd, sd_path)
        for kind in kinds:
            t0, dyn = time.perf_counter(), kind == "torch_dyn"
            form = {"compile": "dynamic" if dyn else "static", "weights": sd_path}
            entry = ModelConfig(name=name, engine="torch", source=name, **form)
            self.exs[kind] = ferry_executor(entry, self.batches, self.args)
            self.compile_s[f"{name}:dyn" if dyn else name] = round(time.perf_counter() - t0, 1)
        if "ferry_native" in systems and name in NATIVE:
            from pipeline.models import resnet50
            from pipeline.models.registry import LoadedModel, model_info

            npsd = {k: v.numpy() for k, v in sd.items()}
            lm = LoadedModel(name, model_info("resnet50"), resnet50.build(npsd, name), False, "zoo")
            self.exs["native"] = ferry_executor(lm, self.batches, self.args)
        onnx_models = self.args.onnx_models.split(",")
        backends = {"onnx": "torch", "onnx_native": "native"}
        wanted = [k for k in backends if f"ferry_{k}" in systems]
        if wanted and (name in onnx_models or "all" in onnx_models):
            path = os.path.join(tmp, f"{name}.onnx")
            torch.onnx.export(
                model.float(),
                (torch.zeros(1, 3, 224, 224, device="cuda"),),
                path,
                dynamic_axes={"input": {0: "batch"}},
                input_names=["input"],
                dynamo=False,
            )
            for kind in wanted:
                t0 = time.perf_counter()
                entry = ModelConfig(name=name, engine="onnx", source=path, backend=backends[kind])
                self.exs[kind] = ferry_executor(entry, self.batches, self.args)
                self.compile_s[f"{name}:{kind}"] = round(time.perf_counter() - t0, 1)
        self.eager = H.eager_fn(model) if "torch_eager" in systems else None
        torch.cuda.empty_cache()

    def time(self) -> tuple[list[dict], list[dict]]:
        """Per batch size, every system's driver is set up, then all are timed window by
        window in turn (``interleaved``), then each one's top-1 is checked."""
        import torch

        name, rows, diags = self.name, [], []
        for b in self.batches:
            drivers, facts, top1 = {}, {}, {}
            for kind, system in FERRY.items():
                ex = self.exs.get(kind)
                if ex is not None and system in self.systems:
                    drivers[system], facts[system] = H.ferry_driver(ex, name, b)
                    top1[system] = lambda ex=ex, b=b: H.ferry_top1(ex, name, b, self.u8)
            ex = self.exs.get("torch")
            if ex is not None and "torch_compile" in self.systems:
                fn = ex.models[name].engine.fn["image"]
                drivers["torch_compile"] = H.torch_driver(fn, b, True)
                top1["torch_compile"] = lambda fn=fn, b=b: H.torch_top1(fn, b, self.u8)
            if self.eager is not None:
                drivers["torch_eager"] = H.torch_driver(self.eager, b, False)
                top1["torch_eager"] = lambda b=b: H.torch_top1(self.eager, b, self.u8)
            timings = H.interleaved(drivers, b, self.args.seconds)
            for system, timing in timings.items():
                agree = H.agree(top1[system](), self.ref)
                rows.append(_row(name, b, system, timing, agree))
                if system.startswith("ferry"):  # (a row says how its executor waited)
                    rows[-1]["batch_wait"] = self.args.batch_wait
            for system, f in facts.items():
                diags.append({"model": name, "batch": b, "system": system, **f()})
            for d in drivers.values():
                d.close()
            del drivers, top1
            if self.args.diagnose and ex is not None:
                diags += self.diagnose(ex, b)
            torch.cuda.empty_cache()
            if rows:
                print(table([r for r in rows if r["batch"] == b], COLS), file=sys.stderr)
        return rows, diags

    def diagnose(self, ex: Any, b: int) -> list[dict]:
        """What the ratio is made of: the GPU alone on Ferry's graphs, then the harness and
        executor variants (the earlier round-robin streams, submit threads, the host copy
        into pinned memory, a bounded wait: the completion thread's two wake-ups)."""
        name, secs, out = self.name, self.args.seconds, []
        out.append({"model": name, "batch": b, "variant": "gpu_only"})
        out[-1].update(H.ferry_graphs_only(ex, name, b))
        variants = [
            ("round_robin_streams_pool_copy", dict(staged=False, pool=True), True),
            ("pool_copy", dict(staged=False, pool=True), False),
            ("loop_copy", dict(staged=False), False),
            ("loop_staged_bounded_wait", dict(bounded=True), False),
        ]
        for label, kw, rr in variants:
            saved_for = ex.streams.compute_for
            if rr:
                ex.streams.compute_for = lambda key: ex.streams.next_compute()
            try:
                d, facts_of = H.ferry_driver(ex, name, b, **kw)
                t = H.timed(d, b, secs)
                d.close()
                facts = facts_of()
            finally:
                ex.streams.compute_for = saved_for
            out.append(
                {"model": name, "batch": b, "variant": label, "img_s": round(t["img_s"], 1)}
                | {"spread": round(t["spread"], 3), "host_us_per_batch": t["host_us_per_batch"]}
                | {"cpu_us_per_batch": t["cpu_us_per_batch"], **facts}
            )
            print(out[-1], file=sys.stderr, flush=True)
        return out

    def close(self) -> None:
        for ex in self.exs.values():
            ex.close()


# ----------------------------------------------------------------------------- processes


def worker(args: Any) -> int:
    """One model in its own process: build, say READY, wait for GO, time, write the rows."""
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # everything else this process prints goes to its log
    bench = ModelBench(args.worker, _ints(args.batches), args.systems.split(","), args)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        bench.build(tmp)
        print(f"{args.worker}: built in {time.perf_counter() - t0:.1f} s", flush=True)
        proto.write("READY\n")
        proto.flush()
        if sys.stdin.readline().strip() != "GO":
            return 1
        t0 = time.perf_counter()
        rows, diags = bench.time()
        print(f"{args.worker}: timed in {time.perf_counter() - t0:.1f} s", flush=True)
        with open(args.rows_out, "w") as f:
            json.dump({"rows": rows, "diagnostics": diags, "compile_s": bench.compile_s}, f)
        bench.close()
    return 0


def run_models(args: Any, models: list[str], save: Any) -> list[str]:
    """Waves of ``--jobs`` processes: all build at once, then each times alone in turn; the
    models whose process failed."""
    failed: list[str] = []
    env = dict(os.environ)
    if args.jobs > 1:
        env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "4")  # the processes share the cores
    with tempfile.TemporaryDirectory() as tmp:
        for w in range(0, len(models), args.jobs):
            procs = {}
            for i, name in enumerate(models[w : w + args.jobs]):
                cmd = [sys.executable, os.path.abspath(__file__), "--worker", name]
                cmd += ["--batches", args.batches, "--systems", args.systems]
                cmd += ["--seconds", str(args.seconds), "--onnx-models", args.onnx_models]
                cmd += ["--compute-streams"]
                cmd += [str(args.compute_streams), "--rows-out", f"{tmp}/{name}.json"]
                cmd += ["--batch-wait", args.batch_wait]
                cmd += ["--diagnose"] if args.diagnose and w + i == 0 else []
                log = open(f"{tmp}/{name}.log", "w")
                procs[name] = (
                    subprocess.Popen(
                        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env
                    ),
                    log,
                )
            t0 = time.perf_counter()
            ready = {n: p.stdout.readline().strip() == b"READY" for n, (p, _) in procs.items()}
            print(f"wave built in {time.perf_counter() - t0:.0f} s: {ready}", flush=True)
            for name, (p, log) in procs.items():
                if ready[name]:
                    p.stdin.write(b"GO\n")
                    p.stdin.flush()
                p.stdin.close()
                rc = p.wait()
                log.close()
                with open(f"{tmp}/{name}.log") as f:
                    print(f"----- {name} (rc {rc})\n{f.read()[-6000:]}", flush=True)
                if rc == 0:
                    with open(f"{tmp}/{name}.json") as f:
                        save(json.load(f))
                else:
                    failed.append(name)
    return failed


def _ints(s: str) -> list[int]:
    return [int(b) for b in s.split(",") if b]


def _merge(doc: dict, part: dict, args: Any) -> None:
    """One model's rows into the JSON: its rows and diagnostics replace the old ones."""
    order = {m: i for i, m in enumerate(MODELS)}
    keys = {(r["model"], r["batch"], r["system"]) for r in part["rows"]}
    kept = [r for r in doc["rows"] if (r["model"], r["batch"], r["system"]) not in keys]
    doc["rows"] = sorted(
        kept + part["rows"], key=lambda r: (order.get(r["model"], 99), r["batch"], r["system"])
    )
    rerun = {r["model"] for r in part["rows"]}
    varied = {d["model"] for d in part["diagnostics"] if "variant" in d}
    doc["diagnostics"] = [
        d
        for d in doc.get("diagnostics", [])
        if d["model"] not in (varied if "variant" in d else rerun)
    ] + part["diagnostics"]
    doc["compile_s"] = {  # per model now (all its batches); drop the old model@batch keys
        k: v for k, v in doc.get("compile_s", {}).items() if k.split("@")[0] not in rerun
    }
    doc.setdefault("compile_s", {}).update(part["compile_s"])
    doc.update(
        benchmark="bench_models",
        commit=commit(),
        date=today(),
        machine=machine(),
        setup="fp16, pinned host uint8 [N,224,224,3] batches, 3 in flight from one "
        "thread for every system; random weights with randomised batch norms; top1_agree "
        "against torch fp32 on 20 photos; torch_compile shares ferry_torch's compiled "
        "function (same kernels), in torch's CUDA graphs on 3 streams; Ferry: "
        f"{args.compute_streams} compute streams, one per in-flight arena, its batch waits "
        f"{args.batch_wait} (executor.batch_wait); img_s the "
        f"median of 3 windows over {args.seconds} s, the systems of a batch size "
        "timed window by window in turn; spread (max-min)/median; host_us_per_batch: "
        "CPU us per batch of the thread driving the loop (the peers' waits left out, "
        "Ferry's in: its wait also finishes the batch); "
        "cpu_us_per_batch: the whole process's CPU us per batch (bench_models_harness)",
    )
    write_json(args.out, doc)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--batches", default="1,32,128")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"of {SYSTEMS + OPTIONAL}")
    ap.add_argument("--seconds", type=float, default=1.2, help="timed seconds per row (3 windows)")
    ap.add_argument("--onnx-models", default="resnet50", help="models that get ferry_onnx")
    ap.add_argument("--jobs", type=int, default=0, help="model processes at once (0: all)")
    ap.add_argument("--diagnose", action="store_true", help="variants for the first model")
    ap.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "results", "models.json")
    )
    ap.add_argument("--no-merge", action="store_true", help="replace the file instead of adding")
    ap.add_argument("--compute-streams", type=int, default=H.IN_FLIGHT)
    ap.add_argument(
        "--batch-wait",
        choices=("sleep", "spin"),
        default="spin",
        help="Ferry's executors' executor.batch_wait: spin (the default) waits as the torch "
        "peers' loops do, on a plain event that spins -- like with like (models.json wait_ab: "
        "0.93-1.00x torch_compile spinning, 0.71-0.97x asleep, H200 2026-12-06); sleep: "
        "serving's default",
    )
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--rows-out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)
    models = [m for m in args.models.split(",") if m]
    args.jobs = args.jobs or len(models)
    doc: dict = {"rows": [], "compile_s": {}, "diagnostics": []}
    if os.path.exists(args.out) and not args.no_merge:
        with open(args.out) as f:
            doc = json.load(f)
    failed = run_models(args, models, lambda part: _merge(doc, part, args))
    if doc["rows"]:
        print(table(doc["rows"], COLS))
    if failed:
        print(f"FAILED: {', '.join(failed)} (their logs above)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
