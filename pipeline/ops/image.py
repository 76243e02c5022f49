"""Image ops for preprocessing: uint8 HWC -> normalized float (NHWC or NCHW), bilinear resize.

``normalize`` computes ``(x / 255 - mean) / std`` per channel (mean and std on the [0, 1]
scale, as torchvision gives them) and can pad NHWC output with zero channels.
``resize_bilinear`` uses half-pixel centres (OpenCV's INTER_LINEAR, PyTorch's
``align_corners=False`` without antialiasing) and rounds to the nearest uint8.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InvalidInput
from . import _cuda
from .base import Op, OpPlan, TensorSpec, check_dtype, check_positive, check_rank

SOURCE = r"""
// per-channel scale s and shift t come by value (at most 4 channels): no table, no copy
extern "C" __global__ void normalize_u8(const unsigned char* __restrict__ x, T* __restrict__ y,
    float s0, float s1, float s2, float s3, float t0, float t1, float t2, float t3,
    long long total, int HW, int C, int Cp, int nchw) {
  const float s[4] = {s0, s1, s2, s3};
  const float t[4] = {t0, t1, t2, t3};
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    int c; long long p;  // output channel, pixel index n*HW + hw
    if (nchw) { long long q = i / HW; c = (int)(q % Cp); p = (q / Cp) * HW + i % HW; }
    else { c = (int)(i % Cp); p = i / Cp; }
    float v = 0.f;
    if (c < C) v = (float)x[p * C + c] * s[c] + t[c];
    y[i] = fromf(v);
  }
}

extern "C" __global__ void resize_bilinear_u8(const unsigned char* __restrict__ x,
    unsigned char* __restrict__ y, long long total, int H, int W, int C, int OH, int OW,
    float sy, float sx) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    int c = (int)(i % C);
    long long t = i / C;
    int ox = (int)(t % OW); t /= OW;
    int oy = (int)(t % OH);
    long long n = t / OH;
    float fy = fminf(fmaxf((oy + 0.5f) * sy - 0.5f, 0.f), (float)(H - 1));
    float fx = fminf(fmaxf((ox + 0.5f) * sx - 0.5f, 0.f), (float)(W - 1));
    int y0 = (int)fy, x0 = (int)fx;
    int y1 = min(y0 + 1, H - 1), x1 = min(x0 + 1, W - 1);
    float wy = fy - y0, wx = fx - x0;
    const unsigned char* b = x + n * (long long)H * W * C;
    float v00 = b[((long long)y0 * W + x0) * C + c], v01 = b[((long long)y0 * W + x1) * C + c];
    float v10 = b[((long long)y1 * W + x0) * C + c], v11 = b[((long long)y1 * W + x1) * C + c];
    float v = (v00 * (1.f - wx) + v01 * wx) * (1.f - wy) + (v10 * (1.f - wx) + v11 * wx) * wy;
    y[i] = (unsigned char)fminf(fmaxf(floorf(v + 0.5f), 0.f), 255.f);
  }
}

// Pillow's BILINEAR: a triangle filter widened by the scale when shrinking (antialiased),
// weights normalized over the window, both axes in one pass (float, not uint8, in between).
// One output value at (oy, ox, c) of an image resized by (sy, sx) = (H/OH, W/OW), read from
// b with rows `pitch` bytes apart; both resize kernels below sample through it.
__device__ __forceinline__ unsigned char aa_sample(const unsigned char* __restrict__ b,
    long long pitch, int H, int W, int C, int c, int oy, int ox, float sy, float sx) {
  float fy = fmaxf(sy, 1.f), fx = fmaxf(sx, 1.f);
  float cy = (oy + 0.5f) * sy, cx = (ox + 0.5f) * sx;
  int y0 = max((int)(cy - fy + 0.5f), 0), y1 = min((int)(cy + fy + 0.5f), H);
  int x0 = max((int)(cx - fx + 0.5f), 0), x1 = min((int)(cx + fx + 0.5f), W);
  float acc = 0.f, wys = 0.f, wxs = 0.f;
  for (int xx = x0; xx < x1; ++xx) wxs += fmaxf(0.f, 1.f - fabsf((xx - cx + 0.5f) / fx));
  for (int yy = y0; yy < y1; ++yy) {
    float wy = fmaxf(0.f, 1.f - fabsf((yy - cy + 0.5f) / fy));
    if (wy == 0.f) continue;
    float row = 0.f;
    const unsigned char* r = b + (long long)yy * pitch + c;
    for (int xx = x0; xx < x1; ++xx) {
      float wx = fmaxf(0.f, 1.f - fabsf((xx - cx + 0.5f) / fx));
      row += wx * r[(long long)xx * C];
    }
    acc += wy * row;
    wys += wy;
  }
  float v = acc / (wys * wxs);
  return (unsigned char)fminf(fmaxf(floorf(v + 0.5f), 0.f), 255.f);
}

extern "C" __global__ void resize_aa_u8(const unsigned char* __restrict__ x,
    unsigned char* __restrict__ y, long long total, int H, int W, int C, int OH, int OW,
    float sy, float sx) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    int c = (int)(i % C);
    long long t = i / C;
    int ox = (int)(t % OW); t /= OW;
    int oy = (int)(t % OH);
    long long n = t / OH;
    const unsigned char* b = x + n * (long long)H * W * C;
    y[i] = aa_sample(b, (long long)W * C, H, W, C, c, oy, ox, sy, sx);
  }
}

// Many images of different sizes, each fitted into one row of y [N, OH, OW, C] in one
// launch: resized with aa_sample to (RH, RW) and the (OH, OW) window at (top, left) of
// that kept (a centre crop; stretch is RH = OH, RW = OW, top = left = 0). Sources are read
// through a pointer table with their own row pitch (decoders may pad rows).
// geo per image: H, W, pitch (bytes), RH, RW, top, left, output row; scale: H/RH, W/RW.
extern "C" __global__ void resize_crop_aa_many_u8(const unsigned long long* __restrict__ srcs,
    const int* __restrict__ geo, const float* __restrict__ scale,
    unsigned char* __restrict__ y, long long total, int OH, int OW, int C) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    int c = (int)(i % C);
    long long t = i / C;
    int ox = (int)(t % OW); t /= OW;
    int oy = (int)(t % OH);
    long long n = t / OH;
    const int* g = geo + n * 8;
    int H = g[0], W = g[1], pitch = g[2], RH = g[3], RW = g[4];
    int ry = oy + g[5], rx = ox + g[6];
    const unsigned char* b = (const unsigned char*)srcs[n];
    unsigned char* out = y + (long long)g[7] * OH * OW * C + ((long long)oy * OW + ox) * C + c;
    *out = (RH == H && RW == W)
        ? b[(long long)ry * pitch + (long long)rx * C + c]
        : aa_sample(b, pitch, H, W, C, c, ry, rx, scale[2 * n], scale[2 * n + 1]);
  }
}
"""

GEO_FIELDS = 8  # H, W, pitch, RH, RW, top, left, output row


def resize_crop_many(srcs: Any, geo: Any, scale: Any, out: Any, n: int) -> None:
    """Fit ``n`` device images into rows of ``out`` [N, OH, OW, C] uint8 in one launch, on
    the current stream: ``srcs`` (uint64 device pointers), ``geo`` (int32 [n, 8]: H, W,
    row pitch in bytes, resized RH, RW, crop top, left, output row) and ``scale`` (float32
    [n, 2]: H / RH, W / RW) are device arrays. The filter is ``resize_aa_u8``'s, so each
    row equals resizing its image with ``resize_bilinear(antialias=True)`` and cropping."""
    _, oh, ow, c = out.shape
    total = int(n) * oh * ow * c
    kern = _cuda.kernel(SOURCE, "resize_crop_aa_many_u8", "float32")
    _cuda.launch(
        kern,
        total,
        (srcs, geo, scale, out, np.int64(total), np.int32(oh), np.int32(ow), np.int32(c)),
    )


def _floats(v: Any, n: int, what: str) -> tuple[float, ...]:
    t = tuple(float(e) for e in (v if isinstance(v, list | tuple) else [v] * n))
    if len(t) != n:
        raise InvalidInput(f"normalize: {what} needs one value per channel", values=t, channels=n)
    return t


class Normalize(Op):
    name = "normalize"

    def _plan(self, specs: tuple[TensorSpec, ...], attrs: dict[str, Any]) -> OpPlan:
        (x,) = specs
        check_rank(self.name, "x", x, 4)
        check_positive(self.name, "x", x)
        check_dtype(self.name, "x", x, ("uint8",))
        n, h, w, c = x.shape
        if c > 4:
            raise InvalidInput("normalize: images have 1 to 4 channels", channels=c)
        mean = _floats(attrs.get("mean", 0.0), c, "mean")
        std = _floats(attrs.get("std", 1.0), c, "std")
        if any(s <= 0 for s in std):
            raise InvalidInput("normalize: std must be positive", std=std)
        layout = attrs.get("layout", "nhwc")
        if layout not in ("nhwc", "nchw"):
            raise InvalidInput("normalize: layout must be 'nhwc' or 'nchw'", layout=layout)
        dtype = attrs.get("dtype", "float32")
        if dtype not in ("float16", "float32"):
            raise InvalidInput("normalize: dtype must be float16 or float32", dtype=dtype)
        cp = int(attrs.get("pad_channels", c))
        if cp < c:
            raise InvalidInput(
                "normalize: pad_channels must be >= the input's channels",
                pad_channels=cp,
                channels=c,
            )
        shape = (n, h, w, cp) if layout == "nhwc" else (n, cp, h, w)
        out = TensorSpec(shape, dtype)
        scale = np.array([1.0 / (255.0 * s) for s in std] + [0.0] * (cp - c), dtype=np.float32)
        shift = np.array(
            [-m / s for m, s in zip(mean, std, strict=True)] + [0.0] * (cp - c), dtype=np.float32
        )
        return OpPlan(
            self.name,
            specs,
            (out,),
            0,
            flops=2 * out.size,
            bytes_moved=x.nbytes + out.nbytes,
            attrs=(
                ("dtype", dtype),
                ("layout", layout),
                ("mean", mean),
                ("pad_channels", cp),
                ("std", std),
            ),
            detail=(scale, shift, layout),
        )

    def _run_host(
        self, plan: OpPlan, inputs: Sequence[Any], outputs: Sequence[Any], workspace: Any
    ) -> None:
        scale, shift, layout = plan.detail
        x, y = inputs[0], outputs[0]
        c = x.shape[3]
        v = x.astype(np.float32) * scale[:c] + shift[:c]
        if layout == "nhwc":
            y[..., :c] = v
            y[..., c:] = 0
        else:
            y[:, :c] = v.transpose(0, 3, 1, 2)
            y[:, c:] = 0

    def _run_cuda(
        self,
        plan: OpPlan,
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        workspace: Any,
        stream: Any,
    ) -> None:
        scale, shift, layout = plan.detail
        x, y = inputs[0], outputs[0]
        n, h, w, c = x.shape
        cp = len(scale)
        affine = np.zeros(8, dtype=np.float32)
        affine[:c], affine[4 : 4 + c] = scale[:c], shift[:c]
        kern = _cuda.kernel(SOURCE, "normalize_u8", y.dtype)
        total = int(y.size)
        _cuda.launch(
            kern,
            total,
            (
                x,
                y,
                *(np.float32(v) for v in affine),
                np.int64(total),
                np.int32(h * w),
                np.int32(c),
                np.int32(cp),
                np.int32(layout == "nchw"),
            ),
        )


class ResizeBilinear(Op):
    name = "resize_bilinear"

    def _plan(self, specs: tuple[TensorSpec, ...], attrs: dict[str, Any]) -> OpPlan:
        (x,) = specs
        check_rank(self.name, "x", x, 4)
        check_positive(self.name, "x", x)
        check_dtype(self.name, "x", x, ("uint8",))
        size = attrs.get("size")
        try:
            oh, ow = (
                (int(size), int(size))
                if isinstance(size, int | np.integer)
                else (int(size[0]), int(size[1]))
            )
        except (TypeError, IndexError, ValueError):
            raise InvalidInput(
                "resize_bilinear: size must be an int or (height, width)", size=size
            ) from None
        if oh < 1 or ow < 1 or oh > 16384 or ow > 16384:
            raise InvalidInput("resize_bilinear: size out of range [1, 16384]", size=(oh, ow))
        n, h, w, c = x.shape
        aa = bool(attrs.get("antialias", False))
        out = TensorSpec((n, oh, ow, c), "uint8")
        taps = (2 * max(1.0, h / oh) + 1) * (2 * max(1.0, w / ow) + 1) if aa else 4
        return OpPlan(
            self.name,
            specs,
            (out,),
            0,
            flops=int(out.size * 2 * taps),
            bytes_moved=x.nbytes + out.nbytes,
            attrs=(("size", (oh, ow)), ("antialias", aa)),
            detail=(oh, ow, aa),
        )

    def _run_host(
        self, plan: OpPlan, inputs: Sequence[Any], outputs: Sequence[Any], workspace: Any
    ) -> None:
        oh, ow, aa = plan.detail
        ref = resize_antialias_reference if aa else resize_bilinear_reference
        outputs[0][...] = ref(inputs[0], oh, ow)

    def _run_cuda(
        self,
        plan: OpPlan,
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        workspace: Any,
        stream: Any,
    ) -> None:
        x, y = inputs[0], outputs[0]
        n, h, w, c = x.shape
        oh, ow, aa = plan.detail
        kern = _cuda.kernel(SOURCE, "resize_aa_u8" if aa else "resize_bilinear_u8", "float32")
        total = int(y.size)
        _cuda.launch(
            kern,
            total,
            (
                x,
                y,
                np.int64(total),
                np.int32(h),
                np.int32(w),
                np.int32(c),
                np.int32(oh),
                np.int32(ow),
                np.float32(h / oh),
                np.float32(w / ow),
            ),
        )


def _axis_weights(size: int, out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    f = np.clip(
        (np.arange(out, dtype=np.float32) + 0.5) * np.float32(size / out) - 0.5, 0, size - 1
    )
    i0 = f.astype(np.int64)
    i1 = np.minimum(i0 + 1, size - 1)
    return i0, i1, (f - i0).astype(np.float32)


def resize_bilinear_reference(x: np.ndarray, oh: int, ow: int) -> np.ndarray:
    """numpy bilinear resize of uint8 [N, H, W, C] with half-pixel centres."""
    y0, y1, wy = _axis_weights(x.shape[1], oh)
    x0, x1, wx = _axis_weights(x.shape[2], ow)
    xf = x.astype(np.float32)
    wx_ = wx[None, None, :, None]
    top = xf[:, y0][:, :, x0] * (1 - wx_) + xf[:, y0][:, :, x1] * wx_
    bot = xf[:, y1][:, :, x0] * (1 - wx_) + xf[:, y1][:, :, x1] * wx_
    wy_ = wy[None, :, None, None]
    v = top * (1 - wy_) + bot * wy_
    return np.clip(np.floor(v + 0.5), 0, 255).astype(np.uint8)


def _aa_weights(size: int, out: int) -> np.ndarray:
    """[out, size] weights of Pillow's antialiased bilinear filter along one axis."""
    scale = size / out
    fs = max(scale, 1.0)
    centre = (np.arange(out, dtype=np.float64) + 0.5) * scale
    lo = np.maximum((centre - fs + 0.5).astype(np.int64), 0)
    hi = np.minimum((centre + fs + 0.5).astype(np.int64), size)
    j = np.arange(size, dtype=np.float64)[None, :]
    w = np.maximum(0.0, 1.0 - np.abs((j - centre[:, None] + 0.5) / fs))
    w[(j < lo[:, None]) | (j >= hi[:, None])] = 0.0
    return w / w.sum(axis=1, keepdims=True)


def resize_antialias_reference(x: np.ndarray, oh: int, ow: int) -> np.ndarray:
    """numpy antialiased bilinear resize of uint8 [N, H, W, C] (Pillow's filter)."""
    wy = _aa_weights(x.shape[1], oh)
    wx = _aa_weights(x.shape[2], ow)
    v = np.einsum("oh,nhwc->nowc", wy, x.astype(np.float64), optimize=True)
    v = np.einsum("nowc,pw->nopc", v, wx, optimize=True)
    return np.clip(np.floor(v + 0.5), 0, 255).astype(np.uint8)


NORMALIZE = Normalize()
RESIZE_BILINEAR = ResizeBilinear()
