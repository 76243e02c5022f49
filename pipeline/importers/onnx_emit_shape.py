"""Handlers of the ops that reshape, permute or broadcast: Flatten, Reshape, Squeeze,
Unsqueeze, Transpose, ChannelShuffle, Expand, and Gather of a computed tensor.

The batch may sit in any one dimension (a transformer's ``[L, N, E]`` and ``[N*12, L, 64]``,
see ``onnx_ir.Batch``); reshapes are views, and a reshape that would split a batch item
across dimensions (so that padding a bucket changed a row's answer) is refused.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..ops.expand import EXPAND
from ..ops.layout import TRANSPOSE
from .onnx_emit import (
    TO_NCHW,
    TO_NHWC,
    Emitter,
    handles,
    ints_input,
    no_batch_axis,
    onnx_axis,
    sym_broadcast,
)
from .onnx_emit_tensor import _slice_along
from .onnx_iota import iota_of, is_item_view
from .onnx_ir import BATCH, Batch, INode, Val, batch_axis, is_batch, per_item, refuse


def _reshaped(em: Emitter, n: INode, v: Val, shape: tuple[Any, ...]) -> None:
    """``v`` viewed as the ONNX ``shape`` (with its ``Batch``): the same bytes, row-major."""
    if per_item(shape) != per_item(v.shape) or batch_axis(shape) is None:
        raise refuse(
            n, "reshape changes the number of elements per batch item", input=v.shape, output=shape
        )
    p = em.plain(v)
    em.put(n.outputs[0], p.tensor, shape, False, p.phys)


def _ints(dims: Any) -> int:
    return int(np.prod([int(d) for d in dims], dtype=np.int64)) if len(dims) else 1


def _batch_dim(n: INode, v: Val, out: list[Any], pos: int) -> Batch:
    """The ``Batch`` of dimension ``pos`` of ``out``: the items stay whole, or refused."""
    j = batch_axis(v.shape)
    b = v.shape[j]
    outer = _ints(v.shape[:j]) * b.outer  # elements' blocks before the batch index
    inner = b.inner * _ints(v.shape[j + 1 :])
    before, after = _ints(out[:pos]), _ints(out[pos + 1 :])
    if outer % before or inner % after:
        raise refuse(
            n,
            "Reshape splits a batch item across dimensions",
            input=v.shape,
            target=str(out),
        )
    return Batch((outer // before) * (inner // after), inner // after)


def target_shape(em: Emitter, n: INode, v: Val, dims: list[Any]) -> tuple[Any, ...]:
    """The ONNX shape a Reshape to ``dims`` (ints, 0, -1, a folded ``Batch``) gives ``v``."""
    allowzero = int(n.attrs.get("allowzero", 0))
    out: list[Any] = []
    for k, d in enumerate(dims):
        if not is_batch(d) and int(d) == 0:
            if allowzero:
                raise refuse(n, "Reshape to a 0 dimension (allowzero) is not supported")
            if k >= v.rank:
                raise refuse(n, "Reshape copies a dimension the input has not", target=str(dims))
            d = v.shape[k]
        out.append(d if is_batch(d) else int(d))
    sym = [k for k, d in enumerate(out) if is_batch(d)]
    free = [k for k, d in enumerate(out) if not is_batch(d) and d == -1]
    if len(sym) > 1 or len(free) > 1:
        raise refuse(n, "Reshape has more than one inferred dimension", target=str(dims))
    if not sym and not free:
        if em.static_batch is None or not out or out[0] != em.static_batch:
            raise refuse(n, "Reshape must keep the batch in one dimension", target=str(dims))
        sym, out[0] = [0], BATCH
    if sym and free:
        known = per_item([d for k, d in enumerate(out) if k != free[0]])
        q, r = divmod(per_item(v.shape), known)
        if r or q < 1:
            raise refuse(
                n, "reshape changes the number of elements per batch item", input=v.shape,
                output=str(dims),
            )  # fmt: skip
        out[free[0]] = q
    pos = sym[0] if sym else free[0]
    given = out[pos]
    out[pos] = 1
    got = _batch_dim(n, v, out, pos)
    if is_batch(given) and given.k != got.k:
        raise refuse(
            n, "reshape changes the number of elements per batch item", input=v.shape,
            output=str(dims),
        )  # fmt: skip
    out[pos] = got
    return tuple(out)


@handles("Flatten")
def _flatten(em: Emitter, n: INode) -> None:
    v = em.val(n, n.inputs[0])
    axis = onnx_axis(n, int(n.attrs.get("axis", 1)), v.rank)
    b = batch_axis(v.shape)
    if b is None or axis == 0:
        raise refuse(n, "Flatten must keep the batch in one dimension", axis=axis)
    dims = [-1, _ints(v.shape[axis:])] if b < axis else [_ints(v.shape[:axis]), -1]
    _reshaped(em, n, v, target_shape(em, n, v, dims))


@handles("Reshape")
def _reshape(em: Emitter, n: INode) -> None:
    v = em.val(n, n.inputs[0])
    target = em.consts.get(n.inputs[1])
    if target is None:
        raise refuse(n, "the target shape of Reshape must be known at import time")
    _reshaped(em, n, v, target_shape(em, n, v, list(target.reshape(-1))))


@handles("Squeeze", "Unsqueeze")
def _squeeze(em: Emitter, n: INode) -> None:
    v = em.val(n, n.inputs[0])
    axes = ints_input(em, n, 1, "axes")
    shape = list(v.shape)
    if n.op == "Squeeze":
        axes = (
            [onnx_axis(n, a, v.rank) for a in axes]
            if axes is not None
            else [k for k, d in enumerate(shape) if not is_batch(d) and d == 1]
        )
        for a in axes:
            if is_batch(shape[a]) or shape[a] != 1:
                raise refuse(n, "Squeeze of a dimension that is not 1", axis=a, shape=v.shape)
        out = tuple(d for k, d in enumerate(shape) if k not in axes)
    else:
        if axes is None:
            raise refuse(n, "Unsqueeze needs axes")
        r = v.rank + len(axes)
        for a in sorted(onnx_axis(n, a, r) for a in axes):
            shape.insert(a, 1)
        out = tuple(shape)
    _reshaped(em, n, v, out)


@handles("Transpose")
def _transpose(em: Emitter, n: INode) -> None:
    v = em.val(n, n.inputs[0])
    perm = tuple(int(p) for p in n.attrs.get("perm", range(v.rank - 1, -1, -1)))
    if sorted(perm) != list(range(v.rank)):
        raise refuse(n, "Transpose needs a permutation of the axes", perm=perm)
    shape = tuple(v.shape[p] for p in perm)
    if perm == tuple(range(v.rank)):
        em.vals[n.outputs[0]] = v
        return
    if v.nhwc and perm == TO_NHWC:  # the bytes already are NHWC
        em.put(n.outputs[0], v.tensor, shape, False, v.phys)
        return
    if not v.nhwc and v.rank == 4 and perm == TO_NCHW and v.batch_first:
        em.put(n.outputs[0], v.tensor, shape, True, v.phys)
        return
    t = em.add(TRANSPOSE, [em.full(v)], "transpose", perm=perm)
    em.put(n.outputs[0], t, shape, False, shape[1:])


@handles("ChannelShuffle")
def _shuffle(em: Emitter, n: INode) -> None:
    v = em.nhwc(n, em.val(n, n.inputs[0]))
    g = int(n.attrs["groups"])
    c, h, w = v.item
    x5 = em.tensor(v, (h, w, g, c // g))
    t = em.add(TRANSPOSE, [x5], "shuffle", perm=(0, 1, 2, 4, 3))
    em.put(n.outputs[0], t, v.shape, True, (h, w, c // g, g))


@handles("ConstantOfShape")
def _constant_of_shape(em: Emitter, n: INode) -> None:
    """A float filled to a shape that holds the batch: an Expand of the value."""
    value = np.asarray(n.attrs.get("value", np.zeros(1, np.float32)))
    if value.dtype.kind != "f":
        raise refuse(n, "ConstantOfShape of the batch's shape needs a float value")
    _expand_const(em, n, value.reshape(()), _dims_of(em, n))


def _dims_of(em: Emitter, n: INode) -> list[Any]:
    name = n.inputs[-1]
    if name not in em.consts:
        raise refuse(n, "the shape must be known at import time", tensor=name)
    return [d if is_batch(d) else int(d) for d in em.consts[name].reshape(-1)]


def _expand_const(em: Emitter, n: INode, x: np.ndarray, dims: list[Any]) -> None:
    x = np.asarray(x, np.float32)
    out = sym_broadcast(n, [x.shape, tuple(dims)])
    b = batch_axis(out)
    if b is None:
        raise refuse(n, "Expand of a constant needs the batch in its shape", shape=str(dims))
    c = em.graph_const(n.name or "expand", x.reshape((1,) * (len(out) - x.ndim) + x.shape))
    shape = tuple(-1 if is_batch(d) else int(d) for d in out)
    t = em.add(EXPAND, [c, em.g.input_name], "expand", shape=shape, batch_k=out[b].k)
    em.put(n.outputs[0], t, out, False, out[1:])


@handles("Expand")
def _expand(em: Emitter, n: INode) -> None:
    dims = _dims_of(em, n)
    if em.has_const(n.inputs[0]):
        _expand_const(em, n, em.const(n, n.inputs[0]), dims)
        return
    v = em.plain(em.val(n, n.inputs[0]))
    lead = len(dims) - v.rank
    vb = batch_axis(v.shape)
    dims = [1 if is_batch(d) and k - lead == vb else d for k, d in enumerate(dims)]
    out = sym_broadcast(n, [v.shape, tuple(dims)])
    if batch_axis(out) is None:
        raise refuse(n, "Expand must keep the batch in one dimension", shape=str(dims))
    if out == v.shape:
        em.vals[n.outputs[0]] = v
        return
    shape = tuple(-1 if is_batch(d) else int(d) for d in out)
    t = em.add(EXPAND, [em.full(v)], "expand", shape=shape)
    em.put(n.outputs[0], t, out, False, out[1:])


@handles("Gather")
def _gather(em: Emitter, n: INode) -> None:
    """Gather of a computed tensor at constant indices: a slice (a scalar index drops the axis)."""
    v = em.plain(em.val(n, n.inputs[0]))
    axis = onnx_axis(n, int(n.attrs.get("axis", 0)), v.rank)
    it = iota_of(em.consts.get(n.inputs[1]))
    if it is not None:  # the dynamo exporter's as_strided of a flattened tensor
        if v.rank != 1 or axis != 0 or not is_item_view(it, per_item(v.shape)):
            raise refuse(n, "Gather at batch-dependent indices that are not a view of the input")
        em.put(n.outputs[0], v.tensor, it.shape, False, v.phys)
        return
    no_batch_axis(n, axis, v)
    idx = np.asarray(em.const(n, n.inputs[1])).astype(np.int64)
    size = int(v.shape[axis])
    idx = np.where(idx < 0, idx + size, idx)
    flat = idx.reshape(-1)
    if (
        idx.ndim > 1
        or not len(flat)
        or np.any(np.diff(flat) != 1)
        or flat[0] < 0
        or flat[-1] >= size
    ):
        raise refuse(
            n, "Gather of a computed tensor needs a scalar or a run of indices", indices=str(flat[:8])
        )  # fmt: skip
    out = n.outputs[0] if idx.ndim else em.fresh("gather")
    s = _slice_along(em, n, v, axis, int(flat[0]), int(flat[-1]) + 1, out)
    if not idx.ndim:
        shape = tuple(d for k, d in enumerate(s.shape) if k != axis)
        em.put(n.outputs[0], s.tensor, shape, False, s.phys)
