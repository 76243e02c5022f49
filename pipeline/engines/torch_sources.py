"""Where the ``torch`` engine's module comes from (``ModelConfig.source``): a torchvision
architecture name (``weights``: its state dict, else seeded random weights), a TorchScript file
(``.pt``, ``.ts``, ``.jit``), a ``torch.export`` archive (``.pt2``), or
``package.module:function`` returning a module; and what an archive declares of its input.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from ..errors import InvalidInput
from ..models.weights import load_weights

logger = logging.getLogger(__name__)
SCRIPT_SUFFIXES = (".pt", ".ts", ".jit")


def _torch() -> Any:
    try:
        import torch  # optional: torch
    except ModuleNotFoundError:
        raise InvalidInput(
            "the torch engine needs torch, which is not installed",
            hint="pip install 'ferry[torch]'",
        ) from None
    return torch


def load_module(entry: Any) -> tuple[Any, bool, bool]:
    """(module in eval mode on the CPU, random weights?, scripted?) from the entry's source."""
    torch = _torch()
    src = entry.source
    try:
        if src.endswith(".pt2"):
            ep = torch.export.load(src)
            if isinstance(_first_input(ep).shape[0], int):
                raise InvalidInput(
                    "the exported program has a fixed batch size; export it with a dynamic "
                    "batch dimension (dynamic_shapes={0: torch.export.Dim('batch')})",
                    model=entry.name,
                    source=src,
                    batch=int(_first_input(ep).shape[0]),
                )
            return ep.module(), False, False
        if src.endswith(SCRIPT_SUFFIXES):
            return torch.jit.load(src, map_location="cpu").eval(), False, True
        if ":" in src:
            mod_name, fn = src.split(":")
            m = getattr(importlib.import_module(mod_name), fn)()
            if not isinstance(m, torch.nn.Module):
                raise InvalidInput(
                    "module:function must return a torch.nn.Module",
                    source=src,
                    got=type(m).__name__,
                )
            return m.eval(), False, isinstance(m, torch.jit.ScriptModule)
        return _torchvision(entry)
    except InvalidInput:
        raise
    except Exception as exc:
        raise InvalidInput(
            "the torch engine cannot load the model",
            model=entry.name,
            source=src,
            detail=f"{type(exc).__name__}: {str(exc)[:300]}",
        ) from None


def _torchvision(entry: Any) -> tuple[Any, bool, bool]:
    torch = _torch()
    try:
        import torchvision  # optional: torchvision
    except ModuleNotFoundError:
        raise InvalidInput(
            "a torchvision architecture name needs torchvision",
            source=entry.source,
            hint="pip install 'ferry[torchvision]'",
        ) from None
    names = torchvision.models.list_models(module=torchvision.models)
    if entry.source not in names:
        raise InvalidInput("unknown torchvision architecture", source=entry.source)
    torch.manual_seed(entry.seed)
    m = torchvision.models.get_model(entry.source, weights=None)
    if entry.weights is None:
        logger.warning(
            "model %s (%s): no weights given, using seeded RANDOM weights; answers are "
            "not meaningful",
            entry.name,
            entry.source,
        )
        return m.eval(), True, False
    if entry.weights.endswith((".npz", ".safetensors")):
        sd = {k: torch.from_numpy(v) for k, v in load_weights(entry.weights).items()}
    else:
        sd = torch.load(entry.weights, map_location="cpu", weights_only=True)  # no pickle code
    m.load_state_dict(sd, strict=True)
    return m.eval(), False, False


def declared_input(entry: Any) -> dict[str, Any]:
    """What a ``torch.export`` archive declares of its input: size, channels, layout, dtype."""
    if not entry.source.endswith(".pt2"):
        return {}
    torch = _torch()
    val = _first_input(torch.export.load(entry.source))
    shape = [int(d) if isinstance(d, int) else -1 for d in val.shape]
    out: dict[str, Any] = {"dtype": str(val.dtype).removeprefix("torch.")}
    if len(shape) == 4:
        nchw = shape[1] in (1, 3)
        c, h, w = shape[1:] if nchw else (shape[3], shape[1], shape[2])
        if min(c, h, w) > 0:
            out.update(channels=c, height=h, width=w, layout="nchw" if nchw else "nhwc")
    return out


def _first_input(ep: Any) -> Any:
    """The fake tensor of an exported program's first user input (its shape and dtype)."""
    name = ep.graph_signature.user_inputs[0]
    return next(n for n in ep.graph.nodes if n.name == name).meta["val"]


# -- what the engine does to a loaded module


def to_channels_last(m: Any) -> None:
    """The module's 4-D weights in channels-last, in place. ``Module.to(memory_format=...)``
    also tries a 5-D buffer and fails on it (a Swin's window mask, lowered from ONNX)."""
    torch = _torch()
    with torch.no_grad():
        for _name, t in module_state(m):
            if t.dim() == 4:
                t.data = t.data.contiguous(memory_format=torch.channels_last)


def module_state(m: Any) -> list[tuple[str, Any]]:
    """The module's parameters and buffers by name: what ``Module.to`` casts."""
    return [*m.named_parameters(), *m.named_buffers()]


def module_bytes(m: Any) -> int:
    n = sum(p.numel() * p.element_size() for p in m.parameters())
    return n + sum(b.numel() * b.element_size() for b in m.buffers())
