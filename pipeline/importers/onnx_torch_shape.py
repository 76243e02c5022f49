"""The torch lowerings of the shape and data-movement ops (see ``onnx_torch``): every shape
they read was folded at import time, the batch resolved against the call's (``Call.ints``)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .onnx_ir import INode
from .onnx_torch import Call, NotLowered, lowers, torch_, torch_pad


def _axes(m: Call, n: INode, k: int, rank: int) -> list[int] | None:
    """The node's ``axes`` (its attribute, else its input ``k``), made non-negative."""
    raw = n.attrs.get("axes")
    if raw is None and m.has(n, k):
        raw = m.ints(n.inputs[k])
    return None if raw is None else [int(a) % rank for a in raw]


@lowers("Flatten")
def _flatten(m: Call, n: INode, ins: list[Any]) -> Any:
    x = ins[0]
    axis = int(n.attrs.get("axis", 1)) % (x.dim() + 1) if x.dim() else 0
    return x.reshape(math.prod(x.shape[:axis]), -1)


@lowers("Reshape")
def _reshape(m: Call, n: INode, ins: list[Any]) -> Any:
    x = ins[0]
    shape = m.ints(n.inputs[1])
    if not int(n.attrs.get("allowzero", 0)):
        shape = [x.shape[k] if d == 0 else d for k, d in enumerate(shape)]
    return x.reshape(shape)


@lowers("Squeeze")
def _squeeze(m: Call, n: INode, ins: list[Any]) -> Any:
    x = ins[0]
    axes = _axes(m, n, 1, x.dim())
    if axes is None:
        axes = [k for k, d in enumerate(x.shape) if d == 1]
    keep = [d for k, d in enumerate(x.shape) if k not in axes]
    return x.reshape(keep)


@lowers("Unsqueeze")
def _unsqueeze(m: Call, n: INode, ins: list[Any]) -> Any:
    x = ins[0]
    raw = n.attrs.get("axes") or m.ints(n.inputs[1])
    rank = x.dim() + len(raw)
    shape = list(x.shape)
    for a in sorted(int(a) % rank for a in raw):
        shape.insert(a, 1)
    return x.reshape(shape)


@lowers("Transpose")
def _transpose(m: Call, n: INode, ins: list[Any]) -> Any:
    x = ins[0]
    perm = n.attrs.get("perm") or list(reversed(range(x.dim())))
    return x.permute(*[int(p) for p in perm])


@lowers("ConstantOfShape")
def _constant_of_shape(m: Call, n: INode, ins: list[Any]) -> Any:
    torch = torch_()
    value = np.asarray(n.attrs.get("value", np.zeros(1, np.float32))).reshape(-1)
    dt = m.cdtype if np.issubdtype(value.dtype, np.floating) else getattr(torch, value.dtype.name)
    return torch.full(m.ints(n.inputs[0]), value[0].item(), dtype=dt, device=m.device)


@lowers("Expand")
def _expand(m: Call, n: INode, ins: list[Any]) -> Any:
    torch = torch_()
    x = ins[0]
    shape = torch.broadcast_shapes(tuple(x.shape), tuple(m.ints(n.inputs[1])))
    return x.expand(shape)


@lowers("Gather")
def _gather(m: Call, n: INode, ins: list[Any]) -> Any:
    x = ins[0]
    it = m.module.iotas.get(n.inputs[1])
    if it is not None:  # a view of the flat tensor, item by item (checked at import)
        return x.reshape([m.n if k == it.axis else int(d) for k, d in enumerate(it.base.shape)])
    axis = int(n.attrs.get("axis", 0)) % x.dim()
    size = x.shape[axis]
    idx = [i + size if i < 0 else i for i in m.ints(n.inputs[1])]
    if n.inputs[1] in m.module.scalars:
        return x.select(axis, idx[0])
    if idx != list(range(idx[0], idx[0] + len(idx))):
        raise NotLowered(n, "Gather at indices that are not a run")
    return x.narrow(axis, idx[0], len(idx))


@lowers("Concat")
def _concat(m: Call, n: INode, ins: list[Any]) -> Any:
    parts = [t for t in ins if t is not None]
    return torch_().cat(parts, dim=int(n.attrs.get("axis", 0)) % parts[0].dim())


@lowers("Split")
def _split(m: Call, n: INode, ins: list[Any]) -> Any:
    x = ins[0]
    axis = int(n.attrs.get("axis", 0)) % x.dim()
    sizes = n.attrs.get("split")
    if sizes is None and m.has(n, 1):
        sizes = m.ints(n.inputs[1])
    if sizes is None:
        size, k = x.shape[axis], len(n.outputs)
        sizes = [-(-size // k)] * (k - 1)
        sizes.append(size - sum(sizes))
    return tuple(x.split([int(s) for s in sizes], dim=axis))


@lowers("Slice")
def _slice(m: Call, n: INode, ins: list[Any]) -> Any:
    x = ins[0]
    starts, ends = m.ints(n.inputs[1]), m.ints(n.inputs[2])
    axes = _axes(m, n, 3, x.dim()) or list(range(len(starts)))
    steps = m.ints(n.inputs[4]) if m.has(n, 4) else [1] * len(starts)
    index: list[Any] = [slice(None)] * x.dim()
    for a, s, e, st in zip(axes, starts, ends, steps, strict=True):
        if st < 1:
            raise NotLowered(n, "Slice with steps below 1")
        d = x.shape[a]
        s = max(0, min(d, s + d if s < 0 else s))
        e = max(0, min(d, e + d if e < 0 else e))
        index[a] = slice(s, max(s, e), st)
    return x[tuple(index)]


@lowers("Pad")
def _pad(m: Call, n: INode, ins: list[Any]) -> Any:
    F = torch_().nn.functional
    x = ins[0]
    rank = x.dim()
    raw = n.attrs.get("pads") or m.ints(n.inputs[1])
    axes = _axes(m, n, 3, rank) or list(range(rank))
    pads = [0] * (2 * rank)
    for k, a in enumerate(axes):
        pads[a], pads[a + rank] = int(raw[k]), int(raw[k + len(axes)])
    mode = n.attrs.get("mode", "constant")
    value = float(n.attrs.get("value", 0.0))
    if m.has(n, 2):
        value = m.floats(n.inputs[2])[0] if n.inputs[2] in m.module.floats else value
    torch_pads = torch_pad(pads)
    if mode == "constant":
        return F.pad(x, torch_pads, value=value)
    first = next((a for a in range(rank) if pads[a] or pads[a + rank]), rank)
    if first < 2 or rank - first > 3:  # torch pads the last 1-3 axes of a batch in these modes
        raise NotLowered(n, f"Pad {mode} of axes torch does not pad in that mode")
    trimmed = torch_pads[: 2 * (rank - first)]
    return F.pad(x, trimmed, mode="replicate" if mode == "edge" else "reflect")
