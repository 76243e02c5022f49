"""Encoding answers on the CPU, batched: a call's images go to a pool of threads at once
(simplejpeg and Pillow release the GIL while they encode).

JPEG through simplejpeg (libjpeg-turbo), PNG and WebP through Pillow (WebP where Pillow was
built with it: ``available_media_types``). Where the answering stage owns a GPU, JPEG answers
are resized and encoded there instead (``encode_device``); PNG, WebP and masks come here.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import simplejpeg
from PIL import Image, features

MEDIA_TYPES = ("image/jpeg", "image/png", "image/webp")
PNG_LEVEL = 1  # zlib's fastest: a mask or a frame is encoded per request, not archived


@functools.lru_cache(maxsize=1)
def available_media_types() -> tuple[str, ...]:
    """The media types an answer can be encoded in here."""
    return tuple(m for m in MEDIA_TYPES if m != "image/webp" or features.check("webp"))


def _pil(img: np.ndarray) -> Image.Image:
    return Image.fromarray(img[..., 0] if img.ndim == 3 and img.shape[2] == 1 else img)


def encode_one(img: np.ndarray, media_type: str, quality: int = 90) -> bytes:
    """One uint8 image [H, W, C] (C 1 or 3) or mask [H, W] in ``media_type``."""
    if media_type == "image/jpeg":
        x = img if img.ndim == 3 else img[..., None]
        cs = "GRAY" if x.shape[2] == 1 else "RGB"
        return simplejpeg.encode_jpeg(np.ascontiguousarray(x), quality=quality, colorspace=cs)
    buf = io.BytesIO()
    if media_type == "image/png":
        _pil(img).save(buf, format="PNG", compress_level=PNG_LEVEL)
    elif media_type == "image/webp":
        _pil(img).save(buf, format="WEBP", quality=quality)
    else:
        raise ValueError(f"no encoder for {media_type}")
    return buf.getvalue()


def encode_many(
    pool: ThreadPoolExecutor | None,
    images: Sequence[np.ndarray],
    media_types: Sequence[str],
    qualities: Sequence[int],
) -> list[bytes]:
    """Every image encoded, on ``pool``'s threads (in this thread without one or for one)."""
    if pool is None or len(images) < 2:
        return [encode_one(*a) for a in zip(images, media_types, qualities, strict=True)]
    return list(pool.map(encode_one, images, media_types, qualities))
