"""Straightforward reference implementations the tests compare Ferry's ops against.

Written for clarity, not speed: plain loops over output positions, float64 throughout,
no code shared with ``pipeline.ops``.
"""

from __future__ import annotations

import numpy as np


def conv2d_direct(
    x: np.ndarray, w_oihw: np.ndarray, bias: np.ndarray | None, stride: int, pad: int
) -> np.ndarray:
    """x [N, H, W, C], w [Cout, Cin, KH, KW] -> [N, OH, OW, Cout], by loops."""
    n, h, wd, c = x.shape
    cout, cin, kh, kw = w_oihw.shape
    assert cin == c
    oh = (h + 2 * pad - kh) // stride + 1
    ow = (wd + 2 * pad - kw) // stride + 1
    out = np.zeros((n, oh, ow, cout), dtype=np.float64)
    x64 = x.astype(np.float64)
    w64 = w_oihw.astype(np.float64)
    for b in range(n):
        for i in range(oh):
            for j in range(ow):
                acc = np.zeros(cout)
                for di in range(kh):
                    for dj in range(kw):
                        ii, jj = i * stride - pad + di, j * stride - pad + dj
                        if 0 <= ii < h and 0 <= jj < wd:
                            acc += w64[:, :, di, dj] @ x64[b, ii, jj, :]
                out[b, i, j] = acc
    if bias is not None:
        out += bias
    return out


def maxpool_direct(x: np.ndarray, k: int, stride: int, pad: int) -> np.ndarray:
    n, h, w, c = x.shape
    oh = (h + 2 * pad - k) // stride + 1
    ow = (w + 2 * pad - k) // stride + 1
    out = np.full((n, oh, ow, c), -np.inf)
    for i in range(oh):
        for j in range(ow):
            for di in range(k):
                for dj in range(k):
                    ii, jj = i * stride - pad + di, j * stride - pad + dj
                    if 0 <= ii < h and 0 <= jj < w:
                        out[:, i, j] = np.maximum(out[:, i, j], x[:, ii, jj])
    return out


def softmax_ref(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def batchnorm_ref(x: np.ndarray, gamma, beta, mean, var, eps=1e-5) -> np.ndarray:
    return (x - mean) / np.sqrt(var + eps) * gamma + beta
