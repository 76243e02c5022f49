"""The importer's intermediate form: ONNX nodes after folding, before Ferry's graph is built.

``INode`` is one ONNX node (or several fused into one: a conv with its batch norm,
activation and residual add); ``Val`` is what an ONNX tensor became in Ferry's graph (a
tensor name, the ONNX shape, and how the bytes are laid out). ``Batch`` is the batch
dimension inside shape arithmetic that is folded at import time (``Shape`` of an
activation gives ``[Batch(1), C, H, W]``) and in the shapes of runtime tensors: a
transformer's ``[N*12, L, 64]`` is ``(Batch(12), L, 64)``, its ``[L, N, E]`` is
``(L, Batch(1), E)``. Exactly one dimension of a runtime tensor holds the batch; each
bucket's plan resolves it (a view's shape has -1 there).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from ..errors import ModelRefused


class BatchMoved(TypeError):
    """An op that needs the batch as the first dimension met it elsewhere (refused)."""


@dataclass(frozen=True)
class Batch:
    """``k`` times the batch size, inside folded shape arithmetic and runtime shapes.

    In a runtime tensor's shape the dimension is ``a * N * b`` with ``k = a * b`` and
    ``inner = b``: ``[L*N, E]`` (the batch inside) is ``Batch(L)``, ``[N*12, L, 64]`` is
    ``Batch(12, 12)``. Reshapes keep the batch's items whole by these two numbers. Folded
    shape arithmetic only counts (``inner`` stays 1).
    """

    k: int = 1
    inner: int = 1

    def __mul__(self, other: Any) -> Batch:
        if isinstance(other, int | np.integer):
            return Batch(self.k * int(other))
        return NotImplemented

    __rmul__ = __mul__

    def __floordiv__(self, other: Any) -> Batch:
        if isinstance(other, int | np.integer) and other and self.k % int(other) == 0:
            return Batch(self.k // int(other))
        return NotImplemented

    def __int__(self) -> int:
        raise BatchMoved("the batch size is not known at import time")

    __index__ = __int__

    @property
    def outer(self) -> int:
        return self.k // self.inner

    def __repr__(self) -> str:
        a, b = self.outer, self.inner
        return f"{f'{a}*' if a > 1 else ''}N{f'*{b}' if b > 1 else ''}"


BATCH = Batch(1)  # the batch dimension in a Val's ONNX shape


def is_batch(d: Any) -> bool:
    return isinstance(d, Batch)


def batch_axis(shape: tuple[Any, ...]) -> int | None:
    """The one axis of ``shape`` that holds the batch (None: it has none)."""
    axes = [k for k, d in enumerate(shape) if isinstance(d, Batch)]
    return axes[0] if len(axes) == 1 else None


def per_item(shape: tuple[Any, ...]) -> int:
    """Elements of a tensor of ``shape`` per batch item."""
    out = 1
    for d in shape:
        out *= d.k if isinstance(d, Batch) else int(d)
    return out


@dataclass
class INode:
    op: str
    inputs: list[str]  # "" for an optional input left out
    outputs: list[str]
    attrs: dict[str, Any]
    name: str
    index: int  # position in the ONNX file (keeps the emitted order close to it)
    fused: dict[str, Any] = field(default_factory=dict)  # act, alpha, beta, residual, ...

    @property
    def label(self) -> str:
        """The node's name; a node without one (ONNX makes names optional) by the tensor it
        produces, which the exporter's graph and Netron show: ``node producing 'y'``."""
        if self.name:
            return self.name
        out = next((o for o in self.outputs if o), None)
        return f"node producing {out!r}" if out else f"node #{self.index} of the file"

    def describe(self) -> str:
        return f"{self.label} ({self.op})"


@dataclass
class Val:
    """An ONNX tensor in Ferry's graph.

    ``shape`` is the ONNX shape, one dimension of it a ``Batch`` (``BATCH`` first for most
    tensors). ``nhwc``: a 4-D NCHW tensor stored as NHWC (Ferry's conv layout). Otherwise
    the bytes are the ONNX tensor's, row-major. ``phys`` is the shape of the Ferry tensor
    after its first dimension. Without a ``Batch`` in it the first dimension holds the
    batch, possibly times more (a [N*H*W, C] GEMM operand has phys (C,)); with one, the
    first dimension is a fixed size and the batch is where the ``Batch`` is.
    """

    tensor: str
    shape: tuple[Any, ...]
    nhwc: bool
    phys: tuple[Any, ...]

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def item(self) -> tuple[int, ...]:
        """The ONNX shape without the batch (``BatchMoved`` where the batch is not first)."""
        if self.shape[0] != BATCH:
            raise BatchMoved(f"the batch is not the first dimension of {self.shape}")
        return tuple(int(d) for d in self.shape[1:])

    @property
    def batch_first(self) -> bool:
        return self.shape[0] == BATCH

    def nhwc_item(self) -> tuple[int, ...]:
        c, h, w = self.item
        return (h, w, c)


F = TypeVar("F", bound=Callable[..., Any])


def registrar(table: dict[str, Any]) -> Callable[..., Callable[[F], F]]:
    """A decorator factory filing a function in ``table`` under each op it names:
    ``handles = registrar(HANDLERS)``, then ``@handles("Add", "Sub")``."""

    def register(*ops: str) -> Callable[[F], F]:
        def deco(fn: F) -> F:
            for op in ops:
                table[op] = fn
            return fn

        return deco

    return register


def refuse(where: INode | None, reason: str, **fields: Any) -> ModelRefused:
    """The load-time error for what the importer cannot run, naming the node and the op."""
    if where is not None:
        fields = {"node": where.label, "op": where.op, **fields}
    return ModelRefused(reason, **fields)
