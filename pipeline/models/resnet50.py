"""ResNet-50 v1.5 in torchvision's layout (stride on the 3x3 conv), NHWC, batch norm folded.

The graph takes uint8 images [N, 224, 224, 3] and returns logits [N, 1000] in the compute
dtype; normalization (ImageNet mean/std) is its first op, so only uint8 crosses PCIe.
Weights are a torchvision ``state_dict`` (as numpy arrays, e.g. from
``python -m pipeline.models.convert``); without one, seeded random weights are used.
"""

from __future__ import annotations

import numpy as np

from ..graph import Graph
from ..ops import GEMM, GLOBAL_AVG_POOL, MAXPOOL2D, NORMALIZE
from .layers import conv, fold_bn

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
LAYERS = (3, 4, 6, 3)
WIDTHS = (64, 128, 256, 512)
EXPANSION = 4
NUM_CLASSES = 1000


def block_names() -> list[tuple[str, int, int, int, bool]]:
    """(prefix, in_channels, width, stride, has_downsample) for every bottleneck."""
    out = []
    cin = 64
    for li, (n, w) in enumerate(zip(LAYERS, WIDTHS, strict=True)):
        for bi in range(n):
            stride = 2 if (bi == 0 and li > 0) else 1
            down = bi == 0 and (stride != 1 or cin != w * EXPANSION)
            out.append((f"layer{li + 1}.{bi}", cin, w, stride, down))
            cin = w * EXPANSION
    return out


def random_state_dict(seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random weights in torchvision's names: He-normal convs, unit batch norms.

    The last batch norm of every block gets gamma 0.2 so activations stay in fp16 range
    through 16 residual additions (torchvision's zero_init_residual idea, softened).
    """
    rng = np.random.default_rng(seed)
    sd: dict[str, np.ndarray] = {}

    def conv_w(name: str, cout: int, cin: int, k: int) -> None:
        sd[f"{name}.weight"] = (
            rng.standard_normal((cout, cin, k, k)) * np.sqrt(2.0 / (cout * k * k))
        ).astype(np.float32)

    def bn(name: str, c: int, gamma: float = 1.0) -> None:
        sd[f"{name}.weight"] = np.full(c, gamma, np.float32)
        sd[f"{name}.bias"] = np.zeros(c, np.float32)
        sd[f"{name}.running_mean"] = np.zeros(c, np.float32)
        sd[f"{name}.running_var"] = np.ones(c, np.float32)

    conv_w("conv1", 64, 3, 7)
    bn("bn1", 64)
    for prefix, cin, w, _stride, down in block_names():
        conv_w(f"{prefix}.conv1", w, cin, 1)
        bn(f"{prefix}.bn1", w)
        conv_w(f"{prefix}.conv2", w, w, 3)
        bn(f"{prefix}.bn2", w)
        conv_w(f"{prefix}.conv3", w * EXPANSION, w, 1)
        bn(f"{prefix}.bn3", w * EXPANSION, gamma=0.2)
        if down:
            conv_w(f"{prefix}.downsample.0", w * EXPANSION, cin, 1)
            bn(f"{prefix}.downsample.1", w * EXPANSION)
    bound = 1.0 / np.sqrt(2048)
    sd["fc.weight"] = rng.uniform(-bound, bound, (NUM_CLASSES, 2048)).astype(np.float32)
    sd["fc.bias"] = rng.uniform(-bound, bound, NUM_CLASSES).astype(np.float32)
    return sd


def _bn(sd: dict[str, np.ndarray], name: str) -> tuple[np.ndarray, ...]:
    return (
        sd[f"{name}.weight"],
        sd[f"{name}.bias"],
        sd[f"{name}.running_mean"],
        sd[f"{name}.running_var"],
    )


def build(sd: dict[str, np.ndarray], name: str = "resnet50", image_size: int = 224) -> Graph:
    """The inference graph from a torchvision-style state dict (batch norm folded here)."""
    missing = [k for k in ("conv1.weight", "bn1.weight", "fc.weight", "fc.bias") if k not in sd]
    if missing:
        raise KeyError(f"not a ResNet-50 state dict: missing {missing}")
    g = Graph(name, "image", (image_size, image_size, 3), "uint8")
    x = g.add(
        NORMALIZE, ["image"], "normalize", mean=MEAN, std=STD, layout="nhwc", dtype="@compute"
    )
    w, b = fold_bn(sd["conv1.weight"], None, *_bn(sd, "bn1"))
    x = conv(g, x, "conv1", w, b, stride=2, padding=3)
    x = g.add(MAXPOOL2D, [x], "maxpool", kernel=3, stride=2, padding=1)
    for prefix, _cin, _w, stride, down in block_names():
        identity = x
        w1, b1 = fold_bn(sd[f"{prefix}.conv1.weight"], None, *_bn(sd, f"{prefix}.bn1"))
        y = conv(g, x, f"{prefix}.conv1", w1, b1)
        w2, b2 = fold_bn(sd[f"{prefix}.conv2.weight"], None, *_bn(sd, f"{prefix}.bn2"))
        y = conv(g, y, f"{prefix}.conv2", w2, b2, stride=stride, padding=1)
        if down:
            wd, bd = fold_bn(
                sd[f"{prefix}.downsample.0.weight"], None, *_bn(sd, f"{prefix}.downsample.1")
            )
            identity = conv(g, x, f"{prefix}.downsample", wd, bd, stride=stride, act="none")
        w3, b3 = fold_bn(sd[f"{prefix}.conv3.weight"], None, *_bn(sd, f"{prefix}.bn3"))
        x = conv(g, y, f"{prefix}.conv3", w3, b3, act="relu", residual=identity)
    x = g.add(GLOBAL_AVG_POOL, [x], "avgpool")
    fw = g.const("fc.w", np.ascontiguousarray(sd["fc.weight"].T))
    fb = g.const("fc.b", sd["fc.bias"].astype(np.float32), cast=False)
    logits = g.add(GEMM, [x, fw, fb], "fc", act="none")
    g.set_outputs(logits)
    return g
