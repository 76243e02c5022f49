"""The ``onnx`` engine: an ONNX file imported into Ferry's native graph (``pipeline.importers``).

The file is read, checked, folded and fused once at load time (anything Ferry cannot run
is refused then, naming the node and the op). Two graphs come out of it, sharing one set of
weights: the ``tensors`` feed takes the model's own input (float32 NCHW, as a v2 request
sends it, by the file's input name) and the ``image`` feed takes Ferry's uint8 NHWC images
and normalises them on the device with the entry's mean/std -- so the first conv reads
NHWC straight away, the way the hand-built ResNet-50 does. Both run on numpy or cupy with
the executor's CUDA graphs, pool and admission control, like every native graph.
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidInput
from ..importers.onnx_graph import ImageFeed, load_onnx
from ..models.registry import LoadedModel
from .base import Feed, ImageInput, TensorInfo
from .native import GraphEngine


class OnnxEngine(GraphEngine):
    name = "onnx"

    def __init__(self, model: str, imported: Any, image: ImageInput | None = None) -> None:
        super().__init__(model, {"tensors": imported.graph()})
        self.imported = imported
        if image is not None:
            item = imported.inputs[0].shape[1:]
            want = (image.channels, image.height, image.width)
            if tuple(item) != want or image.layout != "nchw":
                raise InvalidInput(
                    "the entry's image input does not match the ONNX model's input",
                    model=model,
                    model_input=imported.inputs[0].shape,
                    image=(*want, image.layout),
                )
            self.graphs["image"] = imported.graph(ImageFeed(tuple(image.mean), tuple(image.std)))

    @property
    def inputs(self) -> tuple[TensorInfo, ...]:
        return tuple(TensorInfo(t.name, t.dtype, t.shape) for t in self.imported.inputs)

    @property
    def outputs(self) -> tuple[TensorInfo, ...]:
        return tuple(TensorInfo(t.name, t.dtype, t.shape) for t in self.imported.outputs)

    @property
    def feeds(self) -> tuple[Feed, ...]:
        return tuple(self.graphs)


def declared_input(entry: Any) -> dict[str, Any]:
    """What the file declares of its image input (the repository's hook): channels, height
    and width of a [N, C, H, W] float32 input, NCHW. Mean/std are not in an ONNX file."""
    import onnx  # optional: onnx

    path = getattr(entry, "source", None)
    if not path:
        return {}
    model = onnx.load(path, load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    ins = [i for i in model.graph.input if i.name not in inits]
    if len(ins) != 1:
        return {}
    dims = ins[0].type.tensor_type.shape.dim
    if len(dims) != 4 or not all(d.HasField("dim_value") for d in list(dims)[1:]):
        return {}
    c, h, w = (int(d.dim_value) for d in list(dims)[1:])
    if c not in (1, 3):
        return {}
    return {"channels": c, "height": h, "width": w, "layout": "nchw", "dtype": "float32"}


def build(entry: Any, image: ImageInput | None = None) -> Any:
    """The engine's builder (``engines.ENGINES``): ``entry.source`` is the ``.onnx`` file."""
    path = getattr(entry, "source", None)
    if not path:
        raise InvalidInput("the onnx engine needs a source file", model=entry.name)
    imported = load_onnx(path, entry.name)
    engine = OnnxEngine(entry.name, imported, image)
    return LoadedModel(entry.name, None, None, False, path, engine=engine)
