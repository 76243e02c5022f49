"""``lower(model)``: an imported ONNX model as a torch module (``onnx_torch``; torch optional).

Every node the importer kept is looked up in the lowerings of ``onnx_torch_nn`` and
``onnx_torch_shape`` before anything is built, and one item of zeros is run through the
module on the CPU: a node without a lowering, or with an attribute or shape it does not
take, raises ``NotLowered`` naming it (the engine then keeps the native graph).
"""

from __future__ import annotations

from typing import Any

from . import onnx_torch_nn, onnx_torch_shape  # noqa: F401 - they register the lowerings
from .onnx_torch import LOWER, NotLowered, lowered_class, torch_


def lower(model: Any) -> Any:
    """``model`` (an ``OnnxModel``) as a ``torch.nn.Module`` returning its outputs as a tuple,
    on the CPU in float32; the torch engine moves, casts and compiles it."""
    for n in model.folded:
        if n.op not in LOWER:
            raise NotLowered(n, "no torch lowering for this op")
    module = lowered_class()(model).eval()
    torch = torch_()
    x = torch.zeros((1, *model.inputs[0].shape[1:]))
    try:  # one item through it now: what it cannot take is found at load, not at a request
        with torch.no_grad():
            module(x)
    except NotLowered:
        raise
    except Exception as exc:
        raise NotLowered(
            None, f"the lowered graph does not run: {type(exc).__name__}: {exc}"
        ) from exc
    return module


__all__ = ["NotLowered", "lower"]
