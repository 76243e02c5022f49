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
from .onnx_ir import BATCH, INode, Val, batch_axis, is_batch, per_item, refuse, registrar

Handler = Callable[["Emitter", INode], None]
HANDLERS: dict[str, Handler] = {}
TO_NHWC, TO_NCHW = (0, 2, 3, 1), (0, 3, 1, 2)


handles = registrar(HANDLERS)  # @handles("Add", "Sub"): the emitter of those ops


class Emitter:
    def __init__(self, g: Graph, consts: dict[str, np.ndarray]) -> None:
        self.g = g
        self.consts = consts
        self.vals: dict[str, Val] = {}
        self._n = 0
        self.static_batch: int | None = None  # the file's fixed batch size, if it has one
        self.opset = 0
        self.float32_out: set[str] = set()  # tensors an op leaves in float32 (softmax)
        self.outputs: set[str] = set()  # the model's outputs (a softmax there stays float32)

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
        v = Val(tensor, tuple(shape), nhwc, _dims(phys))
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

    def tensor(self, v: Val, phys: tuple[Any, ...]) -> str:
        """The Ferry tensor of ``v`` shaped [lead, *phys] (a view where it differs): the
        lead holds the batch, or, where ``phys`` has the ``Batch``, is a fixed size."""
        phys = _dims(phys)
        if v.phys == phys:
            return v.tensor
        b = batch_axis(phys)
        if b is None:
            shape: tuple[int, ...] = (-1, *phys)
        else:
            lead, rest = divmod(per_item(v.shape), per_item(phys))
            if rest or lead < 1:
                raise refuse(None, "a view of a tensor does not fit", shape=v.shape, view=phys)
            shape = (lead, *(-1 if is_batch(d) else int(d) for d in phys))
        return self.add(RESHAPE, [v.tensor], "view", shape=shape)

    def full(self, v: Val) -> str:
        """The Ferry tensor of ``v`` in the ONNX shape and byte order."""
        p = self.plain(v)
        return self.tensor(p, p.shape[1:])

    def phys_of(self, v: Val) -> tuple[Any, ...]:
        """The natural physical shape: NHWC for ``nhwc`` values, the ONNX shape otherwise."""
        return v.nhwc_item() if v.nhwc else tuple(v.shape[1:])


def _dims(shape: Any) -> tuple[Any, ...]:
    return tuple(d if is_batch(d) else int(d) for d in shape)


def onnx_axis(node: INode, axis: int, rank: int) -> int:
    a = axis + rank if axis < 0 else axis
    if not 0 <= a < rank:
        raise refuse(node, "axis out of range", axis=axis, rank=rank)
    return a


def phys_axis(v: Val, axis: int) -> int:
    """The axis of ``v``'s Ferry tensor that holds ONNX axis ``axis`` (>= 1)."""
    return {1: 3, 2: 1, 3: 2}[axis] if v.nhwc else axis


def no_batch_axis(node: INode, axis: int, v: Val | None = None) -> None:
    """Refuse an op along the axis that holds the batch (it would mix a batch's items)."""
    b = 0 if v is None else batch_axis(v.shape)
    if axis == b:
        raise refuse(
            node,
            "ops along the batch axis are not supported",
            axis=axis,
            supported="axes that do not hold the batch",
        )


def sym_broadcast(node: INode, shapes: list[tuple[Any, ...]]) -> tuple[Any, ...]:
    """numpy's broadcast of shapes that may hold the batch (a ``Batch`` meets 1 or itself)."""
    rank = max(len(s) for s in shapes)
    padded = [(1,) * (rank - len(s)) + tuple(s) for s in shapes]
    out: list[Any] = []
    for dims in zip(*padded, strict=True):
        b = {d for d in dims if is_batch(d)}
        ints = {int(d) for d in dims if not is_batch(d)} - {1}
        if len(b) > 1 or (b and ints) or len(ints) > 1:
            raise refuse(node, "shapes do not broadcast", shapes=[str(s) for s in shapes])
        out.append(b.pop() if b else (ints.pop() if ints else 1))
    return tuple(out)


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
    batch_at = {batch_axis(s.shape) for s in acts}
    names, shapes = [], []
    for s in sides:
        if isinstance(s, Val):
            s = em.nhwc(n, s) if nhwc else em.plain(s)
            ph = em.phys_of(s)
            names.append(em.tensor(s, ph))
            shapes.append((BATCH, *ph) if nhwc else tuple(s.shape))
        else:
            c = s.reshape((1,) * (rank - s.ndim) + s.shape)
            if any(c.shape[b] != 1 for b in batch_at if b is not None):
                raise refuse(n, "a constant with a batch dimension cannot broadcast", shape=s.shape)
            if nhwc:
                c = c.transpose(TO_NHWC)
            names.append(em.graph_const(n.name or kind, np.ascontiguousarray(c)))
            shapes.append(c.shape)
    out = sym_broadcast(n, shapes)
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
    shape = (BATCH, *((phys[2], phys[0], phys[1]) if nhwc else phys)) if nhwc else out
    em.put(n.outputs[0], t, shape, nhwc, phys)


@handles("Cast")
def _cast(em: Emitter, n: INode) -> None:
    import onnx  # optional: onnx

    to = int(n.attrs.get("to", 0))
    if to not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16):
        raise refuse(
            n,
            "a runtime Cast to a non-float type is not supported",
            to=to,
            supported=("FLOAT", "FLOAT16"),
        )
    em.vals[n.outputs[0]] = em.val(n, n.inputs[0])


__all__ = ["COMPUTE_DTYPE", "Emitter", "HANDLERS", "handles"]
