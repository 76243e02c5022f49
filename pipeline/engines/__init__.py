"""Engines by name. Adding one is a file defining it and one line in ``ENGINES``.

``ENGINES`` maps an engine's name to ``"module:builder"``; the module is imported only when
a model of that engine is loaded (torch and onnx are optional extras), and the builder is
called as ``builder(entry, image)`` with the repository entry (``ModelConfig``) and the
resolved ``ImageInput`` and returns a ``LoadedModel`` whose ``engine`` is an ``Engine``
(``base.py``). A module may also define ``declared_input(entry)``: what the model file
declares of its input (size, channels, layout, dtype), read by the repository to fill in
what the entry leaves out. An engine whose module is missing fails at load time with "the
<name> engine is not available yet"; one whose package is missing names the extra.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..errors import InvalidInput
from .base import Engine, EngineContext, EnginePlan, Feed, ImageInput, TensorInfo

ENGINES: dict[str, str] = {
    "native": "pipeline.models.registry:build_native",
    "torch": "pipeline.engines.torch_engine:build",
    "onnx": "pipeline.engines.onnx:build",
}


def builder(engine: str) -> Any:
    """The builder of ``engine``, or ``InvalidInput`` naming why it cannot be had."""
    ref = ENGINES.get(engine)
    if ref is None:
        raise InvalidInput("unknown engine", engine=engine, known=sorted(ENGINES))
    mod_name, fn = ref.split(":")
    try:
        mod = importlib.import_module(mod_name)
    except ModuleNotFoundError as exc:
        if exc.name == mod_name:
            raise InvalidInput(
                f"the {engine} engine is not available yet", engine=engine, module=mod_name
            ) from None
        raise InvalidInput(
            f"the {engine} engine needs a package that is not installed",
            engine=engine,
            missing=exc.name,
            hint=f"pip install 'ferry[{engine}]'",
        ) from None
    return getattr(mod, fn)


__all__ = [
    "ENGINES",
    "Engine",
    "EngineContext",
    "EnginePlan",
    "Feed",
    "ImageInput",
    "TensorInfo",
    "builder",
]
