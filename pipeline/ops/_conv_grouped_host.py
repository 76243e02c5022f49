"""The CPU side of ``conv2d_grouped`` (numpy): a zero-padded copy of the input in the
workspace, then one multiply-add per tap (depthwise) or im2col and one matmul per group."""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import workspace_view


def conv_grouped_host(
    g: Any, x: np.ndarray, w: np.ndarray, out: np.ndarray, workspace: Any
) -> None:
    """out = conv(x, w) for the geometry ``g`` (``conv_grouped.Geo``); no bias, no act."""
    dt = x.dtype
    if g.pad_bytes:
        xp = workspace_view(workspace, 0, (g.n, g.h + g.pt + g.pb, g.w + g.pl + g.pr, g.c), dt)
        xp.fill(0)
        xp[:, g.pt : g.pt + g.h, g.pl : g.pl + g.w, :] = x
    else:
        xp = x
    if g.depthwise:
        _depthwise(g, xp, w, out, workspace_view(workspace, g.pad_bytes, out.shape, dt))
    else:
        _grouped(g, xp, w, out, workspace)


def _depthwise(g: Any, xp: np.ndarray, w: np.ndarray, out: np.ndarray, tmp: np.ndarray) -> None:
    first = True
    for i in range(g.kh):
        for j in range(g.kw):
            src = xp[
                :,
                i * g.dh : i * g.dh + (g.oh - 1) * g.sh + 1 : g.sh,
                j * g.dw : j * g.dw + (g.ow - 1) * g.sw + 1 : g.sw,
                :,
            ]
            if first:
                np.multiply(src, w[i * g.kw + j], out=out)
                first = False
            else:
                np.multiply(src, w[i * g.kw + j], out=tmp)
                np.add(out, tmp, out=out)


def _grouped(g: Any, xp: np.ndarray, w: np.ndarray, out: np.ndarray, workspace: Any) -> None:
    dt = xp.dtype
    cg, cog = g.c // g.groups, g.cout // g.groups
    kg = g.kh * g.kw * cg
    sn, sh_, sw_, sc = xp.strides
    rows = g.rows_per_chunk
    imgs = rows // (g.oh * g.ow)
    cols = workspace_view(workspace, g.pad_bytes, (rows, kg), dt)
    tmp = workspace_view(workspace, g.pad_bytes + rows * kg * dt.itemsize, (rows, cog), dt)
    out2 = out.reshape(g.m, g.cout)
    for n0 in range(0, g.n, imgs):
        n1 = min(g.n, n0 + imgs)
        r = (n1 - n0) * g.oh * g.ow
        r0 = n0 * g.oh * g.ow
        for gi in range(g.groups):
            src = np.lib.stride_tricks.as_strided(
                xp[n0:n1, :, :, gi * cg :],
                shape=(n1 - n0, g.oh, g.ow, g.kh, g.kw, cg),
                strides=(sn, g.sh * sh_, g.sw * sw_, g.dh * sh_, g.dw * sw_, sc),
                writeable=False,
            )
            np.copyto(cols[:r].reshape(n1 - n0, g.oh, g.ow, g.kh, g.kw, cg), src)
            if g.groups == 1:
                np.matmul(cols[:r], w[0], out=out2[r0 : r0 + r])
            else:
                np.matmul(cols[:r], w[gi], out=tmp[:r])
                out2[r0 : r0 + r, gi * cog : (gi + 1) * cog] = tmp[:r]
