"""A small CNN for scikit-learn's bundled 8x8 digits (no network needed), trained by
``python -m pipeline.models.train_digits``; its weights are ``data/digits.npz``.

Input: uint8 [N, 8, 8, 1], ink bright (255 = the data set's 16). Architecture:
conv 3x3 (1->16) ReLU, conv 3x3 stride 2 (16->32) ReLU, flatten (h, w, c), linear 512->10.
"""

from __future__ import annotations

import os

import numpy as np

from ..graph import Graph
from ..ops import GEMM, NORMALIZE, RESHAPE
from .layers import conv

WEIGHTS = os.path.join(os.path.dirname(__file__), "data", "digits.npz")
SPLIT_SEED = 0
TEST_SIZE = 0.25


def load_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train images, train labels, test images, test labels) as uint8 [N, 8, 8, 1] images.

    The held-out split every test and the training script use (stratified, seed 0).
    """
    from sklearn.datasets import load_digits  # optional: scikit-learn
    from sklearn.model_selection import train_test_split  # optional: scikit-learn

    d = load_digits()
    images = to_uint8(d.images)
    xtr, xte, ytr, yte = train_test_split(
        images, d.target, test_size=TEST_SIZE, random_state=SPLIT_SEED, stratify=d.target
    )
    return xtr, ytr.astype(np.int64), xte, yte.astype(np.int64)


def to_uint8(images16: np.ndarray) -> np.ndarray:
    """The data set's 0..16 values as served images: uint8 [N, 8, 8, 1], 16 -> 255."""
    return np.round(np.asarray(images16, dtype=np.float64) * (255.0 / 16.0)).astype(np.uint8)[
        ..., None
    ]


def build(sd: dict[str, np.ndarray], name: str = "digits") -> Graph:
    g = Graph(name, "image", (8, 8, 1), "uint8")
    x = g.add(
        NORMALIZE, ["image"], "normalize", mean=(0.0,), std=(1.0,), layout="nhwc", dtype="@compute"
    )
    x = conv(g, x, "conv1", sd["conv1.weight"], sd["conv1.bias"], stride=1, padding=1)
    x = conv(g, x, "conv2", sd["conv2.weight"], sd["conv2.bias"], stride=2, padding=1)
    x = g.add(RESHAPE, [x], "flatten", shape=(-1, 4 * 4 * 32))
    fw = g.const("fc.w", np.ascontiguousarray(sd["fc.weight"].T))
    fb = g.const("fc.b", sd["fc.bias"].astype(np.float32), cast=False)
    logits = g.add(GEMM, [x, fw, fb], "fc", act="none")
    g.set_outputs(logits)
    return g
