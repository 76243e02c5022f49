"""The model registry: what each architecture takes as input, and how to load it.

Preprocessing is configured from ``ModelInfo`` (size, channels, layout, mean/std), so a
new model needs an entry here and a builder, nothing in the serving stages.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..engines.base import Engine
from ..engines.native import NativeEngine
from ..errors import InvalidInput
from ..graph import Graph
from ..imaging import Target
from . import digits, resnet50
from .weights import load_weights

logger = logging.getLogger(__name__)
DATA = os.path.join(os.path.dirname(__file__), "data")


@dataclass(frozen=True)
class ModelInfo:
    arch: str
    input_size: tuple[int, int]  # (height, width) the preprocessing resizes to
    channels: int  # 1: grayscale, 3: RGB
    mean: tuple[float, ...]  # on the [0, 1] scale; applied inside the graph
    std: tuple[float, ...]
    layout: str  # of the uint8 batch the graph takes
    num_classes: int
    labels_file: str | None
    default_weights: str | None  # None: seeded random weights
    builder: Callable[[dict[str, np.ndarray], str], Graph]
    random_state: Callable[[int], dict[str, np.ndarray]] | None = None
    fit: str = "stretch"  # how preprocessing fits an image: "stretch" or "center_crop"

    def target(self) -> Target:
        return Target(self.input_size[0], self.input_size[1], self.channels, self.fit)  # type: ignore[arg-type]


REGISTRY: dict[str, ModelInfo] = {
    "resnet50": ModelInfo(
        arch="resnet50",
        input_size=(224, 224),
        channels=3,
        mean=resnet50.MEAN,
        std=resnet50.STD,
        layout="nhwc",
        num_classes=1000,
        labels_file=os.path.join(DATA, "imagenet_classes.txt"),
        default_weights=None,
        builder=resnet50.build,
        random_state=resnet50.random_state_dict,
        fit="center_crop",
    ),
    "digits": ModelInfo(
        arch="digits",
        input_size=(8, 8),
        channels=1,
        mean=(0.0,),
        std=(1.0,),
        layout="nhwc",
        num_classes=10,
        labels_file=None,
        default_weights=digits.WEIGHTS,
        builder=digits.build,
    ),
}


@dataclass
class LoadedModel:
    name: str
    info: ModelInfo | None  # the built-in architecture, if it is one
    graph: Graph | None  # the native engine's graph (None for other engines)
    random_weights: bool
    source: str  # the weights file, or "random(seed=N)"
    engine: Engine | None = None  # built from ``graph`` (the native engine) when not given

    def __post_init__(self) -> None:
        if self.engine is None:
            if self.graph is None:
                raise ValueError(f"model {self.name!r} needs a graph or an engine")
            self.engine = NativeEngine(self.name, self.graph, ("logits",))


def model_info(arch: str) -> ModelInfo:
    try:
        return REGISTRY[arch]
    except KeyError:
        raise InvalidInput(
            "unknown model architecture", arch=arch, known=sorted(REGISTRY)
        ) from None


def load_model(name: str, arch: str, weights: str | None = None, seed: int = 0) -> LoadedModel:
    """Build ``arch``'s graph with weights from ``weights``, the default file, or a seed."""
    info = model_info(arch)
    path = weights or info.default_weights
    if path is not None:
        sd = load_weights(path)
        graph = info.builder(sd, name)
        return LoadedModel(name, info, graph, False, path)
    if info.random_state is None:
        raise InvalidInput("this model has no default weights; give a weights file", arch=arch)
    logger.warning(
        "model %s (%s): no weights given, using seeded RANDOM weights (seed=%d); answers are "
        "not meaningful. Convert real ones with `python -m pipeline.models.convert`.",
        name,
        arch,
        seed,
    )
    graph = info.builder(info.random_state(seed), name)
    return LoadedModel(name, info, graph, True, f"random(seed={seed})")


@functools.lru_cache(maxsize=8)
def labels(arch: str) -> tuple[str, ...]:
    """Class names of ``arch`` (digits are "0".."9"; ImageNet names from the data file)."""
    info = model_info(arch)
    if info.labels_file and os.path.exists(info.labels_file):
        with open(info.labels_file, encoding="utf-8") as f:
            names = tuple(ln.strip() for ln in f if ln.strip() and not ln.startswith("#"))
        if len(names) == info.num_classes:
            return names
        logger.warning(
            "%s has %d names, expected %d; using numbers",
            info.labels_file,
            len(names),
            info.num_classes,
        )
    return tuple(str(i) for i in range(info.num_classes))


def build_native(entry: Any, image: Any = None) -> LoadedModel:
    """The native engine's builder (``engines.ENGINES``): a built-in architecture by name,
    its weights from the entry's file or seeded random ones."""
    arch = getattr(entry, "source", None) or entry.arch
    return load_model(entry.name, arch, entry.weights, entry.seed)
