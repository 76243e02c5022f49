"""The ``torch`` engine: a ``torch.nn.Module`` in Ferry's own CUDA graphs, on Ferry's streams.

Its module comes from ``torch_sources.py`` (a torchvision name, TorchScript, ``torch.export``
archive or ``module:function``; ``declared_input`` is re-exported for the repository).

On the GPU the module runs in its model's compute dtype in channels-last -- fp16 by default,
fp32 where the executor's precision probe finds that fp16 does not run, overflows or is far
from fp32 (``pipeline/executor_precision.py``; ``trial`` runs the module eagerly, before it
is compiled, in each dtype, and the fp32 weights come back exact from a host copy) --
compiled with ``torch.compile`` (default mode, ``freezing`` on, one static shape per
bucket, or with the entry's ``compile: dynamic`` one symbolic batch for every bucket from 2
up; TorchScript runs as scripted). ``bind`` wraps Ferry's arena views as torch
tensors (no copy), so the executor's pinned ring copies straight into the model's input and
out of its outputs. ``run`` enqueues on Ferry's stream through ``torch.cuda.ExternalStream``;
``capture`` records it with ``torch.cuda.graph`` on that same stream and the executor
replays it there. The graphs of one stream share one torch graph pool for their
intermediates: they never run at once (one stream), and none reads what another left (each
copies its outputs into its arena), which is when torch allows it (vLLM shares one pool
across its batch sizes the same way) -- so a model's graphs hold its largest bucket's
intermediates once per compute stream, not every bucket's once per arena (a U-Net at 256x256
held 9.4 GB at warm-up on an H100, over its replica's share). What torch holds on the device --
weights, graph pools, its cache -- is counted in Ferry's pool (``pool.account``), kept equal
to ``torch.cuda.memory_reserved`` after loading, after every capture and after every eager
run, so admission control sees it; each bucket's footprint is measured at its capture.
The image feed normalises uint8 pixels on the device (one small compiled kernel) before the
model; the tensors feed casts the model's own input. On the CPU it runs eager torch, fp32.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import numpy as np

from ..device import Stream
from ..errors import InvalidInput
from ..models.registry import LoadedModel
from ..ops.base import TensorSpec, align, workspace_view
from .base import Engine, EngineContext, EnginePlan, Feed, ImageInput, TensorInfo, probe_input
from .compile_gate import torch_gate
from .torch_cuda import TorchCharge, TorchGraph
from .torch_sources import (
    _torch,
    declared_input,
    load_module,
    module_bytes,
    module_state,
    to_channels_last,
)

__all__ = ["TorchEngine", "build", "declared_input"]
logger = logging.getLogger(__name__)


def build(entry: Any, image: ImageInput) -> Any:
    """The engine's builder (``engines.ENGINES``): a ``LoadedModel`` with a ``TorchEngine``."""

    module, random, scripted = load_module(entry)
    dtype = entry.input.dtype or "float32"
    eng = TorchEngine(entry.name, module, image, dtype, scripted)
    eng.dynamic = getattr(entry, "compile", "static") == "dynamic"
    eng.gate_key = f"torch:{entry.source}:{entry.weights}:{entry.seed}"
    return LoadedModel(entry.name, None, None, random, entry.source, engine=eng)


# ----------------------------------------------------------------------------- the engine


class TorchEngine(Engine):
    name = "torch"
    trial_loads = False  # its trials run the module eagerly; ``load`` compiles it
    late_capture = False  # (Engine.late_capture says why)
    dynamic = False
    """One compile with the batch dimension symbolic (the entry's ``compile: dynamic``), not
    one a bucket; ``load`` keeps it only where the module is compiled."""
    gate_key: str | None = None
    """What the module is, for the machine's compile gate (``warm_gate``): its source, weights
    and seed (the builder sets it); None: no gate."""

    def __init__(
        self, model: str, module: Any, image: ImageInput, input_dtype: str, scripted: bool
    ) -> None:
        super().__init__(model)
        self.module = module
        self.image = image
        self.input_dtype = np.dtype(input_dtype).name
        self.scripted = scripted
        i = image
        item = (
            (i.channels, i.height, i.width)
            if i.layout == "nchw"
            else (i.height, i.width, i.channels)
        )
        self._input = TensorInfo("input", self.input_dtype, (-1, *item))
        self._outputs, self.flops_per_item = self._probe()
        self._plans: dict[tuple[int, Feed], EnginePlan] = {}
        self.footprints: dict[tuple[int, Feed], int] = {}  # bytes each capture added
        self.graph_pools: dict[int, Any] = {}  # stream pointer -> its graphs' torch pool
        self._weights_bytes = 0
        self.device: Any = None
        self.compute: Any = None
        self._master: dict[str, Any] | None = None  # the weights as they came, while probed

    def _probe(self) -> tuple[tuple[TensorInfo, ...], int]:
        """Output names and shapes from one eager fp32 run of a single item on the CPU."""
        torch = _torch()
        x = torch.zeros((1, *self._input.shape[1:]), dtype=getattr(torch, self.input_dtype))
        flops = 0
        try:
            with torch.inference_mode():
                try:
                    from torch.utils.flop_counter import FlopCounterMode  # optional: torch

                    counter = FlopCounterMode(display=False)
                    with counter:
                        y = self.module(x)
                    flops = int(counter.get_total_flops())
                except Exception:  # scripted modules may not dispatch through the counter
                    y = self.module(x)
        except Exception as exc:
            raise InvalidInput(
                "the model does not run on its declared input",
                model=self.model,
                input=list(self._input.shape),
                dtype=self.input_dtype,
                detail=f"{type(exc).__name__}: {str(exc)[:300]}",
            ) from None
        names, tensors = _flatten(y)
        outs = tuple(
            TensorInfo(n, "float32", (-1, *t.shape[1:]))
            for n, t in zip(names, tensors, strict=True)
        )
        return outs, flops

    @property
    def inputs(self) -> tuple[TensorInfo, ...]:
        return (self._input,)

    @property
    def outputs(self) -> tuple[TensorInfo, ...]:
        return self._outputs

    @property
    def weights_bytes(self) -> int:
        return self._weights_bytes

    # -- loading
    def load(self, ctx: EngineContext) -> None:
        torch = _torch()
        self.ctx = ctx
        m = self._to_device(ctx, self.dtype_in(ctx))
        self._master = None  # the probe is over
        # (compiled only on a GPU, and TorchScript or a non-image input never: _channels_last)
        self.dynamic = self.dynamic and self._channels_last()
        if not ctx.backend.is_cuda:
            self.fn = {"image": self._image_fn(m), "tensors": self._tensor_fn(m)}
            self._weights_bytes = module_bytes(m)
            return
        dev = self.device
        # the module runs on the GPU: torch's intra-op CPU threads (one a core by default, in
        # every replica) have nothing to do but spin -- the expert peer's 8 replicas took about
        # a core each that way (results/e2e_notes.md, 2026-12-03) -- so one is enough
        torch.set_num_threads(1)
        if self._channels_last():  # (on the GPU: not TorchScript, an image input)
            to_channels_last(m)
            import torch._dynamo.config as dc  # optional: torch
            import torch._inductor.config as ic  # optional: torch

            ic.freezing = True
            dc.cache_size_limit = max(dc.cache_size_limit, 1024)
            dc.accumulated_cache_size_limit = max(dc.accumulated_cache_size_limit, 4096)
            m = torch.compile(m, dynamic=None if self.dynamic else False)
        self.module = m
        self.fn = {"image": self._image_fn(m, compiled=True), "tensors": self._tensor_fn(m, True)}
        self._weights_bytes = module_bytes(m)
        TorchCharge.sync(ctx.pool, dev.index, f"loading {self.model}")

    def _to_device(self, ctx: EngineContext, dtype: str) -> Any:
        """The module on the context's device (the GPU, else the CPU) in ``dtype``, in place,
        its float32 weights put back from the host copy where a float16 trial cast them."""
        torch = _torch()
        if ctx.backend.is_cuda:
            dev = self.device = torch.device("cuda", ctx.backend.device_id)
            torch.cuda.set_device(dev)
        else:
            dev = self.device = torch.device("cpu")
        self.compute = torch.float16 if dtype == "float16" else torch.float32
        m = self.module = self.module.to(dev).to(self.compute)
        if self.compute == torch.float32 and self._master is not None:
            with torch.no_grad():
                for name, t in module_state(m):
                    t.copy_(self._master[name])
        return m

    def warm_gate(self, buckets: tuple[int, ...]) -> contextlib.AbstractContextManager:
        """On a GPU, the warm-up compiles each bucket: one process of the machine compiles a
        given module, dtype and buckets first, alone, and the others from its caches
        (``compile_gate.py``)."""
        if self.ctx is None or not self.ctx.backend.is_cuda or self.gate_key is None:
            return contextlib.nullcontext()
        torch = _torch()
        key = "|".join(
            (
                torch.__version__,
                self.gate_key,
                str(self.compute),
                str(self._input.shape),
                torch.cuda.get_device_name(self.device),
                ",".join(map(str, buckets)),
                "dynamic" if self.dynamic else "static",
            )
        )
        return torch_gate(key)

    # -- the precision probe (``executor_precision``): eager, before the module is compiled
    def dtype_in(self, ctx: EngineContext) -> str:
        return ctx.dtype if ctx.backend.is_cuda else "float32"  # the CPU path is fp32 eager

    def trial(self, ctx: EngineContext, feed: Feed, stream: Stream) -> tuple[Any, ...]:
        """One eager run of ``probe_input`` at bucket 1 in ``ctx.dtype`` (on the GPU: torch's
        stream, waited for), its outputs on the host; the weights' host copy is taken first.
        ``load`` then puts the module in its dtype (float32 weights exact, from that copy)."""
        torch = _torch()
        if self._master is None:
            state = module_state(self.module)
            self._master = {n: t.detach().to("cpu", copy=True) for n, t in state}
        self.ctx = ctx
        m = self._to_device(ctx, ctx.dtype)
        fn = self._image_fn(m) if feed == "image" else self._tensor_fn(m)
        x = torch.from_numpy(probe_input(self.plan(1, feed).input_spec)).to(self.device)
        with torch.inference_mode():
            _, ys = _flatten(fn(x))
            outs = tuple((y.float() if y.is_floating_point() else y).cpu().numpy() for y in ys)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # the trial's activations: torch holds the weights only
        return outs

    def _image_fn(self, m: Any, compiled: bool = False) -> Any:
        torch = _torch()
        i = self.image
        shape = (1, -1, 1, 1) if i.layout == "nchw" else (1, 1, 1, -1)
        mean = torch.tensor([v * 255 for v in i.mean], device=self.device).view(shape)
        scale = torch.tensor([1 / (v * 255) for v in i.std], device=self.device).view(shape)
        nchw, cl, dt = i.layout == "nchw", self._channels_last(), self.compute

        def prep(x: Any) -> Any:
            x = x.permute(0, 3, 1, 2) if nchw else x
            y = ((x.float() - mean) * scale).to(dt)
            return y.contiguous(memory_format=torch.channels_last) if cl else y.contiguous()

        return self._joined(prep, m, compiled)

    def _tensor_fn(self, m: Any, compiled: bool = False) -> Any:
        torch = _torch()
        cl, dt = self._channels_last(), self.compute

        def prep(x: Any) -> Any:
            y = x.to(dt)
            return y.contiguous(memory_format=torch.channels_last) if cl else y.contiguous()

        return self._joined(prep, m, compiled)

    def _joined(self, prep: Any, m: Any, compiled: bool) -> Any:
        """``x -> m(prep(x))``, ``prep`` compiled where ``m`` is. ``dynamic``: both see the
        batch dimension marked symbolic from 2 up (a batch of 1 compiles apart), so the first
        bucket compiles them and the others reuse that -- or compile again where the compile
        guarded a range of sizes (a kernel chosen by size; torch's ``maybe_mark_dynamic``
        allows it). The marks cost nothing once captured: a replay runs none of this."""
        if not compiled:
            return lambda x: m(prep(x))
        torch = _torch()
        prep = torch.compile(prep, dynamic=None if self.dynamic else False)
        if not self.dynamic:
            return lambda x: m(prep(x))
        mark = torch._dynamo.maybe_mark_dynamic

        def fn(x: Any) -> Any:
            if x.shape[0] > 1:
                mark(x, 0)
            y = prep(x)
            if y.shape[0] > 1:
                mark(y, 0)
            return m(y)

        return fn

    def _channels_last(self) -> bool:
        return self.device.type == "cuda" and not self.scripted and len(self._input.shape) == 4

    # -- phase one: no device work
    def plan(self, bucket: int, feed: Feed = "image") -> EnginePlan:
        key = (bucket, self.feed_for(feed))
        hit = self._plans.get(key)
        if hit is not None and hit.held_bytes == self.footprints.get(key, 0):
            return hit
        i = self.image
        if feed == "image":
            x = TensorSpec((bucket, i.height, i.width, i.channels), "uint8")
        else:
            x = self._input.at(bucket)
        outs = tuple(o.at(bucket) for o in self._outputs)
        arena = align(x.nbytes) + sum(align(o.nbytes) for o in outs)
        plan = EnginePlan(
            engine=self.name,
            model=self.model,
            bucket=bucket,
            feed=feed,
            inputs=(x,),
            outputs=outs,
            arena_bytes=arena,
            held_bytes=self.footprints.get(key, 0),
            flops=self.flops_per_item * bucket,
            bytes_moved=arena + self._weights_bytes,
        )
        self._plans[key] = plan
        return plan

    def bind(self, plan: EnginePlan, arena: Any) -> TorchBound:
        return TorchBound(self, plan, arena)

    def close(self) -> None:
        if self.ctx is not None and self.device is not None and self.device.type == "cuda":
            TorchCharge.release(self.ctx.pool)


class TorchBound:
    """One plan on one arena: the arena's views, as the executor's and as torch tensors."""

    def __init__(self, engine: TorchEngine, plan: EnginePlan, arena: Any) -> None:
        torch = _torch()
        self.engine, self.plan = engine, plan
        x = plan.inputs[0]
        self.input = workspace_view(arena, 0, x.shape, x.dtype)
        off, outs = align(x.nbytes), []
        for o in plan.outputs:
            outs.append(workspace_view(arena, off, o.shape, o.dtype))
            off += align(o.nbytes)
        self.outputs = tuple(outs)
        cuda = engine.device.type == "cuda"
        wrap = (lambda a: torch.as_tensor(a, device=engine.device)) if cuda else torch.from_numpy
        self._x = wrap(self.input)
        self._ys = [wrap(o) for o in self.outputs]
        self._fn = engine.fn[plan.feed]

    def _enqueue(self) -> None:
        torch = _torch()
        with torch.inference_mode():
            _, ys = _flatten(self._fn(self._x))
            for dst, y in zip(self._ys, ys, strict=True):
                dst.copy_(y)

    def run(self, stream: Any) -> None:
        eng = self.engine
        if eng.device.type != "cuda":
            self._enqueue()
            return
        torch = _torch()
        with torch.cuda.stream(torch.cuda.ExternalStream(stream.raw.ptr, device=eng.device)):
            self._enqueue()
        TorchCharge.sync(eng.ctx.pool, eng.device.index, f"running {eng.model}")

    def capture(self, stream: Any) -> TorchGraph:
        torch = _torch()
        eng, dev = self.engine, self.engine.device
        ext = torch.cuda.ExternalStream(stream.raw.ptr, device=dev)
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()
        before = torch.cuda.memory_reserved(dev)
        g = torch.cuda.CUDAGraph()
        pool = eng.graph_pools.get(stream.raw.ptr)  # this stream's graphs share one pool
        if pool is None:
            pool = eng.graph_pools[stream.raw.ptr] = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(g, pool=pool, stream=ext, capture_error_mode="thread_local"):
            self._enqueue()
        held = max(0, torch.cuda.memory_reserved(dev) - before)
        key = (self.plan.bucket, self.plan.feed)
        eng.footprints[key] = max(eng.footprints.get(key, 0), held)
        TorchCharge.sync(
            eng.ctx.pool, dev.index, f"capturing {eng.model} bucket {self.plan.bucket}"
        )
        logger.info(
            "captured %s bucket %d (%s): %.1f MB in torch's graph pool",
            eng.model,
            self.plan.bucket,
            self.plan.feed,
            held / 1e6,
        )
        return TorchGraph(g, dev)


def _flatten(y: Any) -> tuple[list[str], list[Any]]:
    """A module's output as (names, tensors): one tensor is ``logits``, a tuple or list is
    ``output_0``..., a dict keeps its keys."""
    if isinstance(y, dict):
        return [str(k) for k in y], list(y.values())
    if isinstance(y, tuple | list):
        return [f"output_{i}" for i in range(len(y))], list(y)
    return ["logits"], [y]
