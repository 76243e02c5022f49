"""Engines by name. Adding one is a file defining it and one line in ``ENGINES``.

``ENGINES`` maps an engine's name to ``"module:builder"``; the module is imported only when
a model of that engine is loaded (torch and onnx are optional extras), and the builder is
called as ``builder(entry, image)`` with the repository entry (``ModelConfig``) and the
resolved ``ImageInput`` (or ``None``) and returns an ``Engine``. An engine whose module is
not there yet (``onnx`` until its adapter lands, at ``pipeline/engines/onnx.py`` defining
``build``) fails at load time with a message saying so.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..errors import InvalidInput
from .base import Engine, EngineContext, EnginePlan, Feed, ImageInput, TensorInfo

ENGINES: dict[str, str] = {
    "native": "pipeline.models.registry:build_native",
    "torch": "pipeline.engines.torch_engine:build",
    "onnx": "pipeline.engines.onnx:build",  # the onnx importer's adapter (branch onnx)
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
