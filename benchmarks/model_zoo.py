"""The 13 torchvision classifiers of the model benchmark and the GPU tests, with random weights
and randomised batch-norm statistics, and the photos they are compared on.

Weights are torchvision's own random initialisation (seeded). Batch-norm statistics are
first measured on noise images (train mode, cumulative average), so activations stay in
range through deep nets, then perturbed per channel (mean shifted, variance scaled by
0.5..2, affine weights around 1): no batch norm is the identity, so freezing and folding are
exercised. Preprocessing is Ferry's own CPU path (decode, 224 centre crop), so every system
sees the same uint8 pixels.
"""

from __future__ import annotations

from typing import Any

import numpy as np

MODELS = (
    "resnet18",
    "resnet50",
    "resnext50_32x4d",
    "wide_resnet50_2",
    "mobilenet_v2",
    "mobilenet_v3_large",
    "efficientnet_b0",
    "regnet_y_400mf",
    "densenet121",
    "shufflenet_v2_x1_0",
    "squeezenet1_1",
    "vgg16_bn",
    "convnext_tiny",
)
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def make(name: str, seed: int = 0, device: str = "cpu") -> Any:
    """torchvision's ``name`` in eval mode, fp32, random weights and batch-norm statistics."""
    import torch
    import torchvision

    torch.manual_seed(seed)
    m = torchvision.models.get_model(name, weights=None).to(device)
    bns = [x for x in m.modules() if isinstance(x, torch.nn.modules.batchnorm._BatchNorm)]
    g = torch.Generator(device="cpu").manual_seed(seed + 1)
    with torch.no_grad():
        if bns:
            for bn in bns:
                bn.reset_running_stats()
                bn.momentum = None  # cumulative average over the calibration batches
            m.train()
            for _ in range(2):
                m(torch.randn(8, 3, 224, 224, generator=g).to(device))

        def u(c: int, lo: float, hi: float) -> Any:
            return (torch.rand(c, generator=g) * (hi - lo) + lo).to(device)

        for bn in bns:
            c = bn.num_features
            bn.running_var.mul_(u(c, 0.5, 2.0))
            bn.running_mean.add_(u(c, -0.2, 0.2) * bn.running_var.sqrt())
            if bn.affine:
                bn.weight.mul_(u(c, 0.8, 1.2))
                bn.bias.add_(u(c, -0.1, 0.1))
    return m.eval()


def photo_pixels(n: int = 20) -> np.ndarray:
    """``n`` real photos (loadtest.corpus.photos: scikit-image's, 640x480..1920x1080 JPEGs)
    through Ferry's CPU image path: uint8 [n, 224, 224, 3]."""
    from loadtest.corpus import photos
    from pipeline.imaging import Target, decode

    t = Target(224, 224, 3, "center_crop")
    return np.stack([decode(b, "image/jpeg", t, 40_000_000) for b in photos(n).bodies])


def photo_jpegs(n: int = 20) -> tuple[bytes, ...]:
    from loadtest.corpus import photos

    return photos(n).bodies


def normalised(u8: np.ndarray) -> np.ndarray:
    """uint8 [n, H, W, 3] -> float32 [n, 3, H, W], ImageNet mean/std (what v2 clients send)."""
    x = u8.transpose(0, 3, 1, 2).astype(np.float32) / 255
    return (x - np.array(MEAN, np.float32)[:, None, None]) / np.array(STD, np.float32)[
        :, None, None
    ]


def reference_top1(model: Any, u8: np.ndarray, device: str = "cuda") -> np.ndarray:
    """torch fp32 top-1 of each photo."""
    import torch

    with torch.inference_mode():
        x = torch.from_numpy(normalised(u8)).to(device)
        return model.float().to(device)(x).argmax(1).cpu().numpy()
