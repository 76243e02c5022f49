"""Build a corpus of JPEGs and PNGs of several sizes from scikit-image's bundled photos.

    python -m loadtest.corpus [--out loadtest/corpus]

No network: the photos ship with scikit-image. Writes ``<photo>_<width>.jpg|png`` and an
``index.json`` listing every file with its media type and size.
"""

from __future__ import annotations

import argparse
import json
import os

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
