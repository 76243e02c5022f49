"""The importer's intermediate form: ONNX nodes after folding, before Ferry's graph is built.

``INode`` is one ONNX node (or several fused into one: a conv with its batch norm,
activation and residual add); ``Val`` is what an ONNX tensor became in Ferry's graph (a
tensor name, the ONNX shape, and how the bytes are laid out). ``Batch`` is the batch
dimension inside shape arithmetic that is folded at import time (``Shape`` of an
activation gives ``[Batch(1), C, H, W]``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import ModelRefused

BATCH = "N"  # the batch dimension in a Val's ONNX shape


@dataclass(frozen=True)
class Batch:
    """``k`` times the batch size, inside folded shape arithmetic."""

    k: int = 1

    def __mul__(self, other: Any) -> Batch:
        if isinstance(other, int):
            return Batch(self.k * other)
        return NotImplemented

    __rmul__ = __mul__

    def __floordiv__(self, other: Any) -> Batch:
        if isinstance(other, int) and other and self.k % other == 0:
            return Batch(self.k // other)
        return NotImplemented

    def __int__(self) -> int:  # pragma: no cover - refused before use
        raise TypeError("the batch size is not known at import time")

    def __repr__(self) -> str:
        return "N" if self.k == 1 else f"{self.k}N"


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

    ``shape`` is the ONNX shape with ``BATCH`` first. ``nhwc``: a 4-D NCHW tensor stored as
    NHWC (Ferry's conv layout). Otherwise the bytes are the ONNX tensor's, row-major.
    ``phys`` is the shape of the Ferry tensor after its first dimension (which holds the
    batch, possibly times more: a [N*H*W, C] GEMM operand has phys (C,)).
    """

    tensor: str
    shape: tuple[Any, ...]
    nhwc: bool
    phys: tuple[int, ...]

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def item(self) -> tuple[int, ...]:
        """The ONNX shape without the batch."""
        return tuple(int(d) for d in self.shape[1:])

    def nhwc_item(self) -> tuple[int, ...]:
        c, h, w = self.item
        return (h, w, c)


def refuse(where: INode | None, reason: str, **fields: Any) -> ModelRefused:
    """The load-time error for what the importer cannot run, naming the node and the op."""
    if where is not None:
        fields = {"node": where.label, "op": where.op, **fields}
    return ModelRefused(reason, **fields)
