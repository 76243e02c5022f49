"""Models of the tasks beyond classify, made here without downloads, and the numpy answers
some of them must give.

- ``filter_onnx``: a fixed image filter as ONNX (``onnx.helper``) -- a 3x3 blur per channel
  then a colour matrix with a bias -- whose exact answer ``filter_reference`` computes;
- ``unet``: a small U-Net (random weights) at 256x256, torch;
- ``fcn``: an FCN-style segmentation head (3x3 conv, batch norm, ReLU, 1x1 conv to the
  classes, bilinear upsampling to the input) on a ResNet-style backbone cut after its
  second stage, torch, random weights. On torchvision's own ``resnet18`` where torchvision
  imports; the CPU torch of the test environment has no torchvision build that imports, so
  otherwise on the same blocks written out (``_Backbone``: torchvision's BasicBlock layout);
- ``yolo_squares``: a YOLO-style head [N, 2 * 16, 4 + 1 + 2] over a 4x4 grid of 16-pixel
  cells of a 64x64 input: each cell whose mean is bright gets a box on exactly that cell
  (objectness ~1), classed red (0) or green (1) by its brighter channel; every cell is
  predicted twice (the second copy a little less sure), so NMS has duplicates to remove.
"""

from __future__ import annotations

import numpy as np

BLUR = np.array([[1, 2, 1], [2, 4, 2], [1, 2, 1]], np.float32) / 16
COLOUR = np.array([[0.9, 0.1, 0.0], [0.0, 0.8, 0.2], [0.1, 0.1, 0.7]], np.float32)
BIAS = np.array([0.05, -0.05, 0.1], np.float32)
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406])
IMAGENET_STD = np.array([0.229, 0.224, 0.225])


def filter_onnx(size: int = 64):
    """The filter as an ONNX model: x [N, 3, size, size] -> y, same shape."""
    from onnx import TensorProto, helper, numpy_helper

    w_blur = np.repeat(BLUR[None, None], 3, axis=0)  # [3, 1, 3, 3], one kernel a channel
    w_col = COLOUR[:, :, None, None]  # [3, 3, 1, 1]
    inits = [
        numpy_helper.from_array(w_blur, "w_blur"),
        numpy_helper.from_array(w_col, "w_col"),
        numpy_helper.from_array(BIAS, "b_col"),
    ]
    nodes = [
        helper.make_node(
            "Conv", ["x", "w_blur"], ["blur"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=3
        ),
        helper.make_node("Conv", ["blur", "w_col", "b_col"], ["y"], kernel_shape=[1, 1]),
    ]
    shape = ["N", 3, size, size]
    graph = helper.make_graph(
        nodes,
        "filter",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def filter_reference(img: np.ndarray) -> np.ndarray:
    """uint8 [H, W, 3] -> the filter's uint8 answer, in float64: normalised as Ferry
    normalises (ImageNet's mean/std), blurred (zero padding), colour-mixed, denormalised."""
    x = (img.astype(np.float64) / 255 - IMAGENET_MEAN) / IMAGENET_STD
    p = np.pad(x, ((1, 1), (1, 1), (0, 0)))
    h, w = img.shape[:2]
    blur = sum(BLUR[i, j] * p[i : i + h, j : j + w] for i in range(3) for j in range(3))
    y = blur @ COLOUR.T.astype(np.float64) + BIAS
    return np.clip(np.rint((y * IMAGENET_STD + IMAGENET_MEAN) * 255), 0, 255).astype(np.uint8)


def unet(seed: int = 0, width: int = 8):
    """A small U-Net: two downs, two ups with skips, 3 channels in and out (random)."""
    import torch
    from torch import nn

    def block(cin: int, cout: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU())

    class UNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            w = width
            self.d1, self.d2, self.mid = block(3, w), block(w, 2 * w), block(2 * w, 4 * w)
            self.u2, self.u1 = block(6 * w, 2 * w), block(3 * w, w)
            self.pool = nn.MaxPool2d(2)
            self.up = nn.Upsample(scale_factor=2, mode="nearest")
            self.out = nn.Conv2d(w, 3, 1)

        def forward(self, x):
            a = self.d1(x)
            b = self.d2(self.pool(a))
            m = self.mid(self.pool(b))
            b = self.u2(torch.cat([self.up(m), b], 1))
            a = self.u1(torch.cat([self.up(b), a], 1))
            return x + 0.1 * self.out(a)  # a residual filter: near its input

    torch.manual_seed(seed)
    return UNet().eval()


class _Blocks:
    """torchvision's ResNet BasicBlock and stem, written out (no torchvision needed)."""

    @staticmethod
    def basic(cin: int, cout: int, stride: int):
        from torch import nn

        class Basic(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
                self.bn1 = nn.BatchNorm2d(cout)
                self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
                self.bn2 = nn.BatchNorm2d(cout)
                self.down = (
                    nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                    if stride != 1 or cin != cout
                    else nn.Identity()
                )

            def forward(self, x):
                y = self.bn2(self.conv2(self.bn1(self.conv1(x)).relu()))
                return (y + self.down(x)).relu()

        return Basic()


def _backbone():
    """ResNet-18's stem and first two stages (stride 8, 128 channels)."""
    from torch import nn

    try:
        from torchvision.models import resnet18  # optional: torchvision

        r = resnet18(weights=None)
        return nn.Sequential(r.conv1, r.bn1, r.relu, r.maxpool, r.layer1, r.layer2), 128
    except Exception:  # not installed, or built for another torch (the CPU wheel)
        b = _Blocks.basic
        stem = [
            nn.Conv2d(3, 64, 7, 2, 3, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(),
            nn.MaxPool2d(3, 2, 1),
        ]
        layers = [b(64, 64, 1), b(64, 64, 1), b(64, 128, 2), b(128, 128, 1)]
        return nn.Sequential(*stem, *layers), 128


def fcn(classes: int = 5, seed: int = 0):
    """FCN-style segmentation: backbone, FCNHead, bilinear upsampling to the input."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    body, ch = _backbone()
    head = nn.Sequential(
        nn.Conv2d(ch, ch // 4, 3, padding=1, bias=False),
        nn.BatchNorm2d(ch // 4),
        nn.ReLU(),
        nn.Conv2d(ch // 4, classes, 1),
    )

    class FCN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.backbone, self.classifier = body, head

        def forward(self, x):
            y = self.classifier(self.backbone(x))
            return nn.functional.interpolate(
                y, size=x.shape[-2:], mode="bilinear", align_corners=False
            )

    m = FCN().eval()
    for mod in m.modules():  # batch norms' statistics randomised, as a trained net's are
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.2, 0.2)
            mod.running_var.uniform_(0.5, 2.0)
    return m


def yolo_squares(size: int = 64, cell: int = 16):
    """The YOLO-style head described above (input normalised with mean 0, std 1)."""
    import torch
    from torch import nn

    g = size // cell
    ys, xs = np.meshgrid(np.arange(g), np.arange(g), indexing="ij")
    centres = np.stack([(xs + 0.5) * cell, (ys + 0.5) * cell], -1).reshape(-1, 2)
    wh = np.full_like(centres, cell)
    boxes = torch.tensor(np.concatenate([centres, wh], 1), dtype=torch.float32)  # [g*g, 4]

    class Squares(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pool = nn.AvgPool2d(cell)
            self.register_buffer("boxes", boxes)

        def forward(self, x):
            m = self.pool(x).flatten(2).transpose(1, 2)  # [N, g*g, 3]: each cell's mean
            bright = m.mean(-1, keepdim=True)
            obj = torch.sigmoid(40 * (bright - 0.25))  # a square: ~1; black: ~0
            cls = torch.softmax(20 * torch.cat([m[..., :1], m[..., 1:2]], -1), -1)
            box = self.boxes.expand(x.shape[0], -1, -1)
            first = torch.cat([box, obj, cls], -1)
            second = torch.cat([box, obj * 0.9, cls], -1)  # the same box, less sure
            return torch.cat([first, second], 1)

    return Squares().eval()


def squares_image(cells: list[tuple[int, int, str]], size: int = 64, cell: int = 16):
    """A black image with a bright square filling each (row, column, colour) cell."""
    img = np.zeros((size, size, 3), np.uint8)
    for r, c, colour in cells:
        img[r * cell : (r + 1) * cell, c * cell : (c + 1) * cell] = (
            (255, 40, 40) if colour == "red" else (40, 255, 40)
        )
    return img
