"""Image bytes -> uint8 arrays: type sniffing, header checks before decoding, decode, resize.

JPEG goes through simplejpeg (libjpeg-turbo; it can decode straight at 1/2, 1/4 or 1/8
size, so a 4000-pixel photo costs little more than a thumbnail), PNG and whatever
simplejpeg refuses through Pillow. The pixel count is read from the header and checked
before a single pixel is decoded. All of it releases the GIL in C, so worker threads scale.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from typing import Literal

import numpy as np

from .errors import InvalidInput, PayloadTooLarge, UnsupportedMediaType

JPEG_MAGIC = b"\xff\xd8\xff"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MEDIA_TYPES = {"image/jpeg": "jpeg", "image/jpg": "jpeg", "image/pjpeg": "jpeg", "image/png": "png"}


def sniff(data: bytes) -> Literal["jpeg", "png"] | None:
    if data[:3] == JPEG_MAGIC:
        return "jpeg"
    if data[:8] == PNG_MAGIC:
        return "png"
    return None


def check_media(data: bytes, content_type: str | None) -> str:
    """The image's format; 400 for an empty body, 415 when the type is unknown or lies."""
    if not data:
        raise InvalidInput("empty body: send the image bytes")
    kind = sniff(data)
    declared = None
    if content_type:
        ct = content_type.split(";")[0].strip().lower()
        if ct not in ("application/octet-stream", ""):
            declared = MEDIA_TYPES.get(ct)
            if declared is None:
                raise UnsupportedMediaType(
                    "unsupported content type; send image/jpeg or image/png", content_type=ct
                )
    if kind is None:
        if declared is not None:
            raise InvalidInput(
                "body is not a valid image of the declared type", content_type=content_type
            )
        raise UnsupportedMediaType("body is neither JPEG nor PNG")
    if declared is not None and declared != kind:
        raise UnsupportedMediaType(
            "body does not match its Content-Type", content_type=content_type, body=kind
        )
    return kind


def image_size(data: bytes, kind: str) -> tuple[int, int]:
    """(height, width) from the header alone."""
    if kind == "png":
        if len(data) < 24 or data[12:16] != b"IHDR":
            raise InvalidInput("truncated or malformed PNG header")
        w, h = struct.unpack(">II", data[16:24])
        return int(h), int(w)
    return jpeg_size(data)


# start-of-frame markers (baseline, extended, progressive, lossless; Huffman or arithmetic):
# every 0xC0-0xCF but DHT (C4), JPG (C8) and DAC (CC)
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def jpeg_size(data: bytes) -> tuple[int, int]:
    """(height, width) from a JPEG's frame header, read in Python. The event loop calls this
    for every request, and libjpeg-turbo's header read (simplejpeg) gives up the GIL: with
    one busy Python thread beside it, the call then took 4.5 ms waiting to get it back,
    against 2 us alone; this loop over the segment headers takes about 1 us either way."""
    n = len(data)
    if data[:2] != b"\xff\xd8":
        raise InvalidInput("malformed JPEG header", detail="no start-of-image marker")
    i = 2
    while i + 4 <= n:
        if data[i] != 0xFF:
            raise InvalidInput("malformed JPEG header", detail=f"no marker at byte {i}")
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte before a marker
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length
            i += 2
            continue
        if marker in (0xD9, 0xDA):  # end of image, or scan data, before any frame header
            break
        length = (data[i + 2] << 8) | data[i + 3]
        if length < 2:
            raise InvalidInput("malformed JPEG header", detail=f"segment length {length}")
        if marker in _SOF:
            if i + 9 > n or length < 8:
                break
            return (data[i + 5] << 8) | data[i + 6], (data[i + 7] << 8) | data[i + 8]
        i += 2 + length
    raise InvalidInput("malformed JPEG header", detail="no frame header")


@dataclass(frozen=True)
class Target:
    """What the model wants: size, channels and how to fit the image into it."""

    height: int
    width: int
    channels: int  # 1 or 3
    fit: Literal["stretch", "center_crop", "letterbox"] = "stretch"  # letterbox: inside, padded
    crop_fraction: float = 0.875  # center_crop: resize to size / fraction, then crop the centre


def decode(data: bytes, content_type: str | None, target: Target, max_pixels: int) -> np.ndarray:
    """Bytes -> uint8 [H, W, C] at the target size. Raises 4xx-mapped ``FerryError``s."""
    return fit(decode_unfitted(data, content_type, target, max_pixels), target)


def decode_unfitted(
    data: bytes, content_type: str | None, target: Target, max_pixels: int
) -> np.ndarray:
    """Bytes -> uint8 [H, W, C], checked, decoded but not resized: a JPEG at the smallest DCT
    scale still at least the size ``fit`` resizes to (GPU preprocessing resizes it there)."""
    kind, h, w = checked_header(data, content_type, max_pixels)
    rh, rw = resize_to(h, w, target)
    img = _decode_jpeg(data, target.channels, rh, rw) if kind == "jpeg" else None
    if img is None:
        img = _decode_pillow(data, target.channels)
    return img


def checked_header(data: bytes, content_type: str | None, max_pixels: int) -> tuple[str, int, int]:
    """(kind, height, width) from the header, after the media and pixel-count checks."""
    kind = check_media(data, content_type)
    h, w = image_size(data, kind)
    if h < 1 or w < 1:
        raise InvalidInput("image has no pixels", height=h, width=w)
    if h * w > max_pixels:
        raise PayloadTooLarge("image has too many pixels", height=h, width=w, max_pixels=max_pixels)
    return kind, h, w


def resize_to(h: int, w: int, t: Target) -> tuple[int, int]:
    if t.fit == "stretch":
        return t.height, t.width
    if t.fit == "letterbox":
        s = min(t.height / h, t.width / w)
        return max(1, min(t.height, round(h * s))), max(1, min(t.width, round(w * s)))
    s = max(t.height / (h * t.crop_fraction), t.width / (w * t.crop_fraction))
    return max(1, round(h * s)), max(1, round(w * s))


def _decode_jpeg(data: bytes, channels: int, min_h: int, min_w: int) -> np.ndarray | None:
    import simplejpeg

    try:
        # min_height/min_width: decode at the smallest DCT scale still >= the size we need
        img = simplejpeg.decode_jpeg(
            data,
            colorspace="GRAY" if channels == 1 else "RGB",
            fastdct=True,
            fastupsample=True,
            min_height=min_h,
            min_width=min_w,
        )
    except ValueError as exc:
        msg = str(exc).lower()
        if "unsupported" in msg or "cmyk" in msg or "colorspace" in msg:
            return None  # let Pillow try
        raise InvalidInput("corrupt or truncated JPEG", detail=str(exc)) from None
    return img if img.ndim == 3 else img[..., None]


def _decode_pillow(data: bytes, channels: int) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as im:
            im = im.convert("L" if channels == 1 else "RGB")
            arr = np.asarray(im)
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise InvalidInput("corrupt or truncated image", detail=str(exc)) from None
    return arr[..., None] if arr.ndim == 2 else arr


def fit(img: np.ndarray, t: Target) -> np.ndarray:
    """Resize (bilinear, Pillow) and, for ``center_crop``, cut the centre out."""
    from PIL import Image

    h, w = img.shape[:2]
    rh, rw = resize_to(h, w, t)
    if (h, w) != (rh, rw):
        pil = Image.fromarray(img[..., 0] if img.shape[2] == 1 else img)
        img = np.asarray(pil.resize((rw, rh), Image.BILINEAR))
        if img.ndim == 2:
            img = img[..., None]
    if t.fit == "letterbox":
        out = np.zeros((t.height, t.width, img.shape[2]), np.uint8)
        top, left = (t.height - rh) // 2, (t.width - rw) // 2
        out[top : top + rh, left : left + rw] = img
        return out
    if t.fit == "center_crop":
        top = (rh - t.height) // 2
        left = (rw - t.width) // 2
        img = img[top : top + t.height, left : left + t.width]
    return np.ascontiguousarray(img)


def encode_png(img: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(img[..., 0] if img.ndim == 3 and img.shape[2] == 1 else img).save(
        buf, format="PNG"
    )
    return buf.getvalue()


def encode_jpeg(img: np.ndarray, quality: int = 90) -> bytes:
    import simplejpeg

    if img.ndim == 2:
        img = img[..., None]
    cs = "GRAY" if img.shape[2] == 1 else "RGB"
    return simplejpeg.encode_jpeg(np.ascontiguousarray(img), quality=quality, colorspace=cs)
