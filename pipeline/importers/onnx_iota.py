"""Index arithmetic on the batch index, folded at import time (the dynamo exporter's
``as_strided``: ``Range(0, N) * S`` broadcast-added to constant offsets, then a Gather of
the flattened tensor).

``BatchIota`` is such an index array: ``coef * n + base``, ``n`` running over the batch
along ``axis``. A Gather at one whose offsets walk each item's elements in order is a
view (``onnx_emit_shape``); anything else is refused there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .onnx_ir import BATCH, Batch, INode, refuse


@dataclass(frozen=True)
class BatchIota:
    axis: int
    coef: int
    base: np.ndarray  # int64, one dimension per axis, 1 at ``axis``

    @property
    def shape(self) -> tuple[Any, ...]:
        return tuple(BATCH if k == self.axis else int(d) for k, d in enumerate(self.base.shape))

    def per_item_offsets(self) -> np.ndarray:
        """The offsets of one item's elements, in row-major order of the output."""
        full = [1 if k == self.axis else int(d) for k, d in enumerate(self.base.shape)]
        return np.broadcast_to(self.base, full).reshape(-1)


def _wrap(v: BatchIota) -> np.ndarray:
    out = np.empty((), dtype=object)
    out[()] = v
    return out


def iota_of(a: Any) -> BatchIota | None:
    if isinstance(a, np.ndarray) and a.dtype == object and a.ndim == 0:
        v = a[()]
        return v if isinstance(v, BatchIota) else None
    return None


def _int_const(a: Any) -> np.ndarray | None:
    if a is None or (isinstance(a, np.ndarray) and a.dtype == object):
        return None
    return np.asarray(a).astype(np.int64)


def fold_iota(node: INode, ins: list[Any]) -> np.ndarray | None:
    """The folded output where ``node`` makes or computes on a ``BatchIota``; else None."""
    op = node.op
    if op == "Range":
        s, d, limit = _int_const(ins[0]), _int_const(ins[2]), ins[1]
        lim = limit.reshape(-1)[0] if isinstance(limit, np.ndarray) and limit.size == 1 else None
        if s is not None and d is not None and int(s) == 0 and int(d) == 1 and lim == BATCH:
            return _wrap(BatchIota(0, 1, np.zeros((1,), np.int64)))
        return None
    iotas = [iota_of(x) for x in ins]
    it = next((v for v in iotas if v is not None), None)
    if it is None:
        return None
    if op == "Cast":
        return _wrap(it)
    if op == "Unsqueeze":
        axes = node.attrs.get("axes") or [int(a) for a in _int_const(ins[1]).reshape(-1)]
        r = it.base.ndim + len(axes)
        base, axis = it.base, it.axis
        for a in sorted(int(a) % r for a in axes):
            base = np.expand_dims(base, a)
            axis += a <= axis
        return _wrap(BatchIota(axis, it.coef, base))
    other = _int_const(ins[1] if iotas[0] is not None else ins[0])
    if op in ("Mul", "Add") and other is not None and len(ins) == 2:
        if op == "Mul":
            if other.size != 1:
                return None
            c = int(other.reshape(-1)[0])
            return _wrap(BatchIota(it.axis, it.coef * c, it.base * c))
        r = max(it.base.ndim, other.ndim)
        base = it.base.reshape((1,) * (r - it.base.ndim) + it.base.shape)
        axis = it.axis + r - it.base.ndim
        c = other.reshape((1,) * (r - other.ndim) + other.shape)
        if c.shape[axis] != 1:
            raise refuse(node, "index arithmetic mixes the batch with a constant", shape=c.shape)
        return _wrap(BatchIota(axis, it.coef, base + c))
    return None


def is_item_view(it: BatchIota, per_item: int) -> bool:
    """Whether a Gather of a flat ``[N * per_item]`` tensor at ``it`` is a reshape of it."""
    offs = it.per_item_offsets()
    lead = it.base.shape[: it.axis]
    return (
        it.coef == per_item
        and len(offs) == per_item
        and all(int(d) == 1 for d in lead)
        and np.array_equal(offs, np.arange(per_item))
    )


__all__ = ["Batch", "BatchIota", "fold_iota", "iota_of", "is_item_view"]
