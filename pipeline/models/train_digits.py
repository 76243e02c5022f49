"""Train the digits CNN on scikit-learn's bundled data set with plain numpy (no network).

    python -m pipeline.models.train_digits [--epochs 40] [--out pipeline/models/data/digits.npz]

Forward and backward by im2col in NHWC (the layout Ferry serves in), AdamW, one-pixel shifts as augmentation, seed 0. Prints
the held-out accuracy; the committed weights reached it with the defaults.
"""

from __future__ import annotations

import argparse
import logging
import time

import numpy as np

from .digits import WEIGHTS, load_split

logger = logging.getLogger(__name__)


def im2col(x: np.ndarray, k: int, s: int, p: int) -> tuple[np.ndarray, int, int]:
    n, h, w, c = x.shape
    xp = np.pad(x, ((0, 0), (p, p), (p, p), (0, 0)))
    oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    cols = np.empty((n, oh, ow, k, k, c), dtype=x.dtype)
    for i in range(k):
        for j in range(k):
            cols[:, :, :, i, j, :] = xp[:, i : i + s * oh : s, j : j + s * ow : s, :]
    return cols.reshape(n * oh * ow, k * k * c), oh, ow


def col2im(
    dcols: np.ndarray, shape: tuple[int, ...], k: int, s: int, p: int, oh: int, ow: int
) -> np.ndarray:
    n, h, w, c = shape
    dxp = np.zeros((n, h + 2 * p, w + 2 * p, c), dtype=dcols.dtype)
    d = dcols.reshape(n, oh, ow, k, k, c)
    for i in range(k):
        for j in range(k):
            dxp[:, i : i + s * oh : s, j : j + s * ow : s, :] += d[:, :, :, i, j, :]
    return dxp[:, p : p + h, p : p + w, :]


class Net:
    """conv(1->16, 3x3) relu, conv(16->32, 3x3, s2) relu, linear(512->10); NHWC."""

    def __init__(self, rng: np.random.Generator) -> None:
        def he(*shape: int) -> np.ndarray:
            fan_in = int(np.prod(shape[1:]))
            return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)

        # conv weights kept as [k*k*cin, cout] in (kh, kw, c) order while training
        self.p = {
            "w1": he(16, 9).T.copy(),
            "b1": np.zeros(16, np.float32),
            "w2": he(32, 144).T.copy(),
            "b2": np.zeros(32, np.float32),
            "wf": he(10, 512).T.copy(),
            "bf": np.zeros(10, np.float32),
        }

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, dict]:
        p = self.p
        c1, oh1, ow1 = im2col(x, 3, 1, 1)
        z1 = c1 @ p["w1"] + p["b1"]
        a1 = np.maximum(z1, 0).reshape(x.shape[0], oh1, ow1, 16)
        c2, oh2, ow2 = im2col(a1, 3, 2, 1)
        z2 = c2 @ p["w2"] + p["b2"]
        a2 = np.maximum(z2, 0).reshape(x.shape[0], -1)
        logits = a2 @ p["wf"] + p["bf"]
        return logits, {
            "x": x,
            "c1": c1,
            "z1": z1,
            "a1": a1,
            "c2": c2,
            "z2": z2,
            "a2": a2,
            "s1": (oh1, ow1),
            "s2": (oh2, ow2),
        }

    def backward(self, dlogits: np.ndarray, cache: dict) -> dict[str, np.ndarray]:
        p = self.p
        n = dlogits.shape[0]
        g = {"wf": cache["a2"].T @ dlogits, "bf": dlogits.sum(0)}
        da2 = dlogits @ p["wf"].T
        dz2 = da2.reshape(cache["z2"].shape) * (cache["z2"] > 0)
        g["w2"] = cache["c2"].T @ dz2
        g["b2"] = dz2.sum(0)
        dc2 = dz2 @ p["w2"].T
        da1 = col2im(dc2, cache["a1"].shape, 3, 2, 1, *cache["s2"])
        dz1 = da1.reshape(cache["z1"].shape) * (cache["z1"] > 0)
        g["w1"] = cache["c1"].T @ dz1
        g["b1"] = dz1.sum(0)
        return {k: v / n for k, v in g.items()}

    def state_dict(self) -> dict[str, np.ndarray]:
        """torch-style names and layouts ([Cout, Cin, KH, KW], fc [out, in])."""
        p = self.p
        return {
            "conv1.weight": p["w1"].T.reshape(16, 3, 3, 1).transpose(0, 3, 1, 2).copy(),
            "conv1.bias": p["b1"].copy(),
            "conv2.weight": p["w2"].T.reshape(32, 3, 3, 16).transpose(0, 3, 1, 2).copy(),
            "conv2.bias": p["b2"].copy(),
            "fc.weight": p["wf"].T.copy(),
            "fc.bias": p["bf"].copy(),
        }


def softmax_xent(logits: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
    z = logits - logits.max(1, keepdims=True)
    e = np.exp(z)
    prob = e / e.sum(1, keepdims=True)
    loss = -np.log(prob[np.arange(len(y)), y] + 1e-12).mean()
    prob[np.arange(len(y)), y] -= 1
    return float(loss), prob


def shift_augment(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Each image moved by up to one pixel in each direction (zeros shifted in)."""
    out = np.zeros_like(x)
    for i, (dy, dx) in enumerate(rng.integers(-1, 2, size=(len(x), 2))):
        ys, yd = (slice(0, 8 - dy), slice(dy, 8)) if dy >= 0 else (slice(-dy, 8), slice(0, 8 + dy))
        xs, xd = (slice(0, 8 - dx), slice(dx, 8)) if dx >= 0 else (slice(-dx, 8), slice(0, 8 + dx))
        out[i, yd, xd] = x[i, ys, xs]
    return out


def train(
    epochs: int = 40, batch: int = 64, lr: float = 3e-3, seed: int = 0, weight_decay: float = 1e-4
) -> tuple[Net, float]:
    xtr, ytr, xte, yte = load_split()
    xtr = xtr.astype(np.float32) / 255.0
    xte = xte.astype(np.float32) / 255.0
    rng = np.random.default_rng(seed)
    net = Net(rng)
    m = {k: np.zeros_like(v) for k, v in net.p.items()}
    v = {k: np.zeros_like(v) for k, v in net.p.items()}
    b1, b2, t = 0.9, 0.999, 0
    for ep in range(epochs):
        order = rng.permutation(len(xtr))
        total = 0.0
        for i in range(0, len(order), batch):
            idx = order[i : i + batch]
            logits, cache = net.forward(shift_augment(xtr[idx], rng))
            loss, dl = softmax_xent(logits, ytr[idx])
            total += loss * len(idx)
            grads = net.backward(dl, cache)
            t += 1
            for k, gk in grads.items():
                m[k] = b1 * m[k] + (1 - b1) * gk
                v[k] = b2 * v[k] + (1 - b2) * gk * gk
                mh = m[k] / (1 - b1**t)
                vh = v[k] / (1 - b2**t)
                net.p[k] -= (lr * (mh / (np.sqrt(vh) + 1e-8) + weight_decay * net.p[k])).astype(
                    np.float32
                )
        acc = float((net.forward(xte)[0].argmax(1) == yte).mean())
        logger.info(
            "epoch %d/%d loss %.4f held-out accuracy %.4f", ep + 1, epochs, total / len(xtr), acc
        )
    return net, acc


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=WEIGHTS)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    t0 = time.time()
    net, acc = train(args.epochs, seed=args.seed)
    np.savez_compressed(args.out, **net.state_dict())
    logger.info(
        "held-out accuracy %.4f in %.1f s; weights written to %s", acc, time.time() - t0, args.out
    )


if __name__ == "__main__":
    main()
