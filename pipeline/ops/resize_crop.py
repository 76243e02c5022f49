"""ResizeCrop: fit images of any sizes into one uint8 batch [N, OH, OW, C], one launch.

    plan = RESIZE_CROP.prepare(*image_specs, height=224, width=224, fit="center_crop",
                               crop_fraction=0.875, pitches=(...))
    table = RESIZE_CROP.table(plan, pointers)      # host bytes of the launch's geometry
    # the caller uploads ``table`` into the workspace (on its copy stream), then:
    RESIZE_CROP.commit(plan, images, [out], workspace, stream)   # one kernel launch

Each image [H, W, C] is fitted by its resize plan (``pipeline.resize_plan``): virtually
scaled to (RH, RW), the (wh, ww) window at (top, left) of that kept and written at
(pad_top, pad_left) of its output row (letterbox pads with zeros; stretch and centre crop
fill the row). Only the window is computed -- no aspect ratio makes the launch allocate
or read more than the source under it. The filter is Pillow's BILINEAR (a triangle
widened by the scale when shrinking, so it antialiases), the one the CPU stage uses, so
the two paths agree to a level on rounding boundaries.

``prepare`` validates (rank, dtype, channels, pitches, the plan's bounds), sizes the output
and the workspace (the geometry table: a device pointer, 11 ints and 2 floats per image)
and computes every image's geometry; it touches no device. ``commit`` launches the kernel
reading the table from the workspace: it allocates nothing and copies nothing. On the
host backend ``commit`` computes the same window with numpy (the reference).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InvalidInput
from ..resize_plan import Target, plan_resize
from . import _cuda
from .base import (
    Op,
    OpPlan,
    TensorSpec,
    align,
    check_tensor,
)

GEO_FIELDS = 11  # H, W, pitch, RH, RW, top, left, pad_top, pad_left, window h, window w
MAX_IMAGES = 4096

SOURCE = r"""
// Pillow's BILINEAR: a triangle filter widened by the scale when shrinking (antialiased),
// weights normalized over the window, both axes in one pass (float, not uint8, between).
// One output value at (oy, ox, c) of an image resized by (sy, sx) = (H/RH, W/RW), read
// from b with rows `pitch` bytes apart.
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

// Row n of y [N, OH, OW, C] from image n: read through a pointer table, each with its own
// row pitch (decoders may pad rows); geo per image as GEO_FIELDS; scale: H/RH, W/RW.
extern "C" __global__ void resize_crop_u8(const unsigned long long* __restrict__ srcs,
    const int* __restrict__ geo, const float* __restrict__ scale,
    unsigned char* __restrict__ y, long long total, int OH, int OW, int C) {
  FERRY_FOR(i, total) {
    const NhwcIdx q = nhwc_index(i, OH, OW, C);
    const int c = q.c, ox = q.ow, oy = q.oh;
    const long long n = q.n;
    const int* g = geo + n * 11;
    int H = g[0], W = g[1], pitch = g[2], RH = g[3], RW = g[4];
    int wy = oy - g[7], wx = ox - g[8];
    unsigned char v = 0;
    if (wy >= 0 && wy < g[9] && wx >= 0 && wx < g[10]) {
      int ry = wy + g[5], rx = wx + g[6];
      const unsigned char* b = (const unsigned char*)srcs[n];
      v = (RH == H && RW == W)
          ? b[(long long)ry * pitch + (long long)rx * C + c]
          : aa_sample(b, pitch, H, W, C, c, ry, rx, scale[2 * n], scale[2 * n + 1]);
    }
    y[i] = v;
  }
}
"""


class ResizeCrop(Op):
    """Images ``[H, W, C]`` uint8 (any sizes) -> one batch ``[N, OH, OW, C]`` uint8."""

    name = "resize_crop"
    n_inputs = (1, MAX_IMAGES)

    def _plan(self, specs: tuple[TensorSpec, ...], attrs: dict[str, Any]) -> OpPlan:
        target = _target(attrs)
        c = None
        for i, s in enumerate(specs):
            check_tensor(self.name, f"image {i}", s, 3, ("uint8",))
            if s.shape[2] != target.channels:
                raise InvalidInput(
                    "resize_crop: an image has the wrong channel count",
                    image=i,
                    channels=s.shape[2],
                    expected=target.channels,
                )
            c = s.shape[2]
        pitches = tuple(attrs.get("pitches") or (s.shape[1] * s.shape[2] for s in specs))
        if len(pitches) != len(specs):
            raise InvalidInput("resize_crop: one pitch per image", pitches=len(pitches))
        n = len(specs)
        geo = np.zeros((n, GEO_FIELDS), np.int32)
        scale = np.zeros((n, 2), np.float32)
        for k, (s, pitch) in enumerate(zip(specs, pitches, strict=True)):
            h, w, _ = s.shape
            if not w * c <= pitch < 1 << 31:
                raise InvalidInput(
                    "resize_crop: a row pitch is below the row's bytes",
                    image=k,
                    pitch=pitch,
                    row_bytes=w * c,
                )
            p = plan_resize(h, w, target)  # InvalidInput for a strip past the exact bounds
            pt, pl = (target.height - p.out_h) // 2, (target.width - p.out_w) // 2
            geo[k] = (
                h,
                w,
                pitch,
                p.resized_h,
                p.resized_w,
                p.top,
                p.left,
                pt,
                pl,
                p.out_h,
                p.out_w,
            )
            scale[k] = p.scale
        out = TensorSpec((n, target.height, target.width, c), "uint8")
        offs = table_offsets(n)
        flops = sum(
            int(g[9]) * int(g[10]) * c * 2 * _taps(float(sy), float(sx))
            for g, (sy, sx) in zip(geo, scale, strict=True)
        )
        return OpPlan(
            self.name,
            specs,
            (out,),
            offs[-1],
            flops=flops,
            bytes_moved=sum(s.nbytes for s in specs) + out.nbytes,
            attrs=tuple(sorted(attrs.items())),
            detail=(geo, scale, offs),
        )

    def table(self, plan: OpPlan, pointers: Sequence[int]) -> np.ndarray:
        """The workspace's bytes (host): the images' device pointers and their geometry,
        to be uploaded into the workspace before ``commit``."""
        geo, scale, (o_ptr, o_geo, o_scale, size) = plan.detail
        if len(pointers) != len(geo):
            raise InvalidInput("resize_crop: one pointer per image", pointers=len(pointers))
        out = np.zeros(size, np.uint8)
        out[o_ptr : o_ptr + 8 * len(geo)] = np.asarray(pointers, np.uint64).view(np.uint8)
        out[o_geo : o_geo + geo.nbytes] = geo.reshape(-1).view(np.uint8)
        out[o_scale : o_scale + scale.nbytes] = scale.reshape(-1).view(np.uint8)
        return out

    def _run_host(
        self, plan: OpPlan, inputs: Sequence[Any], outputs: Sequence[Any], workspace: Any
    ) -> None:
        geo, _, _ = plan.detail
        y = outputs[0]
        for k, x in enumerate(inputs):
            y[k] = fit_window(np.asarray(x), geo[k], y.shape[1], y.shape[2])

    def _run_cuda(
        self,
        plan: OpPlan,
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        workspace: Any,
        stream: Any,
    ) -> None:
        geo, scale, (o_ptr, o_geo, o_scale, _) = plan.detail
        n = len(geo)
        y = outputs[0]
        _, oh, ow, c = y.shape
        total = int(y.size)
        ptrs = workspace[o_ptr : o_ptr + 8 * n].view(np.uint64)
        g = workspace[o_geo : o_geo + geo.nbytes].view(np.int32)
        s = workspace[o_scale : o_scale + scale.nbytes].view(np.float32)
        kern = _cuda.kernel(SOURCE, "resize_crop_u8", "float32")
        args = (ptrs, g, s, y, np.int64(total), np.int32(oh), np.int32(ow), np.int32(c))
        _cuda.launch(kern, total, args)


def _target(attrs: dict[str, Any]) -> Target:
    try:
        t = Target(
            int(attrs["height"]),
            int(attrs["width"]),
            int(attrs.get("channels", 3)),
            attrs.get("fit", "stretch"),
            float(attrs.get("crop_fraction", 0.875)),
        )
    except (KeyError, TypeError, ValueError):
        raise InvalidInput(
            "resize_crop: needs height and width (ints), channels, fit, crop_fraction",
            attrs=sorted(attrs),
        ) from None
    if not (1 <= t.height <= 16384 and 1 <= t.width <= 16384):
        raise InvalidInput("resize_crop: size out of range [1, 16384]", size=(t.height, t.width))
    if t.fit not in ("stretch", "center_crop", "letterbox") or not 0 < t.crop_fraction <= 1:
        raise InvalidInput("resize_crop: bad fit", fit=t.fit, crop_fraction=t.crop_fraction)
    if not 1 <= t.channels <= 4:
        raise InvalidInput("resize_crop: images have 1 to 4 channels", channels=t.channels)
    return t


def target_attrs(t: Target) -> dict[str, Any]:
    """``prepare``'s attrs for a model's target."""
    return {
        "height": t.height,
        "width": t.width,
        "channels": t.channels,
        "fit": t.fit,
        "crop_fraction": t.crop_fraction,
    }


def table_offsets(n: int) -> tuple[int, int, int, int]:
    """Offsets of the pointers, the geometry and the scales in the table, and its size."""
    o_geo = align(8 * n)
    o_scale = o_geo + align(4 * GEO_FIELDS * n)
    return 0, o_geo, o_scale, o_scale + align(8 * n)


def _taps(sy: float, sx: float) -> int:
    return int((2 * max(1.0, sy) + 1) * (2 * max(1.0, sx) + 1))


def _window_weights(size: int, resized: int, start: int, count: int) -> np.ndarray:
    """[count, size] weights of Pillow's bilinear filter for output samples
    ``start .. start + count`` of a resize of ``size`` to ``resized``."""
    scale = size / resized
    fs = max(scale, 1.0)
    centre = (np.arange(start, start + count, dtype=np.float64) + 0.5) * scale
    lo = np.maximum((centre - fs + 0.5).astype(np.int64), 0)
    hi = np.minimum((centre + fs + 0.5).astype(np.int64), size)
    j = np.arange(size, dtype=np.float64)[None, :]
    w = np.maximum(0.0, 1.0 - np.abs((j - centre[:, None] + 0.5) / fs))
    w[(j < lo[:, None]) | (j >= hi[:, None])] = 0.0
    return w / w.sum(axis=1, keepdims=True)


def fit_window(x: np.ndarray, g: np.ndarray, oh: int, ow: int) -> np.ndarray:
    """numpy reference of one kernel row: image ``x`` [H, W, C] by geometry ``g``."""
    h, w, _, rh, rw, top, left, pt, pl, wh, ww = (int(v) for v in g)
    out = np.zeros((oh, ow, x.shape[2]), np.uint8)
    if (rh, rw) == (h, w):
        win = x[top : top + wh, left : left + ww]
    else:
        wy = _window_weights(h, rh, top, wh)
        wx = _window_weights(w, rw, left, ww)
        v = np.einsum("oh,hwc->owc", wy, x.astype(np.float64), optimize=True)
        v = np.einsum("owc,pw->opc", v, wx, optimize=True)
        win = np.clip(np.floor(v + 0.5), 0, 255).astype(np.uint8)
    out[pt : pt + wh, pl : pl + ww] = win
    return out


RESIZE_CROP = ResizeCrop()
