"""The ``native`` engine: Ferry's graph of two-phase ops (numpy on the CPU, cupy on the GPU).

Its plan is the graph's plan (``Graph.prepare``: every op planned, every activation and
workspace laid out in one arena by liveness), so a batch needs exactly one reservation;
binding makes the arena's views once, and ``run``/``capture`` are the graph's own. The
graph's one input is its own tensor, so both feeds share one plan. ``GraphEngine`` is that
machinery for any engine whose feeds are native graphs (the ``onnx`` engine builds two).
"""

from __future__ import annotations

from typing import Any

from ..graph import BoundGraph, Graph
from .base import Engine, EngineContext, EnginePlan, Feed, TensorInfo


class GraphEngine(Engine):
    """An engine whose feeds each run one of Ferry's op graphs (sharing one set of weights):
    loading, planning and binding are the graphs' own. ``graphs`` maps a feed to its graph."""

    def __init__(self, model: str, graphs: dict[Feed, Graph]) -> None:
        super().__init__(model)
        self.graphs = graphs
        self.constants: dict[str, Any] = {}
        self._weights_bytes = 0
        self._plans: dict[tuple[int, Feed], EnginePlan] = {}

    @property
    def weights_bytes(self) -> int:
        return self._weights_bytes

    def load(self, ctx: EngineContext) -> None:
        """The weights in ``ctx.dtype``, once; loaded again in another dtype (the precision
        probe), the old weights and plans are dropped before the new ones are made."""
        loaded_in = self.ctx.dtype if self.ctx is not None and self.constants else None
        self.ctx = ctx
        if loaded_in == ctx.dtype:
            return
        dropped = loaded_in is not None
        self.constants, self._plans = {}, {}
        host: dict[str, Any] = {}
        for g in self.graphs.values():  # the feeds' graphs name their shared weights alike
            for k, v in g.constant_arrays(ctx.dtype).items():
                host.setdefault(k, v)
        if ctx.backend.is_cuda:
            import cupy  # optional: cupy

            with cupy.cuda.Device(ctx.backend.device_id):
                if dropped:  # the other dtype's weights go back to the driver, not cached
                    cupy.get_default_memory_pool().free_all_blocks()
                self.constants = {k: cupy.asarray(v) for k, v in host.items()}
        else:
            self.constants = host
        self._weights_bytes = sum(int(v.nbytes) for v in host.values())

    def plan(self, bucket: int, feed: Feed = "image") -> EnginePlan:
        feed = self.feed_for(feed)
        key = (bucket, feed)
        hit = self._plans.get(key)
        if hit is not None:
            return hit
        ctx = self.ctx
        dtype, target, ws = (
            (ctx.dtype, ctx.target, ctx.max_workspace_bytes)
            if ctx
            else ("float32", "host", 256 << 20)
        )
        gp = self.graphs[feed].prepare(bucket, dtype, target, ws)
        plan = EnginePlan(
            engine=self.name,
            model=self.model,
            bucket=bucket,
            feed=feed,
            inputs=(gp.input_spec,),
            outputs=gp.output_specs,
            arena_bytes=gp.arena_bytes,
            flops=gp.flops,
            bytes_moved=gp.bytes_moved,
            detail=gp,
        )
        self._plans[key] = plan
        return plan

    def bind(self, plan: EnginePlan, arena: Any) -> BoundGraph:
        return plan.detail.bind(arena, self.constants)


class NativeEngine(GraphEngine):
    name = "native"

    def __init__(self, model: str, graph: Graph, output_names: tuple[str, ...] | None = None):
        super().__init__(model, {"image": graph})
        self.graph = graph
        self.output_names = output_names or tuple(graph.outputs)

    @property
    def inputs(self) -> tuple[TensorInfo, ...]:
        g = self.graph
        return (TensorInfo(g.input_name, g.input_dtype, (-1, *g.item_shape)),)

    @property
    def outputs(self) -> tuple[TensorInfo, ...]:
        plan = self.graph.prepare(1, "float32", "host")
        return tuple(
            TensorInfo(n, "float32", (-1, *s.shape[1:]))
            for n, s in zip(self.output_names, plan.output_specs, strict=True)
        )

    @property
    def feeds(self) -> tuple[Feed, ...]:
        return ("image",)

    def feed_for(self, feed: Feed) -> Feed:
        return "image"  # the graph's own input is the uint8 image: one plan for both
