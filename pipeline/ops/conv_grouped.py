"""conv2d in NHWC with groups, dilation and asymmetric padding (what ``conv2d`` does not do).

Inputs: ``x`` [N, H, W, C], weights ``w``, ``bias`` float32 [Cout], optional ``residual``
[N, OH, OW, Cout]; the epilogue is act(conv + bias + residual) with any activation of
``activation.py``. Attributes: ``kernel`` (kh, kw), ``stride``, ``dilation``, ``pads``
(top, left, bottom, right), ``groups``, ``act`` / ``alpha`` / ``beta``, ``target``,
``max_workspace_bytes``.

Two forms, chosen at plan time:
- depthwise (groups == C == Cout): ``w`` is [KH*KW, C]; on the GPU one direct kernel with
  the epilogue fused (neighbouring threads read neighbouring channels); on the CPU one
  multiply-add per tap.
- grouped: ``w`` is [G, KH*KW*Cg, Cog] (rows in (kh, kw, c) order); an im2col kernel writes
  [rows, G, KH*KW*Cg] columns, then one GEMM per group through strided cuBLAS calls, then
  the epilogue. Rows are done in chunks that fit ``max_workspace_bytes``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..errors import InvalidInput
from . import _cuda
from ._conv_common import (
    DEFAULT_MAX_WORKSPACE,
    check_inputs,
    check_residual,
    cuda_rows,
    pair,
)
from ._conv_grouped_host import conv_grouped_host
from .activation import ACT_DEVICE, ACTIVATIONS, check_act, run_epilogue
from .base import Op, OpPlan, TensorSpec, align, workspace_view

SOURCE = (
    ACT_DEVICE
    + r"""
extern "C" __global__ void dwconv_nhwc(const T* __restrict__ x, const T* __restrict__ w,
    const float* __restrict__ bias, const T* __restrict__ res, T* __restrict__ y,
    long long total, int H, int W, int C, int KH, int KW, int SH, int SW, int PT, int PL,
    int DH, int DW, int OH, int OW, int has_res, int act, float a, float b) {
  FERRY_FOR(i, total) {
    const NhwcIdx q = nhwc_index(i, OH, OW, C);
    const int c = q.c, ow = q.ow, oh = q.oh;
    const long long n = q.n;
    float acc = 0.f;
    for (int kh = 0; kh < KH; ++kh) {
      int ih = oh * SH - PT + kh * DH;
      if (ih < 0 || ih >= H) continue;
      for (int kw = 0; kw < KW; ++kw) {
        int iw = ow * SW - PL + kw * DW;
        if (iw < 0 || iw >= W) continue;
        acc += tof(x[((n * H + ih) * W + iw) * (long long)C + c]) * tof(w[(kh * KW + kw) * C + c]);
      }
    }
    acc += bias[c];
    if (has_res) acc += tof(res[i]);
    y[i] = fromf(ferry_act(acc, act, a, b));
  }
}

// cols[r, g, kh, kw, cg] for output rows row0 .. row0 + rows
extern "C" __global__ void im2col_grouped(const T* __restrict__ x, T* __restrict__ cols,
    long long row0, long long rows, int H, int W, int C, int KH, int KW, int SH, int SW,
    int PT, int PL, int DH, int DW, int OH, int OW, int G) {
  const int Cg = C / G;
  const long long K = (long long)KH * KW * C;
  const long long total = rows * K;
  FERRY_FOR(i, total) {
    long long r = i / K;
    int k = (int)(i % K);
    int cg = k % Cg;
    int t = k / Cg;
    int kw = t % KW; t /= KW;
    int kh = t % KH;
    int g = t / KH;
    long long gr = r + row0;
    int ow = (int)(gr % OW);
    long long t2 = gr / OW;
    int oh = (int)(t2 % OH);
    long long n = t2 / OH;
    int ih = oh * SH - PT + kh * DH;
    int iw = ow * SW - PL + kw * DW;
    T v = fromf(0.f);
    if (ih >= 0 && ih < H && iw >= 0 && iw < W) v = x[((n * H + ih) * W + iw) * (long long)C + g * Cg + cg];
    cols[i] = v;
  }
}
"""
)


def grouped_weights(w_oihw: np.ndarray, groups: int) -> np.ndarray:
    """PyTorch/ONNX [Cout, Cin/G, KH, KW] -> this op's weights (see the module docstring)."""
    cout, cg, kh, kw = w_oihw.shape
    if groups == cout and cg == 1:  # depthwise
        return np.ascontiguousarray(w_oihw.reshape(cout, kh * kw).T)
    cog = cout // groups
    w = w_oihw.reshape(groups, cog, cg, kh, kw).transpose(0, 3, 4, 2, 1)  # g, kh, kw, c, o
    return np.ascontiguousarray(w.reshape(groups, kh * kw * cg, cog))


@dataclass(frozen=True)
class Geo:
    n: int
    h: int
    w: int
    c: int
    kh: int
    kw: int
    sh: int
    sw: int
    dh: int
    dw: int
    pt: int
    pl: int
    pb: int
    pr: int
    oh: int
    ow: int
    cout: int
    groups: int
    depthwise: bool
    rows_per_chunk: int
    pad_bytes: int  # host: the zero-padded input copy
    cols_bytes: int

    @property
    def m(self) -> int:
        return self.n * self.oh * self.ow


class Conv2dGrouped(Op):
    name = "conv2d_grouped"
    n_inputs = (3, 4)
    planning_attrs = ("target", "max_workspace_bytes")

    def _plan(self, specs: tuple[TensorSpec, ...], attrs: dict[str, Any]) -> OpPlan:
        x, w, b = check_inputs(self.name, specs)
        kh, kw, sh, sw, dh, dw, (pt, pl, pb, pr), groups = self._window(attrs)
        act, _a, _b = check_act(self.name, attrs)
        target = attrs.get("target", "cuda")
        n, h, wd, c = x.shape
        cout = b.shape[0] if len(b.shape) == 1 else -1
        if c % groups or cout < 1 or cout % groups:
            raise InvalidInput(
                f"{self.name}: channels must divide by groups", c=c, cout=cout, groups=groups
            )
        oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
        ow = (wd + pl + pr - dw * (kw - 1) - 1) // sw + 1
        if oh < 1 or ow < 1:
            raise InvalidInput(f"{self.name}: the kernel does not fit", input_hw=(h, wd))
        cg, cog = c // groups, cout // groups
        depthwise = groups == c == cout
        want = (kh * kw, c) if depthwise else (groups, kh * kw * cg, cog)
        if w.shape != want:
            raise InvalidInput(
                f"{self.name}: weights have the wrong shape", w=w.shape, expected=want
            )
        out = TensorSpec((n, oh, ow, cout), x.dtype)
        check_residual(self.name, specs, out)
        geo = Geo(
            *(n, h, wd, c, kh, kw, sh, sw, dh, dw, pt, pl, pb, pr, oh, ow, cout, groups),
            *(depthwise, 0, 0, 0),
        )
        rows, pad_bytes, cols_bytes = self._workspace(geo, x.np_dtype.itemsize, target, attrs)
        geo = replace(geo, rows_per_chunk=rows, pad_bytes=pad_bytes, cols_bytes=cols_bytes)
        return OpPlan(
            self.name,
            specs,
            (out,),
            pad_bytes + cols_bytes,
            flops=2 * geo.m * cout * kh * kw * cg,
            bytes_moved=x.nbytes + w.nbytes + out.nbytes * (3 if len(specs) == 4 else 2),
            attrs=tuple(sorted({**attrs, "act": act}.items())),
            detail=geo,
        )

    def _window(self, attrs: dict[str, Any]) -> tuple:
        """The window's attributes checked: (kh, kw, sh, sw, dh, dw, pads, groups)."""
        kh, kw = pair(self.name, attrs.get("kernel", 1), "kernel")
        sh, sw = pair(self.name, attrs.get("stride", 1), "stride")
        dh, dw = pair(self.name, attrs.get("dilation", 1), "dilation")
        pads = tuple(int(p) for p in attrs.get("pads", (0, 0, 0, 0)))
        groups = int(attrs.get("groups", 1))
        if len(pads) != 4 or min(pads) < 0 or min(kh, kw, sh, sw, dh, dw, groups) < 1:
            raise InvalidInput(
                f"{self.name}: bad geometry",
                kernel=(kh, kw),
                stride=(sh, sw),
                dilation=(dh, dw),
                pads=pads,
                groups=groups,
            )
        return kh, kw, sh, sw, dh, dw, pads, groups

    @staticmethod
    def _workspace(g: Geo, item: int, target: str, attrs: dict[str, Any]) -> tuple[int, int, int]:
        """(rows per chunk, bytes of the padded input copy, bytes of the columns) of a
        geometry whose own three are not set yet."""
        max_ws = int(attrs.get("max_workspace_bytes", DEFAULT_MAX_WORKSPACE))
        ktot, cg, cog = g.kh * g.kw * g.c, g.c // g.groups, g.cout // g.groups
        if target == "cuda":
            if g.depthwise:
                return g.m, 0, 0
            rows = cuda_rows(g.m, ktot, item, max_ws)
            return rows, 0, rows * ktot * item
        pad_bytes = 0
        if g.pt or g.pl or g.pb or g.pr:
            padded = g.n * (g.h + g.pt + g.pb) * (g.w + g.pl + g.pr) * g.c
            pad_bytes = align(padded * item)
        if g.depthwise:
            return g.m, pad_bytes, g.m * g.cout * item  # the output's bytes
        per_img = g.oh * g.ow * (g.kh * g.kw * cg + cog) * item
        rows = max(1, min(g.n, max_ws // per_img)) * g.oh * g.ow
        return rows, pad_bytes, rows * (g.kh * g.kw * cg + cog) * item

    # -- CPU
    def _run_host(
        self, plan: OpPlan, inputs: Sequence[Any], outputs: Sequence[Any], workspace: Any
    ) -> None:
        res = inputs[3] if len(inputs) == 4 else None
        conv_grouped_host(plan.detail, inputs[0], inputs[1], outputs[0], workspace)
        run_epilogue(plan, outputs[0], inputs[2], res, cuda=False)

    # -- CUDA
    def _run_cuda(
        self,
        plan: OpPlan,
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        workspace: Any,
        stream: Any,
    ) -> None:
        g: Geo = plan.detail
        x, w, b = inputs[0], inputs[1], inputs[2]
        res = inputs[3] if len(inputs) == 4 else None
        out = outputs[0]
        if g.depthwise:
            _depthwise_cuda(plan, g, x, w, b, res, out)
            return
        _grouped_cuda(g, x, w, out, workspace, stream)
        run_epilogue(plan, out, b, res, cuda=True)


def _geometry(g: Geo) -> tuple[np.int32, ...]:
    """The kernels' shared geometry arguments: input, kernel, stride, padding, dilation, output."""
    return tuple(
        np.int32(v)
        for v in (g.h, g.w, g.c, g.kh, g.kw, g.sh, g.sw, g.pt, g.pl, g.dh, g.dw, g.oh, g.ow)
    )


def _depthwise_cuda(plan: OpPlan, g: Geo, x: Any, w: Any, b: Any, res: Any, out: Any) -> None:
    """One thread an output element, bias, residual and activation fused in."""
    act, a, bb = plan.attr("act"), plan.attr("alpha", 0.0), plan.attr("beta", 0.0)
    kern = _cuda.kernel(SOURCE, "dwconv_nhwc", x.dtype)
    total = int(out.size)
    tail = (np.int32(res is not None), np.int32(ACTIVATIONS[act]), np.float32(a), np.float32(bb))
    args = (x, w, b, res if res is not None else out, out, np.int64(total), *_geometry(g), *tail)
    _cuda.launch(kern, total, args)


def _grouped_cuda(g: Geo, x: Any, w: Any, out: Any, workspace: Any, stream: Any) -> None:
    """im2col of a chunk of output rows into the workspace, then one GEMM a group over it."""
    dt = x.dtype
    item = dt.itemsize
    ktot = g.kh * g.kw * g.c
    cg, cog = g.c // g.groups, g.cout // g.groups
    kg = g.kh * g.kw * cg
    cols = workspace_view(workspace, 0, (g.rows_per_chunk, ktot), dt)
    kern = _cuda.kernel(SOURCE, "im2col_grouped", dt)
    geo = (*_geometry(g), np.int32(g.groups))
    cols_ptr, w_ptr, out_ptr = _cuda.ptr(cols), _cuda.ptr(w), _cuda.ptr(out)
    for row0 in range(0, g.m, g.rows_per_chunk):
        rows = min(g.rows_per_chunk, g.m - row0)
        _cuda.launch(kern, rows * ktot, (x, cols, np.int64(row0), np.int64(rows), *geo))
        for gi in range(g.groups):
            _cuda.gemm_rowmajor(
                stream,
                cols_ptr + gi * kg * item,
                w_ptr + gi * kg * cog * item,
                out_ptr + (row0 * g.cout + gi * cog) * item,
                rows,
                cog,
                kg,
                dt,
                lda=ktot,
                ldb=cog,
                ldc=g.cout,
            )


CONV2D_GROUPED = Conv2dGrouped()
