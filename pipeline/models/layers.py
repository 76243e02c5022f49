"""Helpers the model builders share: batch-norm folding and conv nodes with their constants."""

from __future__ import annotations

import numpy as np

from ..graph import Graph
from ..ops import CONV2D, weights_to_matrix

BN_EPS = 1e-5


def fold_bn(
    w_oihw: np.ndarray,
    conv_bias: np.ndarray | None,
    gamma: np.ndarray,
    beta: np.ndarray,
    mean: np.ndarray,
    var: np.ndarray,
    eps: float = BN_EPS,
) -> tuple[np.ndarray, np.ndarray]:
    """Fold an eval-mode batch norm into the conv before it: w' = w * s, b' = (b - mean) * s + beta."""
    scale = gamma.astype(np.float64) / np.sqrt(var.astype(np.float64) + eps)
    w = w_oihw.astype(np.float64) * scale[:, None, None, None]
    b0 = np.zeros(w_oihw.shape[0]) if conv_bias is None else conv_bias.astype(np.float64)
    b = (b0 - mean) * scale + beta
    return w.astype(np.float32), b.astype(np.float32)


def conv(
    g: Graph,
    x: str,
    name: str,
    w_oihw: np.ndarray,
    bias: np.ndarray,
    stride: int = 1,
    padding: int = 0,
    act: str = "relu",
    residual: str | None = None,
) -> str:
    """Add a conv2d node (weights as a [Kp, Cout] matrix constant, bias float32)."""
    kh, kw = w_oihw.shape[2:]
    wname = g.const(f"{name}.w", weights_to_matrix(w_oihw))
    bname = g.const(f"{name}.b", np.asarray(bias, dtype=np.float32), cast=False)
    inputs = [x, wname, bname] + ([residual] if residual else [])
    return g.add(CONV2D, inputs, name, kernel=(kh, kw), stride=stride, padding=padding, act=act)
