"""``lower(model)``: an imported ONNX model as a torch module (``onnx_torch``; torch optional).

Every node the importer kept is looked up in the lowerings of ``onnx_torch_nn`` and
``onnx_torch_shape`` before anything is built; a node without one, or with an attribute
they do not take, raises ``NotLowered`` naming it.
"""

from __future__ import annotations

from typing import Any

from . import onnx_torch_nn, onnx_torch_shape  # noqa: F401 - they register the lowerings
from .onnx_torch import LOWER, NotLowered, lowered_class


def lower(model: Any) -> Any:
    """``model`` (an ``OnnxModel``) as a ``torch.nn.Module`` returning its outputs as a tuple,
    on the CPU in float32; the torch engine moves, casts and compiles it."""
    for n in model.folded:
        if n.op not in LOWER:
            raise NotLowered(n, "no torch lowering for this op")
    return lowered_class()(model).eval()


__all__ = ["NotLowered", "lower"]
