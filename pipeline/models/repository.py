"""The model repository: config entries (``ModelConfig``) resolved into what every stage needs.

    card = model_card(entry)      # image input, labels: no model loaded, no device
    loaded = load_entry(entry)    # the engine, built by the entry's engine, checked

A card is what the ingress, the preprocessing and the postprocessing know of a model without
loading it: how its images are prepared (size, channels, layout, mean/std, resize mode) and
its labels. Fields the entry leaves out come from the model file where it declares them
(the engine module's ``declared_input(entry)``, e.g. a ``torch.export`` archive's input
shape), then from the built-in architecture, then from torchvision's conventions.
``load_entry`` builds the engine and checks the loaded model against the card: input shape
and channels, labels against the number of classes. Every mismatch is an ``InvalidInput``
naming the model and the values, raised at startup.
"""

from __future__ import annotations

import functools
import importlib
import logging
from dataclasses import dataclass, replace
from typing import Any

from ..config import MODEL_FILE_SUFFIXES, ModelConfig
from ..engines import ENGINES, builder
from ..engines.base import ImageInput
from ..engines.epilogue import with_epilogue
from ..errors import InvalidInput
from ..imaging import Target
from ..tasks.spec import labelled_classes, resolve_task
from . import registry

logger = logging.getLogger(__name__)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
TORCHVISION_INPUT = ImageInput(224, 224, 3, IMAGENET_MEAN, IMAGENET_STD, "nchw", "crop")
_FITS = {"crop": "center_crop", "stretch": "stretch", "fit": "letterbox"}
PIXEL_TASKS = ("image", "segment", "detect")  # their models' images are stretched by default


def read_labels(path: str) -> tuple[str, ...]:
    """One label a line (blank lines and ``#`` comments skipped); ``ValueError`` if none."""
    try:
        with open(path, encoding="utf-8") as f:
            names = tuple(ln.strip() for ln in f if ln.strip() and not ln.startswith("#"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"labels file {path} cannot be read: {exc}") from None
    if not names:
        raise ValueError(f"labels file {path} has no labels")
    return names


@dataclass(frozen=True)
class ModelCard:
    """What the stages know of a model without loading it."""

    name: str
    engine: str
    image: ImageInput
    input_dtype: str  # of the model's own input tensor
    labels: tuple[str, ...] | None  # None: class numbers as labels
    builtin: str | None  # the built-in architecture, for the native engine

    def target(self) -> Target:
        i = self.image
        return Target(i.height, i.width, i.channels, _FITS[i.resize])  # type: ignore[arg-type]

    def label(self, i: int) -> str:
        return self.labels[i] if self.labels is not None and i < len(self.labels) else str(i)


def _declared(entry: Any) -> dict[str, Any]:
    """What the model file declares of its input, from the engine module (optional hook)."""
    if entry.engine == "native":
        return {}
    try:
        mod = importlib.import_module(builder_module(entry.engine))
    except ModuleNotFoundError:
        return {}
    fn = getattr(mod, "declared_input", None)
    if fn is None:
        return {}
    try:
        return dict(fn(entry) or {})
    except Exception as exc:  # a file that cannot be read declares nothing: loading it says why
        logger.debug("model %s: its file declares no input: %s", entry.name, exc)
        return {}


def builder_module(engine: str) -> str:
    return ENGINES[engine].split(":")[0]


@functools.lru_cache(maxsize=256)
def _card_cached(entry_json: str) -> ModelCard:
    entry = ModelConfig.model_validate_json(entry_json)
    builtin = entry.source if entry.engine == "native" else None
    if builtin is not None:
        info = registry.model_info(builtin)
        base = ImageInput(
            info.input_size[0],
            info.input_size[1],
            info.channels,
            tuple(info.mean),
            tuple(info.std),
            info.layout,  # type: ignore[arg-type]
            "crop" if info.fit == "center_crop" else "stretch",
        )
        dtype = "uint8"
    else:
        base, dtype = TORCHVISION_INPUT, "float32"
    given = {k: v for k, v in entry.input.model_dump().items() if v is not None}
    declared = _declared(entry)
    fields = {**declared, **given}
    if entry.task in PIXEL_TASKS:  # an answer in the input's pixels: the whole image, as it is
        fields.setdefault("resize", "stretch")
    dtype = fields.pop("dtype", dtype)
    image = replace(base, **{k: tuple(v) if k in ("mean", "std") else v for k, v in fields.items()})
    for what in ("mean", "std"):
        v = getattr(image, what)
        if len(v) == 1 and image.channels > 1:
            image = replace(image, **{what: v * image.channels})
        elif len(v) != image.channels and what not in fields:  # a default for other channels
            image = replace(image, **{what: (sum(v) / len(v),) * image.channels})
        elif len(v) != image.channels:
            raise InvalidInput(
                f"input.{what} does not match the channels",
                model=entry.name,
                values=list(v),
                channels=image.channels,
            )
    if builtin is not None and (image.height, image.width, image.channels) != (
        base.height,
        base.width,
        base.channels,
    ):
        raise InvalidInput(
            "the built-in model takes a fixed input size",
            model=entry.name,
            expected=[base.height, base.width, base.channels],
            given=[image.height, image.width, image.channels],
        )
    labels = read_labels(entry.labels) if entry.labels else None
    if labels is None and builtin is not None:
        labels = registry.labels(builtin)
    return ModelCard(entry.name, entry.engine, image, dtype, labels, builtin)


def model_card(entry: Any) -> ModelCard:
    """The entry's card (cached by the entry's content)."""
    return _card_cached(entry.model_dump_json())


def load_entry(entry: Any) -> Any:
    """Build the entry's engine (``engines.ENGINES``) and check it against its card."""
    card = model_card(entry)
    build = builder(entry.engine)
    loaded = build(entry, card.image)
    eng = loaded.engine
    (inp,) = eng.inputs[:1] or (None,)
    if inp is None or not eng.outputs:
        raise InvalidInput("a model needs an input and an output tensor", model=entry.name)
    task = resolve_task(entry, card, tuple(eng.outputs))  # InvalidInput: refused, named
    loaded.engine = with_epilogue(eng, task)  # image, segment: their bytes made on the device
    classes = labelled_classes(task, tuple(eng.outputs))
    labelled = card.labels is not None and entry.labels is not None and classes is not None
    if labelled and len(card.labels) != classes:
        raise InvalidInput(
            "the labels file does not match the model's classes",
            model=entry.name,
            task=task.kind,
            labels_file=entry.labels,
            labels=len(card.labels),
            classes=classes,
        )
    if card.builtin is None:
        i = card.image
        want = (
            (i.channels, i.height, i.width)
            if i.layout == "nchw"
            else (i.height, i.width, i.channels)
        )
        if tuple(inp.shape[1:]) != want:
            raise InvalidInput(
                "the model's input does not match the entry's input (height, width, channels, layout)",
                model=entry.name,
                model_input=list(inp.shape),
                entry_input=[-1, *want],
            )
    logger.info(
        "model %s: engine %s, source %s, input %s %s, task %s",
        entry.name,
        entry.engine,
        loaded.source,
        inp.dtype,
        list(inp.shape),
        task.kind,
    )
    return loaded


def is_torchvision_name(source: str) -> bool:
    """A torch source that is an architecture name, not a file or module:function."""
    return ":" not in source and "/" not in source and not source.endswith(MODEL_FILE_SUFFIXES)


def random_weights(entry: Any) -> bool:
    """Whether the entry serves seeded random weights (answers then mean nothing)."""
    if entry.engine == "native":
        return entry.weights is None and registry.model_info(entry.source).default_weights is None
    return entry.engine == "torch" and is_torchvision_name(entry.source) and entry.weights is None
