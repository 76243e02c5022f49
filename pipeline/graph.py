"""A model as a graph of two-phase ops: planning, one arena per batch, CUDA graph capture.

``Graph.prepare(batch_size)`` plans every op and lays every activation and workspace out in
one arena, reusing the bytes of tensors whose last reader has run (liveness), so a batch
needs exactly one reservation. ``GraphPlan.bind(arena, constants)`` makes the views once;
``BoundGraph.run(stream)`` enqueues the whole graph and ``BoundGraph.capture(stream)``
records it as a CUDA graph to replay.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .device import Stream
from .errors import InvalidInput
from .ops.base import Op, OpPlan, TensorSpec, align, workspace_view

ARENA_ALIGN = 256
COMPUTE_DTYPE = "@compute"  # an attribute value replaced by the plan's compute dtype


@dataclass(frozen=True)
class Node:
    op: Op
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: tuple[tuple[str, Any], ...]
    name: str


@dataclass(frozen=True)
class Constant:
    array: np.ndarray  # host copy, float32 or integer
    cast: bool  # True: stored in the compute dtype; False: kept as is (biases stay float32)


class Graph:
    """Ops in execution order, named tensors, host constants and one batched input."""

    def __init__(
        self, name: str, input_name: str, item_shape: Sequence[int], input_dtype: str
    ) -> None:
        self.name = name
        self.input_name = input_name
        self.item_shape = tuple(int(d) for d in item_shape)
        self.input_dtype = np.dtype(input_dtype).name
        self.constants: dict[str, Constant] = {}
        self.nodes: list[Node] = []
        self.outputs: tuple[str, ...] = ()
        self._produced: set[str] = {input_name}
        self._plans: dict[tuple, GraphPlan] = {}
        self._lock = threading.Lock()

    # -- building
    def const(self, name: str, array: np.ndarray, cast: bool = True) -> str:
        if name in self.constants or name in self._produced:
            raise ValueError(f"tensor {name!r} already exists in graph {self.name!r}")
        self.constants[name] = Constant(np.ascontiguousarray(array), cast)
        return name

    def add(self, op: Op, inputs: Sequence[str], name: str, n_out: int = 1, **attrs: Any) -> Any:
        for t in inputs:
            if t not in self._produced and t not in self.constants:
                raise ValueError(f"node {name!r} reads {t!r}, which nothing produced yet")
        outs = tuple(name if n_out == 1 else f"{name}:{i}" for i in range(n_out))
        for o in outs:
            if o in self._produced or o in self.constants:
                raise ValueError(f"tensor {o!r} already exists in graph {self.name!r}")
            self._produced.add(o)
        self.nodes.append(Node(op, tuple(inputs), outs, tuple(sorted(attrs.items())), name))
        return outs[0] if n_out == 1 else outs

    def set_outputs(self, *names: str) -> None:
        for n in names:
            if n not in self._produced:
                raise ValueError(f"output {n!r} is not produced by graph {self.name!r}")
        self.outputs = tuple(names)

    def constant_spec(self, name: str, dtype: str) -> TensorSpec:
        c = self.constants[name]
        return TensorSpec(c.array.shape, dtype if c.cast else c.array.dtype.name)

    def constant_arrays(self, dtype: str) -> dict[str, np.ndarray]:
        """Host constants converted the way a backend of compute dtype ``dtype`` stores them."""
        return {
            k: (c.array.astype(dtype) if c.cast else c.array) for k, c in self.constants.items()
        }

    # -- planning
    def prepare(
        self,
        batch_size: int,
        dtype: str = "float32",
        target: str = "host",
        max_workspace_bytes: int = 256 << 20,
    ) -> GraphPlan:
        """Plan a batch: every op's plan, the arena layout, and the costs. Cached."""
        if batch_size < 1:
            raise InvalidInput("batch_size must be >= 1", batch_size=batch_size)
        if not self.outputs:
            raise ValueError(f"graph {self.name!r} has no outputs")
        key = (int(batch_size), np.dtype(dtype).name, target, int(max_workspace_bytes))
        plan = self._plans.get(key)
        if plan is None:
            with self._lock:
                plan = self._plans.get(key)
                if plan is None:
                    plan = _plan_graph(self, *key)
                    self._plans[key] = plan
        return plan


@dataclass
class GraphPlan:
    graph: Graph
    batch_size: int
    dtype: str
    target: str
    specs: dict[str, TensorSpec]
    steps: list[tuple[Node, OpPlan, int]]  # (node, plan, workspace offset)
    offsets: dict[str, int]  # every arena tensor (views share their root's offset)
    live: dict[str, tuple[int, int]]  # root tensor -> (first step, last step)
    arena_bytes: int
    total_tensor_bytes: int  # what the arena would need without reuse
    flops: int
    bytes_moved: int
    _bound: dict[int, BoundGraph] = field(default_factory=dict, repr=False)

    @property
    def input_spec(self) -> TensorSpec:
        return self.specs[self.graph.input_name]

    @property
    def output_specs(self) -> tuple[TensorSpec, ...]:
        return tuple(self.specs[o] for o in self.graph.outputs)

    def bind(self, arena: Any, constants: dict[str, Any]) -> BoundGraph:
        """Views of every tensor in ``arena`` (a flat uint8 array of >= ``arena_bytes``)."""
        if arena.nbytes < self.arena_bytes:
            raise ValueError(
                f"arena of {arena.nbytes} bytes is smaller than the plan's {self.arena_bytes}"
            )
        return BoundGraph(self, arena, constants)


class BoundGraph:
    """A plan bound to one arena: ready to run or to capture."""

    def __init__(self, plan: GraphPlan, arena: Any, constants: dict[str, Any]) -> None:
        self.plan = plan
        self.arena = arena
        arrays: dict[str, Any] = {}
        for name, spec in plan.specs.items():
            if name in plan.offsets:
                arrays[name] = workspace_view(arena, plan.offsets[name], spec.shape, spec.dtype)
            else:
                arrays[name] = constants[name]
        self.arrays = arrays
        self.steps = [
            (
                node.op,
                op_plan,
                tuple(arrays[i] for i in node.inputs),
                tuple(arrays[o] for o in node.outputs),
                arena[ws_off : ws_off + op_plan.workspace_bytes]
                if op_plan.workspace_bytes
                else None,
            )
            for node, op_plan, ws_off in plan.steps
        ]
        self.input = arrays[plan.graph.input_name]
        self.outputs = tuple(arrays[o] for o in plan.graph.outputs)

    def run(self, stream: Stream) -> None:
        for op, op_plan, ins, outs, ws in self.steps:
            op.commit(op_plan, ins, outs, ws, stream)

    def capture(self, stream: Stream) -> Any:
        """Record the graph's work on ``stream`` as a CUDA graph (cupy ``Graph``)."""
        raw = stream.raw
        if raw is None:
            raise RuntimeError("CUDA graphs need a CUDA stream")
        raw.begin_capture()
        try:
            self.run(stream)
        finally:
            graph = raw.end_capture()
        return graph


# --------------------------------------------------------------------------- planning


class _Arena:
    """Best-fit placement of blocks in one linear arena, with coalescing of free space."""

    def __init__(self) -> None:
        self.free: list[tuple[int, int]] = []  # (offset, size), sorted by offset
        self.top = 0

    def alloc(self, size: int) -> int:
        size = align(max(size, 1), ARENA_ALIGN)
        best = None
        for i, (_off, sz) in enumerate(self.free):
            if sz >= size and (best is None or sz < self.free[best][1]):
                best = i
        if best is not None:
            off, sz = self.free.pop(best)
            if sz > size:
                bisect.insort(self.free, (off + size, sz - size))
            return off
        # grow: reuse a free block that ends at the top, if any
        if self.free and self.free[-1][0] + self.free[-1][1] == self.top:
            off, _ = self.free.pop()
            self.top = off + size
            return off
        off = self.top
        self.top += size
        return off

    def release(self, off: int, size: int) -> None:
        size = align(max(size, 1), ARENA_ALIGN)
        bisect.insort(self.free, (off, size))
        merged: list[tuple[int, int]] = []
        for o, s in self.free:
            if merged and merged[-1][0] + merged[-1][1] == o:
                merged[-1] = (merged[-1][0], merged[-1][1] + s)
            else:
                merged.append((o, s))
        self.free = merged


def _plan_ops(
    g: Graph, batch: int, dtype: str, target: str, max_ws: int
) -> tuple[dict[str, TensorSpec], dict[str, str], list[OpPlan]]:
    """Every node planned at ``batch``: the spec of each tensor, the root tensor each one is a
    view of (itself where it owns memory), and the nodes' plans in order."""
    specs: dict[str, TensorSpec] = {g.input_name: TensorSpec((batch, *g.item_shape), g.input_dtype)}
    for name in g.constants:
        specs[name] = g.constant_spec(name, dtype)
    root: dict[str, str] = {g.input_name: g.input_name}
    plans: list[OpPlan] = []
    for node in g.nodes:
        attrs = {k: (dtype if v == COMPUTE_DTYPE else v) for k, v in node.attrs}
        for a in node.op.planning_attrs:
            attrs.setdefault(a, {"target": target, "max_workspace_bytes": max_ws}[a])
        try:
            plan = node.op.prepare(*(specs[i] for i in node.inputs), **attrs)
        except InvalidInput as exc:
            exc.at_node(node.name)
            raise
        if len(plan.outputs) != len(node.outputs):
            raise ValueError(
                f"node {node.name!r}: op gives {len(plan.outputs)} outputs, graph names {len(node.outputs)}"
            )
        for o, s in zip(node.outputs, plan.outputs, strict=True):
            specs[o] = s
            root[o] = root[node.inputs[0]] if node.op.is_view else o
        plans.append(plan)
    return specs, root, plans


def _liveness(g: Graph, root: dict[str, str]) -> dict[str, list[int]]:
    """The first and last step each root tensor is used at; graph outputs live to the end."""
    end = len(g.nodes)
    live: dict[str, list[int]] = {g.input_name: [-1, -1]}
    for i, node in enumerate(g.nodes):
        for o in node.outputs:
            live.setdefault(root[o], [i, i])
        for t in node.inputs:
            if t in root:
                live[root[t]][1] = max(live[root[t]][1], i)
    for o in g.outputs:
        live[root[o]][1] = end
    return live


def _plan_graph(g: Graph, batch: int, dtype: str, target: str, max_ws: int) -> GraphPlan:
    specs, root, plans = _plan_ops(g, batch, dtype, target, max_ws)
    live = _liveness(g, root)
    arena = _Arena()
    offsets: dict[str, int] = {}
    dies_at: dict[int, list[str]] = {}
    for r, (_, last) in live.items():
        dies_at.setdefault(last, []).append(r)
    total = specs[g.input_name].nbytes
    offsets[g.input_name] = arena.alloc(specs[g.input_name].nbytes)
    steps: list[tuple[Node, OpPlan, int]] = []
    flops = moved = 0
    for i, (node, plan) in enumerate(zip(g.nodes, plans, strict=True)):
        for o in node.outputs:
            if root[o] == o:
                offsets[o] = arena.alloc(specs[o].nbytes)
                total += specs[o].nbytes
        ws_off = arena.alloc(plan.workspace_bytes) if plan.workspace_bytes else 0
        total += plan.workspace_bytes
        if plan.workspace_bytes:
            arena.release(ws_off, plan.workspace_bytes)
        for r in dies_at.get(i, ()):
            arena.release(offsets[r], specs[r].nbytes)
        steps.append((node, plan, ws_off))
        flops += plan.flops
        moved += plan.bytes_moved
    for name, r in root.items():
        offsets[name] = offsets[r]
    return GraphPlan(
        graph=g,
        batch_size=batch,
        dtype=dtype,
        target=target,
        specs=specs,
        steps=steps,
        offsets=offsets,
        live={k: (v[0], v[1]) for k, v in live.items()},
        arena_bytes=align(arena.top, ARENA_ALIGN),
        total_tensor_bytes=total,
        flops=flops,
        bytes_moved=moved,
    )
