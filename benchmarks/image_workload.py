"""The ``image`` workload of ``bench_e2e.py`` (issue 33): a 256x256 U-Net applied to 1280x720
JPEG frames, each answered as a JPEG at the frame's own size.

* ``frames()``: the corpus ``frames720``, 16 distinct 1280x720 JPEGs of scikit-image's real
  photos (no network: they ship with it), each photo cropped to 16:9 at its own place and
  scaled, JPEG quality 85 -- the ``photos`` corpus's photos and method, at one frame size;
* ``export_unet()``: the benchmark's model, written before any system starts: the U-Net of
  ``tests/models/tasks.py`` (two downs, two ups with skips, a residual filter) at width 32
  -- 4.3 GMAC a frame, about ResNet-50's 4.1, so the GPU has real work beside decoding and
  encoding -- with seeded random weights, as a ``torch.export`` archive with a dynamic
  batch. Ferry's config (``configs/ferry_e2e_image.yaml``) serves that file with its torch
  engine, and the peer (``peers/rayserve_image.py``) loads its weights from the same file.

    python benchmarks/image_workload.py [--out /tmp/ferry-unet/unet256.pt2] [--width 32]

Both systems get the same bytes over HTTP (``Content-Type: image/jpeg``, ``Accept:
image/jpeg``) and must answer a JPEG of the input's size at quality 90; the load generator
counts an answer as OK only when its JPEG header says so (``loadgen.jpeg_size``).
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from loadtest.corpus import PHOTO_SOURCES, Corpus, _photo, fit  # noqa: E402
from pipeline.imaging import encode_jpeg  # noqa: E402
from tests.models.tasks import unet  # noqa: E402 (torch only when called)

FRAME_W, FRAME_H = 1280, 720
CORPUS = "frames720"
UNET_PATH = "/tmp/ferry-unet/unet256.pt2"
"""Where the setup step writes the model; ``configs/ferry_e2e_image.yaml`` names it."""
UNET_SIZE = 256
UNET_WIDTH = 32
UNET_SEED = 0
QUALITY = 90
"""The answers' JPEG quality: Ferry's default, and the peer's."""
MODEL = "unet"
"""The model's name in Ferry's config: its route is ``/v1/models/unet/image``."""
FERRY_PATH = f"/v1/models/{MODEL}/image?size=input&quality={QUALITY}"
PEER_PATH = "/image"
# where in each photo's spare length the 16:9 crop sits, a pass over the photos each
WHERE = (0.5, 0.0, 1.0, 0.25, 0.75)


def frames(n: int = 16, quality: int = 85) -> Corpus:
    """``n`` distinct 1280x720 JPEGs: photo ``i % 8`` of ``PHOTO_SOURCES``, cropped to 16:9
    at ``WHERE[i // 8]`` of its spare height (or width) and scaled to 1280x720."""
    bodies = []
    for i in range(n):
        where = WHERE[(i // len(PHOTO_SOURCES)) % len(WHERE)]
        img = fit(_photo(PHOTO_SOURCES[i % len(PHOTO_SOURCES)]), FRAME_W, FRAME_H, where)
        bodies.append(encode_jpeg(img, quality))
    mean = sum(len(b) for b in bodies) / n / 1e3
    return Corpus(
        CORPUS,
        tuple(bodies),
        ((FRAME_W, FRAME_H),) * n,
        f"{n} scikit-image photos ({', '.join(PHOTO_SOURCES)}) cropped to 16:9 and scaled to "
        f"{FRAME_W}x{FRAME_H}, JPEG quality {quality}, mean {mean:.0f} KB, cycled per request",
    )


def unet_macs(width: int = UNET_WIDTH, size: int = UNET_SIZE) -> int:
    """Multiply-adds of one frame through ``tests.models.tasks.unet`` at ``width``."""
    s2, s4 = (size // 2) ** 2, (size // 4) ** 2
    convs = (
        size * size * 9 * 3 * width  # d1: 3 -> w
        + s2 * 9 * width * 2 * width  # d2: w -> 2w at half size
        + s4 * 9 * 2 * width * 4 * width  # mid: 2w -> 4w at a quarter
        + s2 * 9 * 6 * width * 2 * width  # u2: 4w + 2w -> 2w
        + size * size * 9 * 3 * width * width  # u1: 2w + w -> w
        + size * size * width * 3  # out: w -> 3, 1x1
    )
    return convs


def describe(width: int = UNET_WIDTH, seed: int = UNET_SEED) -> str:
    """The model as the rows' run notes name it."""
    return (
        f"U-Net {UNET_SIZE}x{UNET_SIZE} (tests/models/tasks.py, width {width}, seed {seed}, "
        f"random weights, {unet_macs(width) / 1e9:.1f} GMAC a frame), answers JPEG quality "
        f"{QUALITY} at the input's size"
    )


def export_unet(path: str = UNET_PATH, width: int = UNET_WIDTH, seed: int = UNET_SEED) -> str:
    """Write the U-Net as a ``torch.export`` archive with a dynamic batch (what Ferry's torch
    engine needs of a ``.pt2``), atomically, and return ``path``. Seconds on a CPU."""
    import torch  # optional: torch

    model = unet(seed=seed, width=width)
    batch = torch.export.Dim("batch", min=1, max=4096)
    x = torch.zeros(2, 3, UNET_SIZE, UNET_SIZE)
    program = torch.export.export(model, (x,), dynamic_shapes=({0: batch},))
    folder, name = os.path.split(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{os.getpid()}.{name}")  # torch wants the .pt2 ending
    torch.export.save(program, tmp)
    os.replace(tmp, path)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", default=UNET_PATH)
    ap.add_argument("--width", type=int, default=UNET_WIDTH)
    ap.add_argument("--seed", type=int, default=UNET_SEED)
    args = ap.parse_args(argv)
    path = export_unet(args.out, args.width, args.seed)
    print(f"{path}: {describe(args.width, args.seed)}, {os.path.getsize(path) / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
