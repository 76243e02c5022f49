"""An imported ONNX graph lowered to a ``torch.nn.Module`` (the onnx engine's torch backend).

    module = lower(model)        # model: load_onnx(...); NotLowered names a node it cannot
    y, = module(x)               # x: the file's input, NCHW, float16 or float32

The nodes are the importer's after folding and before Ferry's fusions (``OnnxModel.folded``):
plain ONNX semantics, every constant and every shape computed at import time, the batch a
``Batch(k)`` in folded shapes (``k`` times the input's batch, resolved at each call). The
module keeps the file's weights as buffers and runs the nodes in order; ``torch.compile``
traces that loop into one graph per bucket and fuses as it does a torch model's, so the torch
engine serves it exactly as it serves a module of its own (fp16, channels-last, CUDA graphs).
Only what the importer accepted reaches here; an op or attribute this file does not lower is
``NotLowered``, and the engine keeps Ferry's native graph for that model.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from .onnx_iota import iota_of
from .onnx_ir import Batch, INode, registrar

Lowering = Callable[["Call", INode, list[Any]], Any]
LOWER: dict[str, Lowering] = {}
# what a lowering needs from numpy or onnx, computed once at load from the model and the
# node (``Call.prepared``): ``forward`` runs plain Python on torch, which torch.compile
# traces into one graph (an onnx helper in it breaks the graph, a numpy array fails it)
Preparing = Callable[[Any, INode], Any]
PREPARE: dict[str, Preparing] = {}


class NotLowered(Exception):
    """A node this module cannot express in torch (the engine keeps the native graph)."""

    def __init__(self, node: INode | None, why: str) -> None:
        super().__init__(f"{node.describe()}: {why}" if node is not None else why)
        self.node = node


lowers = registrar(LOWER)  # @lowers("Relu", "Tanh"): the lowering of those ops
prepares = registrar(PREPARE)  # @prepares("Cast"): its load-time part (checks included)


def torch_() -> Any:
    import torch  # optional: torch

    return torch


@functools.cache
def lowered_class() -> type:
    """``Lowered`` on ``torch.nn.Module`` (made on first use: torch is optional)."""
    return type("Lowered", (Lowered, torch_().nn.Module), {})


class Lowered:
    """The module's own methods; ``lowered_class`` puts them on ``torch.nn.Module``."""

    _buffers_of: dict[str, str]

    def __init__(self, model: Any) -> None:
        torch = torch_()
        torch.nn.Module.__init__(self)  # type: ignore[arg-type]
        self.opset = int(model.opset)
        self.input_name = model.inputs[0].name
        self.nodes = list(model.folded)
        self.results = list(model.results)
        self._buffers_of: dict[str, str] = {}
        # folded inputs as plain Python (what torch.compile traces best): integers as
        # (a, b) for a + b * batch, small float ones as floats; gathers at the batch index
        self.ints: dict[str, tuple[tuple[int, int], ...]] = {}
        self.floats: dict[str, tuple[float, ...]] = {}
        self.iotas: dict[str, Any] = {}
        self.scalars = {k for k, a in model.consts.items() if a.ndim == 0}
        reads = {i for n in self.nodes for i in n.inputs if i}
        for name in sorted(reads & set(model.consts)):
            arr = model.consts[name]
            iota = iota_of(arr)
            if iota is not None:
                self.iotas[name] = iota
                continue
            flat = arr.reshape(-1)
            if arr.dtype == object or np.issubdtype(arr.dtype, np.integer):
                self.ints[name] = tuple(
                    (0, d.k) if isinstance(d, Batch) else (int(d), 0) for d in flat
                )
            elif np.issubdtype(arr.dtype, np.floating) and arr.size <= 64:
                self.floats[name] = tuple(float(v) for v in flat)
            if arr.dtype == object:
                continue  # symbolic: resolved against the batch at each call
            attr = f"c{len(self._buffers_of)}"
            self.register_buffer(attr, torch.from_numpy(np.array(arr, copy=True)))
            self._buffers_of[name] = attr
        self.prepared: dict[str, Any] = {}
        for n in self.nodes:  # attributes it cannot take are found now, not at a request
            prepare = PREPARE.get(n.op)
            if prepare is not None:
                self.prepared[n.outputs[0]] = prepare(model, n)

    def tensor(self, env: dict[str, Any], name: str) -> Any:
        if name in env:
            return env[name]
        attr = self._buffers_of.get(name)
        return None if attr is None else getattr(self, attr)

    def forward(self, x: Any) -> tuple[Any, ...]:
        env: dict[str, Any] = {self.input_name: x}
        call = Call(self, x)
        for node in self.nodes:
            ins = [self.tensor(env, i) if i else None for i in node.inputs]
            out = LOWER[node.op](call, node, ins)
            if not isinstance(out, tuple):
                out = (out,)
            for name, t in zip(node.outputs, out, strict=False):
                if name:
                    env[name] = t
        return tuple(env[r] for r in self.results)


class Call:
    """What a lowering reads besides its tensors: the module (its folded constants), the
    opset, and this call's batch, compute dtype and device."""

    def __init__(self, module: Any, x: Any) -> None:
        self.module, self.opset = module, module.opset
        self.n, self.cdtype, self.device = int(x.shape[0]), x.dtype, x.device

    def ints(self, name: str) -> list[int]:
        """A folded integer input, each ``Batch(k)`` as ``k`` times this call's batch."""
        return [a + b * self.n for a, b in self.module.ints[name]]

    def floats(self, name: str) -> tuple[float, ...]:
        return self.module.floats[name]

    def prepared(self, node: INode) -> Any:
        """What ``PREPARE`` computed for ``node`` at load."""
        return self.module.prepared[node.outputs[0]]

    def has(self, node: INode, k: int) -> bool:
        return len(node.inputs) > k and bool(node.inputs[k])


def pads_2d(n: INode, rank: int) -> tuple[list[int], bool]:
    """ONNX ``pads`` (begins then ends) of the spatial axes: (begins, symmetric)."""
    if n.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        raise NotLowered(n, f"auto_pad {n.attrs['auto_pad']}")
    k = rank - 2
    pads = [int(p) for p in n.attrs.get("pads", [0] * (2 * k))]
    if n.attrs.get("auto_pad") == "VALID":
        pads = [0] * (2 * k)
    return pads, pads[:k] == pads[k:]


@prepares("Conv", "MaxPool", "AveragePool")
def _check_spatial(model: Any, n: INode) -> None:
    """Nothing to prepare: refuses at load the pads the lowering cannot take."""
    k = len(n.attrs.get("kernel_shape", [])) or 2
    pads, sym = pads_2d(n, k + 2)
    if n.op == "AveragePool" and not sym and not int(n.attrs.get("count_include_pad", 0)):
        raise NotLowered(n, "AveragePool with uneven pads that excludes them from the count")


def torch_pad(pads: list[int]) -> list[int]:
    """ONNX begins-then-ends pads as ``F.pad``'s pairs, last axis first."""
    k = len(pads) // 2
    out: list[int] = []
    for a in reversed(range(k)):
        out += [pads[a], pads[a + k]]
    return out
