"""Model importers: files of other frameworks into Ferry's native graph of two-phase ops.

``onnx_graph.load_onnx`` reads an ONNX file (the ``onnx`` package, an optional extra).
"""

from __future__ import annotations

from typing import Any


def load_onnx(path: str, name: str | None = None) -> Any:
    """``onnx_graph.load_onnx``, imported when first used (``onnx`` is optional)."""
    from .onnx_graph import load_onnx as _load

    return _load(path, name)
