"""Convert a torchvision ``state_dict`` file into Ferry's weight file (``.npz`` or ``.safetensors``).

    python -m pipeline.models.convert resnet50 resnet50-0676ba61.pth weights/resnet50.npz

The input may be a ``.pth``/``.pt`` file (read with ``torch.load(weights_only=True)``, so
it needs torch and never unpickles arbitrary objects) or an ``.npz``/``.safetensors`` file
with the same names. The output keeps torchvision's names and layouts, unfused, as float32;
batch norm is folded when the model is loaded. The result is checked by building the
model's graph from it.
"""

from __future__ import annotations

import argparse
import logging
import sys

import numpy as np

from .registry import model_info
from .weights import load_weights, save_weights

logger = logging.getLogger(__name__)


def read_state_dict(path: str) -> dict[str, np.ndarray]:
    if path.endswith((".pth", ".pt")):
        import torch  # optional: torch

        sd = torch.load(path, map_location="cpu", weights_only=True)
        if isinstance(sd, dict) and "state_dict" in sd:
            sd = sd["state_dict"]
        return {
            k: v.detach().float().numpy() if v.is_floating_point() else v.numpy()
            for k, v in sd.items()
        }
    return load_weights(path)


def convert(arch: str, src: str, dst: str) -> dict[str, np.ndarray]:
    info = model_info(arch)
    sd = read_state_dict(src)
    sd = {
        k: np.ascontiguousarray(v, dtype=np.float32)
        for k, v in sd.items()
        if not k.endswith("num_batches_tracked")
    }
    info.builder(sd, arch)  # raises if names or shapes do not fit the architecture
    save_weights(dst, sd)
    return sd


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("arch", help="architecture, e.g. resnet50")
    ap.add_argument("src", help=".pth/.pt/.npz/.safetensors state dict")
    ap.add_argument("dst", help="output .npz or .safetensors")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sd = convert(args.arch, args.src, args.dst)
    n = sum(v.size for v in sd.values())
    logger.info("wrote %s: %d tensors, %.1f M parameters", args.dst, len(sd), n / 1e6)
    return 0


if __name__ == "__main__":
    sys.exit(main())
