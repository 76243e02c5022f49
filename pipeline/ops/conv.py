"""conv2d in NHWC: 1x1 as a GEMM; k x k through an im2col kernel, then a cuBLAS GEMM.

Inputs: ``x`` [N, H, W, C], weights ``w`` [Kp, Cout] (Kp = KH*KW*C rounded up to 8; the
rows are ordered (kh, kw, c) and the padding rows are zero), ``bias`` float32 [Cout], and
an optional ``residual`` [N, OH, OW, Cout]. The epilogue fuses bias, residual and ReLU in
one pass. Attributes: ``kernel`` (kh, kw), ``stride``, ``padding``, ``act`` (relu / none,
or any activation of ``activation.py`` with its ``alpha`` / ``beta``),
``max_workspace_bytes``, and ``target`` ("cuda" or "host", which sizes the workspace).

The im2col kernel handles padding and stride itself and writes straight into the
workspace; it moves 16-byte vectors when C allows (every ResNet-50 layer but the stem) and
gathers 16-byte vectors of columns otherwise (the 3-channel stem, whose columns are padded to Kp). When the
column matrix would pass ``max_workspace_bytes`` the rows are done in chunks, so the stem
at batch 256 needs 256 MB of workspace, not 1 GB.
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
from .activation import check_act, run_epilogue
from .base import Op, OpPlan, TensorSpec, align, check_rank, workspace_view

SOURCE = r"""
extern "C" __global__ void im2col_vec(const T* __restrict__ x, T* __restrict__ cols,
    long long row0, long long rows, int H, int W, int C, int KH, int KW,
    int SH, int SW, int PH, int PW, int OH, int OW) {
  typedef VecT<VEC> V;
  const int CV = C / VEC;
  const long long KV = (long long)KH * KW * CV;
  const long long total = rows * KV;
  const V* xv = reinterpret_cast<const V*>(x);
  V* cv_out = reinterpret_cast<V*>(cols);
  FERRY_FOR(i, total) {
    int cv = (int)(i % CV);
    long long t = i / CV;
    int kw = (int)(t % KW); t /= KW;
    int kh = (int)(t % KH);
    long long r = t / KH;
    long long gr = r + row0;
    int ow = (int)(gr % OW);
    long long t2 = gr / OW;
    int oh = (int)(t2 % OH);
    long long n = t2 / OH;
    int ih = oh * SH - PH + kh;
    int iw = ow * SW - PW + kw;
    V v;
    if (ih >= 0 && ih < H && iw >= 0 && iw < W) {
      v = xv[((n * H + ih) * W + iw) * CV + cv];
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) v.v[j] = fromf(0.f);
    }
    cv_out[i] = v;
  }
}

// any C: each thread gathers VEC consecutive columns of one row and writes them as one
// 16-byte vector (Kp % 8 == 0); columns past K are zero. The (kh, kw, c) position is
// advanced incrementally instead of divided out per element.
extern "C" __global__ void im2col_gather(const T* __restrict__ x, T* __restrict__ cols,
    long long row0, long long rows, int H, int W, int C, int KH, int KW,
    int SH, int SW, int PH, int PW, int OH, int OW, int Kp) {
  typedef VecT<VEC> V;
  const int K = KH * KW * C;
  const int KV = Kp / VEC;
  const long long total = rows * KV;
  FERRY_FOR(i, total) {
    int k0 = (int)(i % KV) * VEC;
    long long gr = i / KV + row0;
    int ow = (int)(gr % OW);
    long long t2 = gr / OW;
    int oh = (int)(t2 % OH);
    long long n = t2 / OH;
    const T* xn = x + n * (long long)H * W * C;
    int c = k0 % C, t = k0 / C;
    int kw = t % KW, kh = t / KW;
    V v;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      T e = fromf(0.f);
      if (k0 + j < K) {
        int ih = oh * SH - PH + kh, iw = ow * SW - PW + kw;
        if (ih >= 0 && ih < H && iw >= 0 && iw < W) e = xn[((long long)ih * W + iw) * C + c];
      }
      v.v[j] = e;
      if (++c == C) { c = 0; if (++kw == KW) { kw = 0; ++kh; } }
    }
    reinterpret_cast<V*>(cols)[i] = v;
  }
}
"""


def padded_k(kh: int, kw: int, c: int) -> int:
    """Rows of a conv weight matrix: KH*KW*C rounded up to 8 (16-byte fp16 rows)."""
    return (kh * kw * c + 7) // 8 * 8


@dataclass(frozen=True)
class ConvGeometry:
    n: int
    h: int
    w: int
    c: int
    kh: int
    kw: int
    sh: int
    sw: int
    ph: int
    pw: int
    oh: int
    ow: int
    cout: int
    k: int
    kp: int
    direct: bool  # 1x1, stride 1, no padding: the input already is the column matrix
    vec: bool  # the 16-byte im2col kernel applies
    rows_per_chunk: int
    pad_bytes: int  # host only: the zero-padded input copy at the start of the workspace

    @property
    def m(self) -> int:
        return self.n * self.oh * self.ow


class Conv2d(Op):
    name = "conv2d"
    n_inputs = (3, 4)
    planning_attrs = ("target", "max_workspace_bytes")

    def _plan(self, specs: tuple[TensorSpec, ...], attrs: dict[str, Any]) -> OpPlan:
        x, w, b = check_inputs(self.name, specs)
        check_rank(self.name, "w", w, 2)
        kh, kw, sh, sw, ph, pw, target = self._window(attrs)
        n, h, wd, c = x.shape
        oh = (h + 2 * ph - kh) // sh + 1
        ow = (wd + 2 * pw - kw) // sw + 1
        if oh < 1 or ow < 1:
            raise InvalidInput(
                "conv2d: the kernel does not fit the padded input",
                input_hw=(h, wd),
                kernel=(kh, kw),
                padding=(ph, pw),
            )
        k = kh * kw * c
        kp = padded_k(kh, kw, c)
        cout = w.shape[1]
        if w.shape != (kp, cout):
            raise InvalidInput(
                "conv2d: weights must be [Kp, Cout] with Kp = KH*KW*C rounded up to 8",
                w=w.shape,
                expected_rows=kp,
                kernel=(kh, kw),
                channels=c,
            )
        if b.shape != (cout,):
            raise InvalidInput("conv2d: bias must be [Cout]", bias=b.shape, cout=cout)
        out = TensorSpec((n, oh, ow, cout), x.dtype)
        check_residual(self.name, specs, out)
        item = x.np_dtype.itemsize
        direct = kh == kw == 1 and sh == sw == 1 and ph == pw == 0 and k == kp
        vec = c % (16 // item) == 0 and k == kp
        geo = ConvGeometry(
            n, h, wd, c, kh, kw, sh, sw, ph, pw, oh, ow, cout, k, kp, direct, vec, 0, 0
        )
        rows, pad_bytes, ws = self._workspace(geo, item, target, attrs)
        geo = replace(geo, rows_per_chunk=rows, pad_bytes=pad_bytes)
        moved = x.nbytes + w.nbytes + out.nbytes * (3 if len(specs) == 4 else 2)
        if not direct:
            moved += 2 * geo.m * kp * item
        return OpPlan(
            self.name,
            specs,
            (out,),
            ws,
            flops=2 * geo.m * cout * k,
            bytes_moved=moved,
            attrs=tuple(sorted(attrs.items())),
            detail=geo,
        )

    def _window(self, attrs: dict[str, Any]) -> tuple[int, int, int, int, int, int, str]:
        """The attributes checked: (kh, kw, sh, sw, ph, pw, target); the activation too."""
        if "kernel" not in attrs:
            raise InvalidInput("conv2d: the 'kernel' attribute (kh, kw) is required")
        kh, kw = pair(self.name, attrs["kernel"], "kernel")
        sh, sw = pair(self.name, attrs.get("stride", 1), "stride")
        ph, pw = pair(self.name, attrs.get("padding", 0), "padding")
        if min(kh, kw, sh, sw) < 1 or min(ph, pw) < 0:
            raise InvalidInput(
                "conv2d: kernel and stride must be >= 1, padding >= 0",
                kernel=(kh, kw),
                stride=(sh, sw),
                padding=(ph, pw),
            )
        check_act(self.name, attrs)  # relu / none, or any activation of activation.py
        target = attrs.get("target", "cuda")
        if target not in ("cuda", "host"):
            raise InvalidInput("conv2d: target must be 'cuda' or 'host'", target=target)
        return kh, kw, sh, sw, ph, pw, target

    @staticmethod
    def _workspace(
        g: ConvGeometry, item: int, target: str, attrs: dict[str, Any]
    ) -> tuple[int, int, int]:
        """(rows per chunk, bytes of the padded input copy, workspace bytes) of a geometry
        whose own two are not set yet."""
        max_ws = int(attrs.get("max_workspace_bytes", DEFAULT_MAX_WORKSPACE))
        if g.direct:
            return g.m, 0, 0
        if target == "cuda":
            rows = cuda_rows(g.m, g.kp, item, max_ws)
            return rows, 0, rows * g.kp * item
        # host: chunks of whole images, plus a zero-padded copy of the input
        per_img = g.oh * g.ow * g.kp * item
        rows = max(1, min(g.n, max_ws // per_img)) * g.oh * g.ow
        pad_bytes = 0
        if g.ph or g.pw:
            pad_bytes = align(g.n * (g.h + 2 * g.ph) * (g.w + 2 * g.pw) * g.c * item)
        return rows, pad_bytes, pad_bytes + rows * g.kp * item

    # -- CPU
    def _run_host(
        self, plan: OpPlan, inputs: Sequence[Any], outputs: Sequence[Any], workspace: Any
    ) -> None:
        g: ConvGeometry = plan.detail
        x, w, b = inputs[0], inputs[1], inputs[2]
        res = inputs[3] if len(inputs) == 4 else None
        out = outputs[0]
        out2 = out.reshape(g.m, g.cout)
        if g.direct:
            np.matmul(x.reshape(g.m, g.k), w, out=out2)
        else:
            dt = x.dtype
            if g.pad_bytes:
                xp = workspace_view(workspace, 0, (g.n, g.h + 2 * g.ph, g.w + 2 * g.pw, g.c), dt)
                xp.fill(0)
                xp[:, g.ph : g.ph + g.h, g.pw : g.pw + g.w, :] = x
            else:
                xp = x
            sn, sh_, sw_, sc = xp.strides
            rows = g.rows_per_chunk
            imgs = rows // (g.oh * g.ow)
            cols = workspace_view(workspace, g.pad_bytes, (rows, g.kp), dt)
            if g.kp > g.k:
                cols[:, g.k :] = 0
            for n0 in range(0, g.n, imgs):
                n1 = min(g.n, n0 + imgs)
                r = (n1 - n0) * g.oh * g.ow
                src = np.lib.stride_tricks.as_strided(
                    xp[n0:n1],
                    shape=(n1 - n0, g.oh, g.ow, g.kh, g.kw, g.c),
                    strides=(sn, g.sh * sh_, g.sw * sw_, sh_, sw_, sc),
                    writeable=False,
                )
                dst = np.lib.stride_tricks.as_strided(
                    cols,
                    shape=(n1 - n0, g.oh, g.ow, g.kh, g.kw, g.c),
                    strides=(
                        g.oh * g.ow * g.kp * dt.itemsize,
                        g.ow * g.kp * dt.itemsize,
                        g.kp * dt.itemsize,
                        g.kw * g.c * dt.itemsize,
                        g.c * dt.itemsize,
                        dt.itemsize,
                    ),
                )
                np.copyto(dst, src)
                np.matmul(cols[:r], w, out=out2[n0 * g.oh * g.ow : n0 * g.oh * g.ow + r])
        run_epilogue(plan, out, b, res, cuda=False)

    # -- CUDA
    def _run_cuda(
        self,
        plan: OpPlan,
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        workspace: Any,
        stream: Any,
    ) -> None:
        g: ConvGeometry = plan.detail
        x, w, b = inputs[0], inputs[1], inputs[2]
        res = inputs[3] if len(inputs) == 4 else None
        out = outputs[0]
        dt = x.dtype
        item = dt.itemsize
        if g.direct:
            _cuda.gemm_rowmajor(
                stream, _cuda.ptr(x), _cuda.ptr(w), _cuda.ptr(out), g.m, g.cout, g.k, dt
            )
        else:
            cols = workspace_view(workspace, 0, (g.rows_per_chunk, g.kp), dt)
            geo = (
                np.int32(g.h),
                np.int32(g.w),
                np.int32(g.c),
                np.int32(g.kh),
                np.int32(g.kw),
                np.int32(g.sh),
                np.int32(g.sw),
                np.int32(g.ph),
                np.int32(g.pw),
                np.int32(g.oh),
                np.int32(g.ow),
            )
            if g.vec:
                kern = _cuda.kernel(SOURCE, "im2col_vec", dt)
                per_row = g.kh * g.kw * (g.c // (16 // item))
                extra: tuple = ()
            else:
                kern = _cuda.kernel(SOURCE, "im2col_gather", dt)
                per_row = g.kp // (16 // item)
                extra = (np.int32(g.kp),)
            out_ptr = _cuda.ptr(out)
            cols_ptr = _cuda.ptr(cols)
            w_ptr = _cuda.ptr(w)
            for row0 in range(0, g.m, g.rows_per_chunk):
                rows = min(g.rows_per_chunk, g.m - row0)
                _cuda.launch(
                    kern, rows * per_row, (x, cols, np.int64(row0), np.int64(rows), *geo, *extra)
                )
                _cuda.gemm_rowmajor(
                    stream, cols_ptr, w_ptr, out_ptr + row0 * g.cout * item, rows, g.cout, g.kp, dt
                )
        run_epilogue(plan, out, b, res, cuda=True)


CONV2D = Conv2d()


def weights_to_matrix(w_oihw: np.ndarray) -> np.ndarray:
    """[Cout, Cin, KH, KW] (PyTorch's layout) -> [Kp, Cout] in (kh, kw, c) row order, zero-padded."""
    cout, cin, kh, kw = w_oihw.shape
    m = np.ascontiguousarray(w_oihw.transpose(2, 3, 1, 0)).reshape(kh * kw * cin, cout)
    kp = padded_k(kh, kw, cin)
    if kp > m.shape[0]:
        m = np.concatenate([m, np.zeros((kp - m.shape[0], cout), dtype=m.dtype)], axis=0)
    return m
