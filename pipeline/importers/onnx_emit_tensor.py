"""Handlers of the tensor ops that move data along one axis (concat, split, slice) and of
the last-axis ops (softmax, layer norm); see ``onnx_emit`` for the layout bookkeeping."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..ops.layout import CONCAT, SLICE
from ..ops.norm import LAYER_NORM
from ..ops.softmax import SOFTMAX
from ..ops.softmax_axis import SOFTMAX_AXIS
from .onnx_emit import Emitter, handles, ints_input, no_batch_axis, onnx_axis, phys_axis
from .onnx_ir import INode, Val, is_batch, refuse


# ---------------------------------------------------------------------- concat, split
@handles("Concat")
def _concat(em: Emitter, n: INode) -> None:
    vals = [em.val(n, x) for x in n.inputs if x]
    r = vals[0].rank
    axis = onnx_axis(n, int(n.attrs.get("axis", 0)), r)
    no_batch_axis(n, axis, vals[0])
    nhwc = r == 4 and any(v.nhwc for v in vals)
    vals = [em.nhwc(n, v) if nhwc else em.plain(v) for v in vals]
    ph = phys_axis(vals[0], axis) if nhwc else axis
    t = em.add(CONCAT, [em.tensor(v, em.phys_of(v)) for v in vals], "concat", axis=ph)
    shape = list(vals[0].shape)
    shape[axis] = sum(int(v.shape[axis]) for v in vals)
    out = Val("", tuple(shape), nhwc, ())
    em.put(n.outputs[0], t, out.shape, nhwc, em.phys_of(out))


def _slice_along(
    em: Emitter, n: INode, v: Val, axis: int, start: int, stop: int, out: str, step: int = 1
) -> Val:
    ph = phys_axis(v, axis) if v.nhwc else axis
    attrs = {"axis": ph, "start": start, "stop": stop} | ({"step": step} if step != 1 else {})
    t = em.add(SLICE, [em.tensor(v, em.phys_of(v))], "slice", **attrs)
    shape = list(v.shape)
    shape[axis] = -(-(stop - start) // step)
    o = Val("", tuple(shape), v.nhwc, ())
    return em.put(out, t, o.shape, v.nhwc, em.phys_of(o))


@handles("Split")
def _split(em: Emitter, n: INode) -> None:
    v = em.val(n, n.inputs[0])
    axis = onnx_axis(n, int(n.attrs.get("axis", 0)), v.rank)
    no_batch_axis(n, axis, v)
    if not v.nhwc or v.rank != 4:
        v = em.plain(v)
    size = int(v.shape[axis])
    sizes = ints_input(em, n, 1, "split")
    if sizes is None:
        k = len(n.outputs)
        sizes = [-(-size // k)] * (k - 1)
        sizes.append(size - sum(sizes))
    start = 0
    for out, s in zip(n.outputs, sizes, strict=True):
        if out:
            _slice_along(em, n, v, axis, start, start + s, out)
        start += s


@handles("Slice")
def _slice(em: Emitter, n: INode) -> None:
    v = em.val(n, n.inputs[0])
    starts, ends = ints_input(em, n, 1, "starts"), ints_input(em, n, 2, "ends")
    axes = ints_input(em, n, 3, "axes") or list(range(len(starts)))
    steps = ints_input(em, n, 4, "steps") or [1] * len(starts)
    cur = v if (v.nhwc and v.rank == 4) else em.plain(v)
    todo = [
        (onnx_axis(n, a, v.rank), s, e, st)
        for a, s, e, st in zip(axes, starts, ends, steps, strict=True)
        if not (st == 1 and s == 0 and _reaches_end(v.shape[onnx_axis(n, a, v.rank)], e))
    ]
    if any(st < 1 for st in steps):
        raise refuse(n, "Slice with steps below 1 is not supported", steps=steps)
    if not todo:
        em.vals[n.outputs[0]] = v
        return
    for k, (a, s, e, st) in enumerate(todo):
        no_batch_axis(n, a, v)
        size = int(cur.shape[a])
        s, e = (s + size if s < 0 else s), (e + size if e < 0 else e)
        s, e = max(0, min(s, size)), max(0, min(e, size))
        if e <= s:
            raise refuse(n, "Slice to an empty tensor is not supported", axis=a, start=s, end=e)
        out = n.outputs[0] if k == len(todo) - 1 else em.fresh("slice")
        cur = _slice_along(em, n, cur, a, s, e, out, st)


def _reaches_end(dim: Any, end: int) -> bool:
    return is_batch(dim) and end >= 2**62 or not is_batch(dim) and end >= int(dim)


# ---------------------------------------------------------------------- softmax, layer norm
@handles("Softmax")
def _softmax(em: Emitter, n: INode) -> None:
    """A model output over the last axis: ``softmax`` (float32 out, as classifiers had it);
    anywhere else ``softmax_axis`` in the compute dtype (attention)."""
    v = em.plain(em.val(n, n.inputs[0]))
    axis = onnx_axis(n, int(n.attrs.get("axis", -1 if em.opset >= 13 else 1)), v.rank)
    if em.opset < 13 and axis != v.rank - 1:
        raise refuse(n, "Softmax before opset 13 only over the last axis", axis=axis)
    no_batch_axis(n, axis, v)
    if axis == v.rank - 1 and n.outputs[0] in em.outputs:
        c = int(v.shape[-1])
        t = em.add(SOFTMAX, [em.tensor(v, (c,))], "softmax")
        em.put(n.outputs[0], t, v.shape, False, (c,))
        em.float32_out.add(n.outputs[0])
        return
    t = em.add(SOFTMAX_AXIS, [em.full(v)], "softmax", axis=axis)
    em.put(n.outputs[0], t, v.shape, False, v.shape[1:])


@handles("LayerNormalization")
def _layer_norm(em: Emitter, n: INode) -> None:
    v = em.val(n, n.inputs[0])
    axis = onnx_axis(n, int(n.attrs.get("axis", -1)), v.rank)
    if axis != v.rank - 1 or len([o for o in n.outputs if o]) > 1:
        raise refuse(n, "LayerNormalization only over the last axis, one output", axis=axis)
    v = em.plain(v)
    c = int(v.shape[-1])
    gamma = em.const(n, n.inputs[1]).astype(np.float32).reshape(-1)
    beta = (
        em.const(n, n.inputs[2]).astype(np.float32).reshape(-1)
        if len(n.inputs) > 2 and n.inputs[2]
        else np.zeros(c, np.float32)
    )
    ins = [
        em.tensor(v, (c,)),
        em.graph_const("ln.g", gamma, cast=False),
        em.graph_const("ln.b", beta, cast=False),
    ]
    t = em.add(LAYER_NORM, ins, "layer_norm", eps=float(n.attrs.get("epsilon", 1e-5)))
    em.put(n.outputs[0], t, v.shape, False, (c,))
