"""The ``torch`` engine: a ``torch.nn.Module`` in Ferry's own CUDA graphs, on Ferry's streams.

Its module comes from ``torch_sources.py`` (a torchvision name, TorchScript, ``torch.export``
archive or ``module:function``; ``declared_input`` is re-exported for the repository).

On the GPU the module runs in the compute dtype (fp16; fp32 where fp16 fails at load) in
channels-last, compiled with ``torch.compile`` (default mode, ``freezing`` on, one static
shape per bucket; TorchScript runs as scripted). ``bind`` wraps Ferry's arena views as torch
tensors (no copy), so the executor's pinned ring copies straight into the model's input and
out of its outputs. ``run`` enqueues on Ferry's stream through ``torch.cuda.ExternalStream``;
``capture`` records it with ``torch.cuda.graph`` on that same stream (torch's private pool
holds the intermediates) and the executor replays it. What torch holds on the device --
weights, graph pools, its cache -- is counted in Ferry's pool (``pool.account``), kept equal
to ``torch.cuda.memory_reserved`` after loading, after every capture and after every eager
run, so admission control sees it; each bucket's footprint is measured at its capture.
The image feed normalises uint8 pixels on the device (one small compiled kernel) before the
model; the tensors feed casts the model's own input. On the CPU it runs eager torch, fp32.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import numpy as np

from ..errors import InvalidInput, ResourceExhausted
from ..models.registry import LoadedModel
from ..ops.base import TensorSpec, align, workspace_view
from .base import Engine, EngineContext, EnginePlan, Feed, ImageInput, TensorInfo
from .torch_sources import _torch, declared_input, load_module

__all__ = ["TorchEngine", "build", "declared_input"]
logger = logging.getLogger(__name__)


def build(entry: Any, image: ImageInput) -> Any:
    """The engine's builder (``engines.ENGINES``): a ``LoadedModel`` with a ``TorchEngine``."""

    module, random, scripted = load_module(entry)
    dtype = entry.input.dtype or "float32"
    eng = TorchEngine(entry.name, module, image, dtype, scripted)
    return LoadedModel(entry.name, None, None, random, entry.source, engine=eng)


# ----------------------------------------------------------------------------- accounting


class _TorchCharge:
    """Ferry's pool counts what torch holds on the device: one accounted reservation per
    pool, kept equal to ``torch.cuda.memory_reserved`` (weights, graph pools, cache)."""

    _lock = threading.Lock()
    _held: dict[int, Any] = {}

    @classmethod
    def sync(cls, pool: Any, device: int, what: str) -> int:
        torch = _torch()
        want = int(torch.cuda.memory_reserved(device))
        with cls._lock:
            old = cls._held.get(id(pool))
            if old is not None and old.nbytes >= want:
                return want
            if old is not None:
                old.release()
                cls._held.pop(id(pool))
            try:
                cls._held[id(pool)] = pool.account(want)
            except ResourceExhausted as exc:
                exc.fields.update(torch_reserved_bytes=want, when=what)
                raise
        return want

    @classmethod
    def release(cls, pool: Any) -> None:
        with cls._lock:
            held = cls._held.pop(id(pool), None)
        if held is not None:
            held.release()


# ----------------------------------------------------------------------------- the engine


class TorchEngine(Engine):
    name = "torch"

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
        self.footprints: dict[tuple[int, Feed], int] = {}  # bytes of each captured graph
        self._weights_bytes = 0
        self.device: Any = None
        self.compute: Any = None

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
        m = self.module
        if not ctx.backend.is_cuda:
            self.device, self.compute = torch.device("cpu"), torch.float32
            self.fn = {"image": self._image_fn(m), "tensors": self._tensor_fn(m)}
            self._weights_bytes = _nbytes(m)
            return
        dev = self.device = torch.device("cuda", ctx.backend.device_id)
        torch.cuda.set_device(dev)
        self.compute = torch.float16 if ctx.dtype == "float16" else torch.float32
        m = m.to(dev)
        try:
            m = m.to(self.compute)
            with torch.inference_mode():
                m(torch.zeros((1, *self._input.shape[1:]), device=dev, dtype=self.compute))
        except Exception as exc:  # a graph with fp32 baked in: serve it in fp32
            logger.warning("model %s does not run in %s (%s); fp32", self.model, self.compute, exc)
            self.compute = torch.float32
            m = m.to(torch.float32)
        if not self.scripted and len(self._input.shape) == 4:
            m = m.to(memory_format=torch.channels_last)
            import torch._dynamo.config as dc  # optional: torch
            import torch._inductor.config as ic  # optional: torch

            ic.freezing = True
            dc.cache_size_limit = max(dc.cache_size_limit, 1024)
            dc.accumulated_cache_size_limit = max(dc.accumulated_cache_size_limit, 4096)
            m = torch.compile(m, dynamic=False)
        self.module = m
        self.fn = {"image": self._image_fn(m, compiled=True), "tensors": self._tensor_fn(m, True)}
        self._weights_bytes = _nbytes(m)
        _TorchCharge.sync(ctx.pool, dev.index, f"loading {self.model}")

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

        prep = torch.compile(prep, dynamic=False) if compiled else prep
        return lambda x: m(prep(x))

    def _tensor_fn(self, m: Any, compiled: bool = False) -> Any:
        torch = _torch()
        cl, dt = self._channels_last(), self.compute

        def prep(x: Any) -> Any:
            y = x.to(dt)
            return y.contiguous(memory_format=torch.channels_last) if cl else y.contiguous()

        prep = torch.compile(prep, dynamic=False) if compiled else prep
        return lambda x: m(prep(x))

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
            _TorchCharge.release(self.ctx.pool)


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
        _TorchCharge.sync(eng.ctx.pool, eng.device.index, f"running {eng.model}")

    def capture(self, stream: Any) -> TorchGraph:
        torch = _torch()
        eng, dev = self.engine, self.engine.device
        ext = torch.cuda.ExternalStream(stream.raw.ptr, device=dev)
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()
        before = torch.cuda.memory_reserved(dev)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=ext, capture_error_mode="thread_local"):
            self._enqueue()
        held = max(0, torch.cuda.memory_reserved(dev) - before)
        key = (self.plan.bucket, self.plan.feed)
        eng.footprints[key] = max(eng.footprints.get(key, 0), held)
        _TorchCharge.sync(
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


class TorchGraph:
    """A torch CUDA graph that the executor launches on its raw (cupy) stream.

    The launch is ``cudaGraphLaunch`` of torch's instantiated graph on that stream, straight
    through cupy (a few microseconds), where torch has ``raw_cuda_graph_exec``; else
    ``replay`` under ``torch.cuda.stream``, which costs tens of microseconds of Python per
    batch -- at batch 1 the executor's host time is the limit. The direct launch skips
    torch's per-replay bump of the random-number offsets: an inference graph draws none."""

    def __init__(self, graph: Any, device: Any) -> None:
        self.graph, self.device = graph, device
        self._ext: tuple[int, Any] | None = None  # (raw pointer, its torch ExternalStream)
        raw = getattr(graph, "raw_cuda_graph_exec", None)
        self._exec = int(raw()) if raw is not None else 0
        if self._exec:
            from cupy.cuda import runtime  # cupy: the GPU backend, present where graphs are

            self._graph_launch = runtime.graphLaunch

    def launch(self, raw_stream: Any) -> None:
        if self._exec:
            self._graph_launch(self._exec, raw_stream.ptr)  # one cudaGraphLaunch
            return
        torch = _torch()
        ext = self._ext
        if ext is None or ext[0] != raw_stream.ptr:  # the executor pins an arena's stream
            ext = torch.cuda.ExternalStream(raw_stream.ptr, device=self.device)
            self._ext = ext = (raw_stream.ptr, ext)
        with torch.cuda.stream(ext[1]):
            self.graph.replay()


def _flatten(y: Any) -> tuple[list[str], list[Any]]:
    """A module's output as (names, tensors): one tensor is ``logits``, a tuple or list is
    ``output_0``..., a dict keeps its keys."""
    if isinstance(y, dict):
        return [str(k) for k in y], list(y.values())
    if isinstance(y, tuple | list):
        return [f"output_{i}" for i in range(len(y))], list(y)
    return ["logits"], [y]


def _nbytes(m: Any) -> int:
    n = sum(p.numel() * p.element_size() for p in m.parameters())
    return n + sum(b.numel() * b.element_size() for b in m.buffers())
