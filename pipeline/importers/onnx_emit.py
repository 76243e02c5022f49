"""Building Ferry's graph from the importer's nodes: the layout bookkeeping and the handlers
of the tensor ops (elementwise, shape, concat, split, softmax, layer norm).

Ferry's convs work in NHWC; ONNX is NCHW. A 4-D activation stays NHWC (``Val.nhwc``) for
as long as its readers can take it so: convs, pools, per-channel ops and channel concats
map the ONNX axis onto the NHWC one. Where a reader needs the ONNX byte order (a flatten
of a map larger than 1x1, a general transpose) one transpose is inserted; a transpose
between the two layouts in the file itself (ConvNeXt's permutes) costs nothing. Shapes
are inferred here, node by node, from the ONNX semantics; reshapes are views.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..graph import COMPUTE_DTYPE, Graph
from ..ops.activation import ACTIVATION
from ..ops.binary import BINARY
from ..ops.layout import TRANSPOSE
from ..ops.reshape import RESHAPE
from .onnx_ir import BATCH, Batch, INode, Val, refuse

Handler = Callable[["Emitter", INode], None]
HANDLERS: dict[str, Handler] = {}
TO_NHWC, TO_NCHW = (0, 2, 3, 1), (0, 3, 1, 2)


def handles(*ops: str) -> Callable[[Handler], Handler]:
    def deco(fn: Handler) -> Handler:
        for op in ops:
            HANDLERS[op] = fn
        return fn

    return deco


class Emitter:
    def __init__(self, g: Graph, consts: dict[str, np.ndarray]) -> None:
        self.g = g
        self.consts = consts
        self.vals: dict[str, Val] = {}
        self._n = 0
        self.static_batch: int | None = None  # the file's fixed batch size, if it has one
        self.opset = 0
        self.float32_out: set[str] = set()  # tensors an op leaves in float32 (softmax)

    # ------------------------------------------------------------------ names, constants
    def fresh(self, base: str) -> str:
        self._n += 1
        return f"{base}#{self._n}"

    def const(self, node: INode, name: str) -> np.ndarray:
        v = self.consts.get(name)
        if v is None:
            raise refuse(node, "this input must be a constant", tensor=name)
        if v.dtype == object:
            raise refuse(node, "this input depends on the batch size", tensor=name)
        return v

    def has_const(self, name: str) -> bool:
        return bool(name) and name in self.consts and self.consts[name].dtype != object

    def graph_const(self, base: str, array: np.ndarray, cast: bool = True) -> str:
        arr = np.asarray(array, dtype=np.float32)
        return self.g.const(self.fresh(base), arr, cast=cast)

    def val(self, node: INode, name: str) -> Val:
        v = self.vals.get(name)
        if v is None:
            raise refuse(
                node, "this input is neither computed by the model nor constant", tensor=name
            )
        return v

    def add(self, op: Any, inputs: list[str], base: str, **attrs: Any) -> str:
        return self.g.add(op, inputs, self.fresh(base), **attrs)

    def put(
        self, name: str, tensor: str, shape: tuple[Any, ...], nhwc: bool, phys: tuple[int, ...]
    ) -> Val:
        v = Val(tensor, tuple(shape), nhwc, tuple(int(d) for d in phys))
        self.vals[name] = v
        return v

    # ------------------------------------------------------------------ layouts
    def plain(self, v: Val) -> Val:
        """``v`` with the ONNX byte order (a transpose out of NHWC unless H = W = 1)."""
        if not v.nhwc:
            return v
        c, h, w = v.item
        if h == 1 and w == 1:
            return Val(v.tensor, v.shape, False, v.phys)
        t = self.add(TRANSPOSE, [self.tensor(v, (h, w, c))], "to_nchw", perm=TO_NCHW)
        return Val(t, v.shape, False, v.item)

    def nhwc(self, node: INode, v: Val) -> Val:
        """A 4-D ``v`` stored NHWC (a transpose into it unless H = W = 1)."""
        if v.nhwc:
            return v
        if v.rank != 4:
            raise refuse(node, "this op needs a 4-D NCHW input", shape=v.shape)
        c, h, w = v.item
        if h == 1 and w == 1:
            return Val(v.tensor, v.shape, True, v.phys)
        t = self.add(TRANSPOSE, [self.tensor(v, v.item)], "to_nhwc", perm=TO_NHWC)
        return Val(t, v.shape, True, (h, w, c))

    def tensor(self, v: Val, phys: tuple[int, ...]) -> str:
        """The Ferry tensor of ``v`` shaped [lead, *phys] (a view where it differs)."""
        phys = tuple(int(d) for d in phys)
        if v.phys == phys:
            return v.tensor
        return self.add(RESHAPE, [v.tensor], "view", shape=(-1, *phys))

    def phys_of(self, v: Val) -> tuple[int, ...]:
        """The natural physical shape: NHWC for ``nhwc`` values, the ONNX shape otherwise."""
        return v.nhwc_item() if v.nhwc else v.item


def onnx_axis(node: INode, axis: int, rank: int) -> int:
    a = axis + rank if axis < 0 else axis
    if not 0 <= a < rank:
        raise refuse(node, "axis out of range", axis=axis, rank=rank)
    return a


def phys_axis(v: Val, axis: int) -> int:
    """The axis of ``v``'s Ferry tensor that holds ONNX axis ``axis`` (>= 1)."""
    return {1: 3, 2: 1, 3: 2}[axis] if v.nhwc else axis


def no_batch_axis(node: INode, axis: int) -> None:
    if axis == 0:
        raise refuse(
            node, "ops along the batch axis are not supported", axis=0, supported="axes >= 1"
        )


def ints_input(em: Emitter, node: INode, k: int, attr: str) -> list[int] | None:
    if attr in node.attrs:
        return [int(a) for a in node.attrs[attr]]
    if len(node.inputs) > k and node.inputs[k]:
        return [int(a) for a in em.const(node, node.inputs[k]).reshape(-1)]
    return None


# ---------------------------------------------------------------------- elementwise
@handles("Act")
def _act(em: Emitter, n: INode) -> None:
    v = em.val(n, n.inputs[0])
    f = n.fused
    t = em.add(
        ACTIVATION, [v.tensor], n.fused["act"], act=f["act"], alpha=f["alpha"], beta=f["beta"]
    )
    em.put(n.outputs[0], t, v.shape, v.nhwc, v.phys)


@handles("Add", "Sub", "Mul", "Div")
def _binary(em: Emitter, n: INode) -> None:
    kind = n.op.lower()
    sides: list[Any] = []
    for name in n.inputs:
        sides.append(
            np.asarray(em.const(n, name), np.float32) if em.has_const(name) else em.val(n, name)
        )
    acts = [s for s in sides if isinstance(s, Val)]
    rank = max(s.rank if isinstance(s, Val) else s.ndim for s in sides)
    if any(s.rank != rank for s in acts):
        raise refuse(
            n,
            "an activation broadcast against one of higher rank is not supported",
            shapes=[s.shape for s in acts],
        )
    nhwc = rank == 4 and any(s.nhwc for s in acts)
    names, shapes = [], []
    for s in sides:
        if isinstance(s, Val):
            s = em.nhwc(n, s) if nhwc else em.plain(s)
            ph = em.phys_of(s)
            names.append(em.tensor(s, ph))
            shapes.append((BATCH, *ph))
        else:
            c = s.reshape((1,) * (rank - s.ndim) + s.shape)
            if c.shape[0] != 1:
                raise refuse(n, "a constant with a batch dimension cannot broadcast", shape=s.shape)
            if nhwc:
                c = c.transpose(TO_NHWC)
            names.append(em.graph_const(n.name or kind, np.ascontiguousarray(c)))
            shapes.append(c.shape)
    out = tuple(np.broadcast_shapes(*[tuple(1 if d == BATCH else d for d in sh) for sh in shapes]))
    f = n.fused
    t = em.add(
        BINARY,
        names,
        kind,
        kind=kind,
        act=f.get("act", "none"),
        alpha=f.get("alpha", 0.0),
        beta=f.get("beta", 0.0),
    )
    phys = out[1:]
    shape = (BATCH, *((phys[2], phys[0], phys[1]) if nhwc else phys))
    em.put(n.outputs[0], t, shape, nhwc, phys)


@handles("Cast")
def _cast(em: Emitter, n: INode) -> None:
    import onnx

    to = int(n.attrs.get("to", 0))
    if to not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16):
        raise refuse(
            n,
            "a runtime Cast to a non-float type is not supported",
            to=to,
            supported=("FLOAT", "FLOAT16"),
        )
    em.vals[n.outputs[0]] = em.val(n, n.inputs[0])


# ---------------------------------------------------------------------- shapes (views)
def _reshaped(em: Emitter, n: INode, v: Val, item: tuple[int, ...]) -> None:
    if int(np.prod(item, dtype=np.int64)) != int(np.prod(v.item, dtype=np.int64)):
        raise refuse(
            n,
            "reshape changes the number of elements per batch item",
            input=v.shape,
            output=(BATCH, *item),
        )
    p = em.plain(v)
    em.put(n.outputs[0], p.tensor, (BATCH, *item), False, p.phys)


@handles("Flatten")
def _flatten(em: Emitter, n: INode) -> None:
    v = em.val(n, n.inputs[0])
    axis = onnx_axis(n, int(n.attrs.get("axis", 1)), v.rank)
    if axis != 1:
        raise refuse(n, "Flatten must keep the batch axis alone", axis=axis, supported=1)
    _reshaped(em, n, v, (int(np.prod(v.item, dtype=np.int64)),))


@handles("Reshape")
def _reshape(em: Emitter, n: INode) -> None:
    v = em.val(n, n.inputs[0])
    target = em.consts.get(n.inputs[1])
    if target is None:
        raise refuse(n, "the target shape of Reshape must be known at import time")
    dims = list(target.reshape(-1))
    if int(n.attrs.get("allowzero", 0)) and any(
        isinstance(d, int | np.integer) and int(d) == 0 for d in dims
    ):
        raise refuse(n, "Reshape to a 0 dimension (allowzero) is not supported", target=str(dims))
    first = dims[0]
    if not (
        first == Batch(1)
        or (isinstance(first, int | np.integer) and int(first) in (0, -1))
        or em.static_batch is not None
        and isinstance(first, int | np.integer)
        and int(first) == em.static_batch
    ):
        raise refuse(n, "Reshape must keep the batch as its first dimension", target=str(dims))
    rest = []
    for k, d in enumerate(dims[1:], start=1):
        if isinstance(d, Batch):
            raise refuse(
                n, "Reshape may use the batch only as its first dimension", target=str(dims)
            )
        d = int(d)
        rest.append(v.shape[k] if d == 0 else d)
    if -1 in rest:
        if first == -1 or rest.count(-1) > 1:
            raise refuse(n, "Reshape has more than one inferred dimension", target=str(dims))
        known = int(np.prod([d for d in rest if d != -1], dtype=np.int64))
        rest[rest.index(-1)] = int(np.prod(v.item, dtype=np.int64)) // max(known, 1)
    _reshaped(em, n, v, tuple(int(d) for d in rest))


@handles("Squeeze", "Unsqueeze")
def _squeeze(em: Emitter, n: INode) -> None:
    v = em.val(n, n.inputs[0])
    axes = ints_input(em, n, 1, "axes")
    shape = list(v.shape)
    if n.op == "Squeeze":
        axes = (
            [onnx_axis(n, a, v.rank) for a in axes]
            if axes is not None
            else [k for k in range(1, v.rank) if shape[k] == 1]
        )
        for a in axes:
            no_batch_axis(n, a)
            if shape[a] != 1:
                raise refuse(n, "Squeeze of a dimension that is not 1", axis=a, shape=v.shape)
        item = tuple(d for k, d in enumerate(shape) if k not in axes)[1:]
    else:
        if axes is None:
            raise refuse(n, "Unsqueeze needs axes")
        r = v.rank + len(axes)
        axes = sorted(onnx_axis(n, a, r) for a in axes)
        for a in axes:
            no_batch_axis(n, a)
            shape.insert(a, 1)
        item = tuple(shape[1:])
    _reshaped(em, n, v, tuple(int(d) for d in item))


@handles("Transpose")
def _transpose(em: Emitter, n: INode) -> None:
    v = em.val(n, n.inputs[0])
    perm = tuple(int(p) for p in n.attrs.get("perm", range(v.rank - 1, -1, -1)))
    if perm[0] != 0:
        raise refuse(n, "Transpose must keep the batch axis first", perm=perm)
    shape = tuple(v.shape[p] for p in perm)
    if v.nhwc and perm == TO_NHWC:  # the bytes already are NHWC
        em.put(n.outputs[0], v.tensor, shape, False, v.phys)
        return
    if not v.nhwc and v.rank == 4 and perm == TO_NCHW:
        em.put(n.outputs[0], v.tensor, shape, True, v.phys)
        return
    p = em.plain(v)
    t = em.add(TRANSPOSE, [em.tensor(p, p.item)], "transpose", perm=perm)
    em.put(n.outputs[0], t, shape, False, shape[1:])


@handles("ChannelShuffle")
def _shuffle(em: Emitter, n: INode) -> None:
    v = em.nhwc(n, em.val(n, n.inputs[0]))
    g = int(n.attrs["groups"])
    c, h, w = v.item
    x5 = em.tensor(v, (h, w, g, c // g))
    t = em.add(TRANSPOSE, [x5], "shuffle", perm=(0, 1, 2, 4, 3))
    em.put(n.outputs[0], t, v.shape, True, (h, w, c // g, g))


__all__ = ["COMPUTE_DTYPE", "Emitter", "HANDLERS", "handles"]
