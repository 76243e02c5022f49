"""A torchvision classifier exported to ONNX at a chosen input size, with a dynamic batch:
a model heavy enough that the GPU, not the CPU in front of it, is what a load saturates.

    python benchmarks/export_onnx.py --arch resnet50 --size 768 --out /tmp/ferry-heavy/resnet50_768.onnx

ResNet-50 at 768x768 costs (768/224)^2 = 11.8 times its 224x224 work, so on one H200 it
runs about 1,400 images a second where the 224 form runs 17,000 (RESULTS.md) and is fed by
a few locust processes. Random weights (torchvision's initialisation): a load, not answers.
Needs torch, torchvision and onnx (the GPU machine has them). ``benchmarks/configs/
overload_gpu.yaml`` serves the default output.
"""

from __future__ import annotations

import argparse
import os
import sys


def export(arch: str, size: int, out: str) -> str:
    import torch
    import torchvision

    torch.manual_seed(0)
    model = getattr(torchvision.models, arch)(weights=None).eval()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    torch.onnx.export(
        model,
        (torch.zeros(1, 3, size, size),),
        out,
        input_names=["x"],
        output_names=["logits"],
        dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}},
        opset_version=17,
        dynamo=False,
    )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--arch", default="resnet50", help="a torchvision.models classifier")
    ap.add_argument("--size", type=int, default=768, help="input height and width")
    ap.add_argument("--out", default="/tmp/ferry-heavy/resnet50_768.onnx")
    args = ap.parse_args(argv)
    path = export(args.arch, args.size, args.out)
    print(f"{path}: {os.path.getsize(path) / 2**20:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
