"""Image bytes -> uint8 arrays: type sniffing, header checks before decoding, decode, resize.

JPEG goes through simplejpeg (libjpeg-turbo; it can decode straight at 1/2, 1/4 or 1/8
size, so a 4000-pixel photo costs little more than a thumbnail), PNG and whatever
simplejpeg refuses through Pillow. The pixel count is read from the header and checked
before a single pixel is decoded. All of it releases the GIL in C, so worker threads scale.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import io
import struct
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import simplejpeg
from PIL import Image, UnidentifiedImageError

from .errors import InvalidInput, PayloadTooLarge, UnsupportedMediaType
from .resize_plan import (  # noqa: F401  (re-exported: the registry and the GPU stage)
    MAX_RESIZE_SIDE,
    PIL_PIXEL_BYTES,
    ResizePlan,
    Target,
    jpeg_scaled,
    plan_resize,
    resize_to,
)

JPEG_MAGIC = b"\xff\xd8\xff"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# What decoding and resizing one image may hold at its peak (``plan_decode``); 413 above.
# A 40-megapixel PNG (the default pixel limit) plans 320 MB.
DEFAULT_MAX_WORK_BYTES = 512 << 20
MEDIA_TYPES = {"image/jpeg": "jpeg", "image/jpg": "jpeg", "image/pjpeg": "jpeg", "image/png": "png"}


def sniff(data: bytes) -> Literal["jpeg", "png"] | None:
    if data[:3] == JPEG_MAGIC:
        return "jpeg"
    if data[:8] == PNG_MAGIC:
        return "png"
    return None


# Other image formats, known by their first bytes: a body that is one of them is not what
# Ferry reads, whatever its label says (415, not 400: it is not a broken JPEG or PNG).
_OTHER_FORMATS = (
    (b"GIF87a", "gif"),
    (b"GIF89a", "gif"),
    (b"BM", "bmp"),
    (b"II*\x00", "tiff"),
    (b"MM\x00*", "tiff"),
    (b"\x00\x00\x01\x00", "ico"),
    (b"8BPS", "psd"),
    (b"\xff\x0a", "jpeg-xl"),
    (b"\x00\x00\x00\x0cJXL ", "jpeg-xl"),
    (b"\x00\x00\x00\x0cjP  ", "jpeg-2000"),
    (b"\xffO\xffQ", "jpeg-2000"),
    (b"%PDF", "pdf"),
    (b"qoif", "qoi"),
)


def other_format(data: bytes) -> str | None:
    """The name of the image format ``data`` starts as, when it is one Ferry does not read."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if data[4:8] == b"ftyp" and data[8:12] in (b"avif", b"avis", b"heic", b"heix", b"mif1"):
        return "heif"
    for magic, name in _OTHER_FORMATS:
        if data.startswith(magic):
            return name
    return None


def check_media(data: bytes, content_type: str | None) -> str:
    """The image's format; 400 for an empty body or one that is no image at all, 415 when
    the type is unknown or lies (a GIF labelled image/jpeg included)."""
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
        other = other_format(data)
        if other is not None:
            raise UnsupportedMediaType(
                "body is an image format Ferry does not read; send JPEG or PNG",
                content_type=content_type,
                body=other,
            )
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
_PROGRESSIVE = frozenset({0xC2, 0xC6, 0xCA, 0xCE})  # libjpeg buffers all coefficients


def jpeg_size(data: bytes) -> tuple[int, int]:
    """(height, width) from a JPEG's frame header, read in Python. The event loop calls this
    for every request, and libjpeg-turbo's header read (simplejpeg) gives up the GIL: with
    one busy Python thread beside it, the call then took 4.5 ms waiting to get it back,
    against 2 us alone; this loop over the segment headers takes about 1 us either way."""
    h, w, _ = jpeg_frame(data)
    return h, w


def jpeg_frame(data: bytes) -> tuple[int, int, int]:
    """(height, width, start-of-frame marker) from a JPEG's frame header."""
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
            return (data[i + 5] << 8) | data[i + 6], (data[i + 7] << 8) | data[i + 8], marker
        i += 2 + length
    raise InvalidInput("malformed JPEG header", detail="no frame header")


@dataclass(frozen=True)
class DecodePlan:
    """What decoding one image will cost, from its header: the format, the source size,
    the size it decodes to (a JPEG at a reduced DCT scale where that still covers the
    resize), the resize plan from there, and the bytes all of it holds at its peak."""

    kind: str
    height: int
    width: int
    decoded_h: int
    decoded_w: int
    resize: ResizePlan
    work_bytes: int


def plan_decode(
    data: bytes, content_type: str | None, target: Target, max_pixels: int, max_work_bytes: int
) -> DecodePlan:
    """Check an image from its header and plan its decode and resize; 400/413/415 with the
    reason when it cannot be done within ``max_pixels`` and ``max_work_bytes``. The header
    is read once; the plan, a pure function of the image's size and format, is kept for the
    sizes seen last (a video's frames, a client's photos: one size, planned once)."""
    kind = check_media(data, content_type)
    if kind == "jpeg":
        h, w, sof = jpeg_frame(data)
    else:
        (h, w), sof = image_size(data, kind), 0
    if h < 1 or w < 1:
        raise InvalidInput("image has no pixels", height=h, width=w)
    if h * w > max_pixels:
        raise PayloadTooLarge("image has too many pixels", height=h, width=w, max_pixels=max_pixels)
    return _planned(kind, h, w, sof in _PROGRESSIVE, target, max_work_bytes)


@functools.lru_cache(maxsize=512)
def _planned(
    kind: str, h: int, w: int, progressive: bool, target: Target, max_work_bytes: int
) -> DecodePlan:
    """The decode and resize plan of a checked header (413 where its working set is over
    ``max_work_bytes``: not kept, as a raised call is not)."""
    c = target.channels
    if kind == "jpeg":
        full = plan_resize(h, w, target)
        dh, dw = jpeg_scaled(h, w, full.resized_h, full.resized_w)
        # the decoded pixels, their copy into Pillow, and for a progressive JPEG
        # libjpeg's whole-image coefficient buffer (2 bytes a coefficient, full resolution)
        decode = dh * dw * c + dh * dw * PIL_PIXEL_BYTES + (h * w * 3 * 2 if progressive else 0)
    else:
        dh, dw = h, w
        # Pillow's decoded image and its conversion to RGB or L
        decode = 2 * h * w * PIL_PIXEL_BYTES
    rp = plan_resize(dh, dw, target)
    work = decode + rp.resize_bytes(c)
    if work > max_work_bytes:
        raise PayloadTooLarge(
            "decoding and resizing this image would need more memory than allowed",
            height=h,
            width=w,
            work_bytes=work,
            max_work_bytes=max_work_bytes,
        )
    return DecodePlan(kind, h, w, dh, dw, rp, work)


def decode(
    data: bytes,
    content_type: str | None,
    target: Target,
    max_pixels: int,
    max_work_bytes: int = DEFAULT_MAX_WORK_BYTES,
    plan: DecodePlan | None = None,
) -> np.ndarray:
    """Bytes -> uint8 [H, W, C] at the target size, within the planned memory. Raises
    4xx-mapped ``FerryError``s. ``plan``: the one the ingress made from this image's header
    for this target (then the header is not parsed again)."""
    p = plan or plan_decode(data, content_type, target, max_pixels, max_work_bytes)
    img = None
    if p.kind == "jpeg":
        img = _decode_jpeg(data, target.channels, p.decoded_h, p.decoded_w)
    if img is None:
        return _fit_pil(_open_pillow(data, target.channels), target)
    return fit(img, target)


def decode_unfitted(
    data: bytes,
    content_type: str | None,
    target: Target,
    max_pixels: int,
    max_work_bytes: int = DEFAULT_MAX_WORK_BYTES,
    plan: DecodePlan | None = None,
) -> np.ndarray:
    """Bytes -> uint8 [H, W, C], checked and planned, decoded but not resized: a JPEG at
    the smallest DCT scale still at least the size ``fit`` resizes to (GPU preprocessing
    resizes it there, reading only the source pixels under the plan's box)."""
    p = plan or plan_decode(data, content_type, target, max_pixels, max_work_bytes)
    img = None
    if p.kind == "jpeg":
        img = _decode_jpeg(data, target.channels, p.decoded_h, p.decoded_w)
    if img is None:
        img = _decode_pillow(data, target.channels)
    return img


def _decode_jpeg(data: bytes, channels: int, min_h: int, min_w: int) -> np.ndarray | None:

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


def _open_pillow(data: bytes, channels: int) -> Any:
    """The decoded Pillow image in mode L or RGB."""

    try:
        with Image.open(io.BytesIO(data)) as im:
            return im.convert("L" if channels == 1 else "RGB")
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise InvalidInput("corrupt or truncated image", detail=str(exc)) from None


def _decode_pillow(data: bytes, channels: int) -> np.ndarray:
    arr = np.asarray(_open_pillow(data, channels))
    return arr[..., None] if arr.ndim == 2 else arr


def fit(img: np.ndarray, t: Target) -> np.ndarray:
    """Resize (bilinear, Pillow) and, for ``center_crop``, cut the centre out: only the
    output window is computed (``ResizePlan.box``), never the whole resized image."""

    return _fit_pil(Image.fromarray(img[..., 0] if img.shape[2] == 1 else img), t)


def _fit_pil(pil: Any, t: Target) -> np.ndarray:

    p = plan_resize(pil.height, pil.width, t)
    if not p.identity():
        x0, y0, x1, y1 = p.box
        size = (p.out_w, p.out_h)
        if p.pass_order() == "hv":  # Pillow's own order: one call
            pil = pil.resize(size, Image.BILINEAR, box=p.box)
        else:  # the vertical pass first, then the horizontal one
            pil = pil.resize((pil.width, p.out_h), Image.BILINEAR, box=(0, y0, pil.width, y1))
            pil = pil.resize(size, Image.BILINEAR, box=(x0, 0, x1, p.out_h))
        arr = np.asarray(pil)
    else:  # the image is the resized size: the crop alone
        arr = np.asarray(pil)[p.top : p.top + p.out_h, p.left : p.left + p.out_w]
    arr = arr[..., None] if arr.ndim == 2 else arr
    if t.fit == "letterbox":  # centred on a black canvas of the target's size
        out = np.zeros((t.height, t.width, arr.shape[2]), np.uint8)
        top, left = (t.height - p.out_h) // 2, (t.width - p.out_w) // 2
        out[top : top + p.out_h, left : left + p.out_w] = arr
        return out
    return np.ascontiguousarray(arr)


def encode_png(img: np.ndarray) -> bytes:

    buf = io.BytesIO()
    Image.fromarray(img[..., 0] if img.ndim == 3 and img.shape[2] == 1 else img).save(
        buf, format="PNG"
    )
    return buf.getvalue()


def encode_jpeg(img: np.ndarray, quality: int = 90) -> bytes:

    if img.ndim == 2:
        img = img[..., None]
    cs = "GRAY" if img.shape[2] == 1 else "RGB"
    return simplejpeg.encode_jpeg(np.ascontiguousarray(img), quality=quality, colorspace=cs)


_scratch_bounded = False


def bound_decoder_scratch(mmap_threshold: int = 1 << 20) -> bool:
    """Make decoder scratch go back to the system when it is freed (glibc only; a no-op
    elsewhere). glibc raises its mmap threshold to the size of each large block freed, up
    to 32 MB, after which images of that size come from the decoding thread's arena and,
    freed, stay in the process: a replica that once decoded big images kept gigabytes
    idle. A fixed threshold turns that off, so every block over ``mmap_threshold`` is
    mapped on its own and unmapped when freed; the trim threshold returns the top of the
    heap past 4x that. Called once per process by the stages that decode."""
    global _scratch_bounded
    if _scratch_bounded:
        return True

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    ok = mallopt(m_mmap_threshold, mmap_threshold) == 1
    ok = mallopt(m_trim_threshold, 4 * mmap_threshold) == 1 and ok
    _scratch_bounded = ok
    return ok
