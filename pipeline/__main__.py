"""Ferry's command line.

    python -m pipeline classify IMAGE [--model resnet50|digits] [--weights FILE] [--top-k 5] [--json]
    python -m pipeline classify IMAGE --model-file FILE [--engine torch|onnx] [--labels FILE]
    python -m pipeline models

``classify`` runs one image through decoding, the model's preprocessing and the executor
(the GPU when there is one, numpy otherwise) and prints the top classes; ``--model-file``
serves your own model file exactly as a repository entry ``{engine, source}`` would
(``--engine`` defaults to ``onnx`` for ``.onnx`` files, ``torch`` otherwise).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

import numpy as np

from .config import ExecutorConfig, ModelConfig
from .errors import FerryError
from .executor import GpuExecutor
from .imaging import decode
from .models.registry import REGISTRY
from .models.repository import model_card, random_weights
from .ops import SOFTMAX, TOPK
from .ops.base import eager


def _entry(args: argparse.Namespace):

    if args.model_file:
        engine = args.engine or ("onnx" if args.model_file.endswith(".onnx") else "torch")
        return ModelConfig(
            name="model",
            engine=engine,
            source=args.model_file,
            weights=args.weights,
            labels=args.labels,
        )
    return ModelConfig(
        name=args.model, source=args.model, weights=args.weights, seed=args.seed, labels=args.labels
    )


def _classify(args: argparse.Namespace) -> int:

    try:
        entry = _entry(args)
    except ValueError as exc:  # pydantic's: the entry's own message
        print(f"error: {exc}", file=sys.stderr)
        return 2
    card = model_card(entry)
    with open(args.image, "rb") as f:
        data = f.read()
    t0 = time.perf_counter()
    img = decode(data, None, card.target(), max_pixels=40_000_000)
    t1 = time.perf_counter()
    ex = GpuExecutor(ExecutorConfig(backend=args.backend, buckets=(1,), pool_limit_fraction=0.25))
    try:
        ex.load_entry(entry)
        out = ex.infer(entry.name, img[None])
        t2 = time.perf_counter()
    finally:
        ex.close()
    logits = out[0] if isinstance(out, tuple) else out
    probs = eager(SOFTMAX, logits.astype(np.float32))[0]
    vals, idx = eager(TOPK, probs, k=min(args.top_k, probs.shape[-1]))
    top = [
        {"class": int(i), "label": card.label(int(i)), "score": round(float(v), 6)}
        for v, i in zip(vals[0], idx[0], strict=True)
    ]
    if args.json:
        print(json.dumps({"top_k": top}))
        return 0
    print(
        json.dumps(
            {
                "model": entry.name,
                "engine": entry.engine,
                "random_weights": random_weights(entry),
                "backend": ex.backend.name,
                "top_k": top,
                "timings_ms": {
                    "decode": round((t1 - t0) * 1e3, 2),
                    "inference": round((t2 - t1) * 1e3, 2),
                },
            },
            indent=2,
        )
    )
    return 0


def _models(_args: argparse.Namespace) -> int:

    for name, info in REGISTRY.items():
        print(
            f"{name}: input {info.input_size[0]}x{info.input_size[1]}x{info.channels} ({info.fit}), "
            f"{info.num_classes} classes, weights: {info.default_weights or 'random unless given'}"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m pipeline",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("classify", help="classify one image file")
    c.add_argument("image")
    c.add_argument("--model", default="resnet50", help="a built-in model (native engine)")
    c.add_argument(
        "--model-file",
        default=None,
        help="your own model: a TorchScript file, a torch.export .pt2, an .onnx file, or "
        "module:function",
    )
    c.add_argument("--engine", default=None, choices=["torch", "onnx", "native"])
    c.add_argument("--labels", default=None, help="a text file, one label a line")
    c.add_argument(
        "--weights",
        default=None,
        help="built-ins: .npz or .safetensors; torch with a torchvision name: a state dict",
    )
    c.add_argument("--json", action="store_true", help='print only {"top_k": [...]}')
    c.add_argument("--seed", type=int, default=0, help="seed of random weights when none are given")
    c.add_argument("--top-k", type=int, default=5)
    c.add_argument("--backend", default="auto", choices=["auto", "cupy", "numpy"])
    c.set_defaults(fn=_classify)
    m = sub.add_parser("models", help="list the models Ferry knows")
    m.set_defaults(fn=_models)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.fn(args)
    except Exception as exc:  # a CLI answers with a message, not a trace

        if isinstance(exc, FerryError):
            print(f"error: {exc}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
