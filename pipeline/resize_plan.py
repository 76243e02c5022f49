"""The resize plan: how an image of a given size becomes a model's input, worked out from
its header before any pixel is decoded. Pure arithmetic, shared by the CPU resizer
(``imaging.fit``, Pillow) and the GPU one (``ops.resize_crop``, one kernel for a batch):
both compute only the output window, reading the source pixels under it, so no aspect
ratio makes either allocate the whole resized image.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .errors import InvalidInput


@dataclass(frozen=True)
class Target:
    """What the model wants: size, channels and how to fit the image into it."""

    height: int
    width: int
    channels: int  # 1 or 3
    fit: Literal["stretch", "center_crop", "letterbox"] = "stretch"  # letterbox: inside, padded
    crop_fraction: float = 0.875  # center_crop: resize to size / fraction, then crop the centre


# The resize's virtual size (the whole image scaled so the crop fraction covers the target)
# is never allocated, but its sides are geometry on the GPU (int32) and coordinates in
# float32: beyond 2**24 neither is exact. A centre crop of a 65,000:1 strip reaches it.
MAX_RESIZE_SIDE = 1 << 24
# A decoded pixel in Pillow's memory: RGB and RGBA are 4 bytes, L 1, I;16 2, I and F 4.
PIL_PIXEL_BYTES = 4


@dataclass(frozen=True)
class ResizePlan:
    """How an image of ``height`` x ``width`` becomes the model's input, worked out before
    any pixel exists: the image is (virtually) scaled to ``resized`` and the ``out`` window
    at (``top``, ``left``) of it kept. Only that window is ever computed: in source
    coordinates it is ``box``, and the CPU and GPU resizers read just the source pixels
    under it, so what a fit costs is bounded by the source and the output, whatever the
    aspect ratio."""

    height: int
    width: int
    resized_h: int
    resized_w: int
    top: int
    left: int
    out_h: int
    out_w: int

    @property
    def box(self) -> tuple[float, float, float, float]:
        """The output window in source coordinates, Pillow's order: (x0, y0, x1, y1)."""
        sy, sx = self.height / self.resized_h, self.width / self.resized_w
        return (
            self.left * sx,
            self.top * sy,
            (self.left + self.out_w) * sx,
            (self.top + self.out_h) * sy,
        )

    @property
    def scale(self) -> tuple[float, float]:
        """Source pixels per resized pixel (height, width)."""
        return self.height / self.resized_h, self.width / self.resized_w

    def identity(self) -> bool:
        return (self.height, self.width) == (self.resized_h, self.resized_w)

    def pass_order(self) -> Literal["hv", "vh"]:
        """Which of the two separable passes goes first. Pillow's own order is horizontal
        then vertical, whose intermediate is ``out_w`` by the rows under the box: for a tall
        strip stretched wide that is many times the source. Then the vertical pass goes
        first (its intermediate is ``out_h`` by the columns under the box)."""
        x0, y0, x1, y1 = self.box
        hv = self.out_w * _rows_under(y0, y1, self.out_h, self.height)
        vh = self.out_h * _rows_under(x0, x1, self.out_w, self.width)
        return (
            "vh"
            if hv > max(self.height * self.width, self.out_h * self.out_w) and vh < hv
            else "hv"
        )

    def resize_bytes(self, channels: int) -> int:
        """The resize's intermediate and output, in bytes (Pillow's 4-byte pixels)."""
        x0, y0, x1, y1 = self.box
        if self.pass_order() == "hv":
            mid = self.out_w * _rows_under(y0, y1, self.out_h, self.height)
        else:
            mid = self.out_h * _rows_under(x0, x1, self.out_w, self.width)
        return (mid + self.out_h * self.out_w) * PIL_PIXEL_BYTES


def _rows_under(a: float, b: float, n_out: int, n_src: int) -> int:
    """Source rows (or columns) a bilinear pass of ``n_out`` samples over [a, b) reads."""
    support = max(1.0, (b - a) / n_out)  # Pillow widens the filter when it reduces
    return min(n_src, int(b - a + 2 * support) + 2)


def plan_resize(h: int, w: int, t: Target) -> ResizePlan:
    """The plan for an ``h`` x ``w`` image; 400 when its aspect ratio is too extreme for
    the centre crop to be computed exactly."""
    if t.fit == "stretch":
        return ResizePlan(h, w, t.height, t.width, 0, 0, t.height, t.width)
    if t.fit == "letterbox":  # the whole image, inside the target (the caller pads)
        s = min(t.height / h, t.width / w)
        rh, rw = max(1, min(t.height, round(h * s))), max(1, min(t.width, round(w * s)))
        return ResizePlan(h, w, rh, rw, 0, 0, rh, rw)
    s = max(t.height / (h * t.crop_fraction), t.width / (w * t.crop_fraction))
    rh, rw = max(1, round(h * s)), max(1, round(w * s))
    if max(rh, rw) > MAX_RESIZE_SIDE:
        raise InvalidInput(
            "image aspect ratio too extreme to centre-crop: scaling its short side to the "
            "model's input makes the long side too long",
            height=h,
            width=w,
            resized_long_side=max(rh, rw),
            max_resized_side=MAX_RESIZE_SIDE,
        )
    return ResizePlan(h, w, rh, rw, (rh - t.height) // 2, (rw - t.width) // 2, t.height, t.width)


def resize_to(h: int, w: int, t: Target) -> tuple[int, int]:
    """The (virtual) size the whole image is scaled to before the crop."""
    p = plan_resize(h, w, t)
    return p.resized_h, p.resized_w


def jpeg_scaled(h: int, w: int, min_h: int, min_w: int) -> tuple[int, int]:
    """The size libjpeg-turbo decodes to at the smallest scale n/8 still >= (min_h, min_w)
    (simplejpeg's ``min_height``/``min_width``); the full size when none is smaller."""
    for n in range(1, 8):
        dh, dw = -(-h * n // 8), -(-w * n // 8)
        if dh >= min_h and dw >= min_w:
            return dh, dw
    return h, w
