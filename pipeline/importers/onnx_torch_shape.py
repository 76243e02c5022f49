"""The torch lowerings of the shape and data-movement ops (see ``onnx_torch``): every shape
they read was folded at import time, the batch resolved against the call's (``Call.ints``)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .onnx_ir import Batch, INode
from .onnx_torch import Call, NotLowered, lowers, prepares, torch_, torch_pad


def _axes(m: Call, n: INode, k: int, rank: int) -> list[int] | None:
    """The node's ``axes`` (its attribute, else its input ``k``), made non-negative."""
    raw = n.attrs.get("axes")
    if raw is None and m.has(n, k):
        raw = m.ints(n.inputs[k])
    return None if raw is None else [int(a) % rank for a in raw]


@lowers("Flatten")
def _flatten(m: Call, n: INode, ins: list[Any]) -> Any:
    x = ins[0]
    axis = int(n.attrs.get("axis", 1))  # in [-r, r]: -1 keeps the last axis on its own
    axis = axis + x.dim() if axis < 0 else axis
    return x.reshape(math.prod(x.shape[:axis]), -1)


@lowers("Reshape")
def _reshape(m: Call, n: INode, ins: list[Any]) -> Any:
    x = ins[0]
    shape = m.ints(n.inputs[1])
    if not int(n.attrs.get("allowzero", 0)):
        shape = [x.shape[k] if d == 0 else d for k, d in enumerate(shape)]
    return x.reshape(shape)


@prepares("Squeeze")
def _squeezed(model: Any, n: INode) -> list[int] | None:
    """The axes of a Squeeze without them: the 1s of the input's folded shape, never the
    batch's (a batch of one keeps its axis, as on the native backend); None: it has axes."""
    if "axes" in n.attrs or (len(n.inputs) > 1 and n.inputs[1]):
        return None
    shape = model.shapes.get(n.inputs[0])
    if shape is None:
        raise NotLowered(n, "Squeeze without axes of a tensor whose shape is not known")
    return [k for k, d in enumerate(shape) if not isinstance(d, Batch) and d == 1]


@lowers("Squeeze")
def _squeeze(m: Call, n: INode, ins: list[Any]) -> Any:
    x = ins[0]
    axes = _axes(m, n, 1, x.dim())
    if axes is None:
        axes = m.prepared(n)
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


@prepares("ConstantOfShape")
def _fill_value(model: Any, n: INode) -> tuple[Any, Any]:
    """(the value as a Python number, its torch dtype: None for a float, the model's)."""
    value = np.asarray(n.attrs.get("value", np.zeros(1, np.float32))).reshape(-1)
    if np.issubdtype(value.dtype, np.floating):
        return float(value[0]), None
    torch = torch_()
    dt = torch.bool if value.dtype == np.bool_ else getattr(torch, value.dtype.name)
    return value[0].item(), dt


@lowers("ConstantOfShape")
def _constant_of_shape(m: Call, n: INode, ins: list[Any]) -> Any:
    value, dt = m.prepared(n)
    shape = m.ints(n.inputs[0])
    return torch_().full(shape, value, dtype=m.cdtype if dt is None else dt, device=m.device)


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
    if first < 2 or not 3 <= rank <= 5:  # torch pads the 1-3 axes after (N, C) in these modes
        raise NotLowered(n, f"Pad {mode} of axes torch does not pad in that mode")
    spatial = torch_pads[: 2 * (rank - 2)]  # all of them, or torch refuses the pad's length
    return F.pad(x, spatial, mode="replicate" if mode == "edge" else "reflect")
