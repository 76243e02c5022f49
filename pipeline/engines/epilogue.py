"""A task's epilogue: the postprocessing that needs nothing of the request, run on the device
right after the model, inside the batch (``EpilogueEngine``, a wrapper of any engine).

    engine = with_epilogue(engine, task)     # image: Denormalize; segment: ArgmaxMask;
                                             # detect (YOLO-style): DetectHead

For an ``image`` model the image feed's output becomes uint8 pixels [N, H, W, C] (the
input's normalisation undone, clipped); for a ``segment`` model the uint8 class mask
[N, H, W]. The op is planned with the bucket (``plan``: its output and workspace laid out in
the same arena, after the model's), bound with it (views only) and enqueued on the batch's
stream after the model (``run``); a captured batch replays the model's CUDA graph and then
enqueues the op (``EpilogueGraph``: the op's commit only enqueues and allocates nothing).
So the executor's copy back moves a byte a pixel, not four bytes a channel, and the host
never holds the model's float output. The tensors feed (v2's raw outputs) is untouched.

For a ``detect`` model with a YOLO-style head the epilogue is ``DetectHead``: each box's
corners, best class and score, the image's ``max_candidates`` best boxes ranked on the
device [N, K, 6] (24 bytes a candidate box, where the head has 4 a class score of every
box); NMS's greedy pass stays with the answers (it depends on each request's thresholds).
SSD pairs, anchors, a background class and softmax scores keep the raw head, decoded on the
host. On numpy this runs inside the executor as on the GPU, so the CPU tests run it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from ..device import Stream
from ..ops.base import Op, OpPlan, align, workspace_view
from ..ops.denormalize import DENORMALIZE
from ..ops.detect_head import DETECT_HEAD, head_attrs
from ..ops.finite import ALL_FINITE
from ..ops.mask import ARGMAX_MASK
from .base import BoundModel, Engine, EngineContext, EnginePlan, Feed, TensorInfo


@dataclass(frozen=True)
class Epilogue:
    """The op a task runs after its model, on which output, with which attrs."""

    op: Op
    output: int
    attrs: tuple[tuple[str, Any], ...]


def epilogue_of(task: Any) -> Epilogue | None:
    """The task's epilogue, or None (classify, tensors, a detection head the host decodes)."""
    if task.kind == "detect":
        head = head_attrs(task)
        return None if head is None else Epilogue(DETECT_HEAD, task.outputs[0], tuple(head.items()))
    if task.kind == "image":
        attrs = (("layout", task.layout), ("scale", task.scale), ("shift", task.shift))
        return Epilogue(DENORMALIZE, task.outputs[0], attrs)
    if task.kind == "segment":
        return Epilogue(ARGMAX_MASK, task.outputs[0], (("layout", task.layout),))
    return None


def with_epilogue(engine: Engine, task: Any) -> Engine:
    """``engine`` whose image feed ends in the task's epilogue; as it is where there is none
    or the engine plans its two feeds as one (its tensors would get the epilogue too)."""
    ep = epilogue_of(task)
    if ep is None or engine.feed_for("tensors") == engine.feed_for("image"):
        return engine
    return EpilogueEngine(engine, ep)


def has_epilogue(engine: Any) -> bool:
    """Whether ``engine``'s image feed ends in a task's epilogue."""
    return isinstance(engine, EpilogueEngine)


@dataclass(frozen=True)
class _PlanDetail:
    """Where the epilogue lives in the arena: after the model's bytes, its two outputs (the
    answer's bytes, each row's finiteness) and one workspace both ops use in turn."""

    inner: EnginePlan
    op: Op
    op_plan: OpPlan
    finite_plan: OpPlan
    offsets: tuple[int, int, int]  # the answer's bytes, the finite flags, the workspace
    source: int  # the model output it reads


class EpilogueGraph:
    """A captured batch: the model's CUDA graph, then the epilogue enqueued on the stream."""

    def __init__(self, inner: Any, bound: EpilogueBound, stream: Stream) -> None:
        self.inner, self.bound, self.stream = inner, bound, stream

    def launch(self, raw: Any) -> None:
        self.inner.launch(raw)
        self.bound.run_epilogue(self.stream)


class EpilogueBound:
    """The model bound to the first part of the arena, the epilogue's views after it."""

    def __init__(self, inner: BoundModel, plan: EnginePlan, arena: Any) -> None:
        d: _PlanDetail = plan.detail
        self.inner, self.d = inner, d
        self.input = inner.input
        o_out, o_fin, o_ws = d.offsets
        out, fin = plan.outputs
        self.outputs = (
            workspace_view(arena, o_out, out.shape, out.dtype),
            workspace_view(arena, o_fin, fin.shape, fin.dtype),
        )
        size = max(d.op_plan.workspace_bytes, d.finite_plan.workspace_bytes)
        self.ws = arena[o_ws : o_ws + size]
        self.source = inner.outputs[d.source]

    def run_epilogue(self, stream: Stream) -> None:
        d, (out, fin) = self.d, self.outputs
        ALL_FINITE.commit(d.finite_plan, (self.source,), (fin,), self.ws, stream)
        d.op.commit(d.op_plan, (self.source,), (out,), self.ws, stream)

    def run(self, stream: Stream) -> None:
        self.inner.run(stream)
        self.run_epilogue(stream)

    def capture(self, stream: Stream) -> EpilogueGraph:
        return EpilogueGraph(self.inner.capture(stream), self, stream)


class EpilogueEngine(Engine):
    """``inner`` with the epilogue after its image feed; everything else is ``inner``'s."""

    def __init__(self, inner: Engine, epilogue: Epilogue) -> None:
        super().__init__(inner.model)
        self.inner, self.epilogue = inner, epilogue
        self.name = inner.name  # type: ignore[misc]  (the platform v2 reports)
        self._plans: dict[tuple[int, Feed], EnginePlan] = {}

    @property
    def inputs(self) -> tuple[TensorInfo, ...]:
        return self.inner.inputs

    @property
    def outputs(self) -> tuple[TensorInfo, ...]:
        return self.inner.outputs  # the model's own (v2 reads them)

    @property
    def feeds(self) -> tuple[Feed, ...]:
        return self.inner.feeds

    def feed_for(self, feed: Feed) -> Feed:
        return self.inner.feed_for(feed)

    @property
    def weights_bytes(self) -> int:
        return self.inner.weights_bytes

    def load(self, ctx: EngineContext) -> None:
        self.ctx = ctx
        self.inner.load(ctx)

    @property
    def trial_loads(self) -> bool:  # type: ignore[override]
        return self.inner.trial_loads

    @property
    def late_capture(self) -> bool:  # type: ignore[override]
        return self.inner.late_capture

    def warm_gate(self, buckets: tuple[int, ...]) -> contextlib.AbstractContextManager:
        return self.inner.warm_gate(buckets)  # (a torch U-Net compiles behind the gate too)

    def dtype_in(self, ctx: EngineContext) -> str:
        return self.inner.dtype_in(ctx)

    def trial(self, ctx: EngineContext, feed: Feed, stream: Stream) -> tuple[Any, ...]:
        """The model's own outputs (the precision probe compares floats, not the answer's
        bytes)."""
        self.ctx = ctx
        return self.inner.trial(ctx, feed, stream)

    def plan(self, bucket: int, feed: Feed = "image") -> EnginePlan:
        inner = self.inner.plan(bucket, feed)
        if feed != "image":
            return inner
        hit = self._plans.get((bucket, feed))
        if hit is not None and hit.detail.inner is inner:
            return hit
        ep = self.epilogue
        source = inner.outputs[ep.output]
        op_plan = ep.op.prepare(source, **dict(ep.attrs))
        finite_plan = ALL_FINITE.prepare(source)
        out, fin = op_plan.outputs[0], finite_plan.outputs[0]
        o_out = align(inner.arena_bytes)
        o_fin = align(o_out + out.nbytes)
        o_ws = align(o_fin + fin.nbytes)
        ws = max(op_plan.workspace_bytes, finite_plan.workspace_bytes)
        plan = EnginePlan(
            engine=inner.engine,
            model=inner.model,
            bucket=bucket,
            feed=feed,
            inputs=inner.inputs,
            outputs=(out, fin),
            arena_bytes=o_ws + ws,
            held_bytes=inner.held_bytes,
            flops=inner.flops + op_plan.flops + finite_plan.flops,
            bytes_moved=inner.bytes_moved + op_plan.bytes_moved + finite_plan.bytes_moved,
            detail=_PlanDetail(inner, ep.op, op_plan, finite_plan, (o_out, o_fin, o_ws), ep.output),
        )
        self._plans[(bucket, feed)] = plan
        return plan

    def bind(self, plan: EnginePlan, arena: Any) -> Any:
        if not isinstance(plan.detail, _PlanDetail):
            return self.inner.bind(plan, arena)
        d = plan.detail
        return EpilogueBound(self.inner.bind(d.inner, arena[: d.inner.arena_bytes]), plan, arena)

    def close(self) -> None:
        self.inner.close()
