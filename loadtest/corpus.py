"""Image corpora from scikit-image's bundled photos (no network: they ship with it).

* ``build``: JPEGs and PNGs of several sizes on disk for the locust users,
  ``<photo>_<width>.jpg|png`` and an ``index.json`` listing each with its media type and size.
* ``corpus(name)``: the JPEG bodies a benchmark cycles through, in memory. ``chelsea`` is one
  small photo (451x300, quality 90); ``photos`` is 16 distinct real photos from 640x480 to
  1920x1080, quality 85 (each photo cropped to the size's aspect ratio, then scaled).

    python -m loadtest.corpus [--out loadtest/corpus]
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass

import numpy as np

PHOTOS = ("chelsea", "astronaut", "coffee", "rocket", "hubble_deep_field", "immunohistochemistry")
WIDTHS = (128, 320, 640, 1024)


def build(
    out: str, widths: tuple[int, ...] = WIDTHS, photos: tuple[str, ...] = PHOTOS
) -> list[dict]:
    import skimage.data
    from PIL import Image

    from pipeline.imaging import encode_jpeg, encode_png

    os.makedirs(out, exist_ok=True)
    index = []
    for name in photos:
        img = np.ascontiguousarray(getattr(skimage.data, name)()[..., :3])
        for w in widths:
            h = max(1, round(img.shape[0] * w / img.shape[1]))
            small = np.asarray(Image.fromarray(img).resize((w, h), Image.BILINEAR))
            for ext, data, ct in (
                ("jpg", encode_jpeg(small, 90), "image/jpeg"),
                ("png", encode_png(small), "image/png"),
            ):
                fname = f"{name}_{w}.{ext}"
                with open(os.path.join(out, fname), "wb") as f:
                    f.write(data)
                index.append(
                    {"file": fname, "content_type": ct, "bytes": len(data), "width": w, "height": h}
                )
    with open(os.path.join(out, "index.json"), "w") as f:
        json.dump(index, f, indent=1)
    return index


# photos (RGB; camera is grey) and the sizes of the photos corpus, 640x480 to 1920x1080
PHOTO_SOURCES = (
    "astronaut",
    "chelsea",
    "coffee",
    "rocket",
    "hubble_deep_field",
    "immunohistochemistry",
    "retina",
    "camera",
)
PHOTO_SIZES = (
    (640, 480),
    (1920, 1080),
    (800, 600),
    (1280, 720),
    (1024, 768),
    (1600, 900),
    (960, 720),
    (1440, 1080),
    (1280, 960),
    (720, 540),
)


@dataclass(frozen=True)
class Corpus:
    """JPEG bodies a load generator cycles through, and what they are."""

    name: str
    bodies: tuple[bytes, ...]
    sizes: tuple[tuple[int, int], ...]  # (width, height) of each body
    description: str

    @property
    def mean_bytes(self) -> int:
        return round(sum(len(b) for b in self.bodies) / len(self.bodies))


def _photo(name: str) -> np.ndarray:
    import skimage.data

    img = np.asarray(getattr(skimage.data, name)())
    if img.ndim == 2:
        img = np.stack([img] * 3, axis=-1)
    return np.ascontiguousarray(img[..., :3])


def fit(img: np.ndarray, width: int, height: int, where: float = 0.5) -> np.ndarray:
    """``img`` cropped to ``width:height`` (the crop's offset at ``where`` of the spare
    length, 0 the top or left, 1 the bottom or right) and scaled to ``width`` x ``height``."""
    from PIL import Image

    h, w = img.shape[:2]
    if w * height > h * width:  # too wide: crop the sides
        cw, ch = round(h * width / height), h
    else:
        cw, ch = w, round(w * height / width)
    x, y = round((w - cw) * where), round((h - ch) * where)
    crop = Image.fromarray(np.ascontiguousarray(img[y : y + ch, x : x + cw]))
    return np.asarray(crop.resize((width, height), Image.LANCZOS))


def photos(n: int = 16, quality: int = 85) -> Corpus:
    """``n`` distinct JPEGs of real photos, 640x480 to 1920x1080: photo ``i % 8`` at size
    ``i % 10``, its crop moved on each pass over the photos so no two images are alike."""
    from pipeline.imaging import encode_jpeg

    bodies, sizes = [], []
    for i in range(n):
        w, h = PHOTO_SIZES[i % len(PHOTO_SIZES)]
        where = (0.5, 0.0, 1.0, 0.25, 0.75)[(i // len(PHOTO_SOURCES)) % 5]
        img = fit(_photo(PHOTO_SOURCES[i % len(PHOTO_SOURCES)]), w, h, where)
        bodies.append(encode_jpeg(img, quality))
        sizes.append((w, h))
    mean = sum(len(b) for b in bodies) / n / 1e3
    return Corpus(
        "photos",
        tuple(bodies),
        tuple(sizes),
        f"{n} scikit-image photos ({', '.join(PHOTO_SOURCES)}) cropped and scaled to "
        f"640x480..1920x1080, JPEG quality {quality}, mean {mean:.0f} KB, cycled per request",
    )


def chelsea(quality: int = 90) -> Corpus:
    from pipeline.imaging import encode_jpeg

    body = encode_jpeg(_photo("chelsea"), quality)
    return Corpus(
        "chelsea",
        (body,),
        ((451, 300),),
        f"scikit-image chelsea, 451x300, JPEG quality {quality}, {len(body)} bytes",
    )


CORPORA = {"chelsea": chelsea, "photos": photos}


def corpus(name: str) -> Corpus:
    """The corpus called ``name`` (``chelsea`` or ``photos``)."""
    if name not in CORPORA:
        raise ValueError(f"unknown corpus {name!r}; known: {', '.join(CORPORA)}")
    return CORPORA[name]()


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "corpus"))
    args = ap.parse_args()
    index = build(args.out)
    print(f"{len(index)} images, {sum(i['bytes'] for i in index) / 1e6:.1f} MB in {args.out}")


if __name__ == "__main__":
    main()
