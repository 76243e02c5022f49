"""The ``onnx`` engine: an ONNX file imported into Ferry's graph (``pipeline.importers``), run
by one of two backends.

The file is read, checked, folded and fused once at load time (anything Ferry cannot run
is refused then, naming the node and the op). Then:

* ``native`` -- Ferry's own graph of two-phase ops on numpy or cupy, sharing one set of
  weights between two graphs: the ``tensors`` feed takes the model's own input (float32
  NCHW, as a v2 request sends it, by the file's input name) and the ``image`` feed takes
  Ferry's uint8 NHWC images and normalises them on the device with the entry's mean/std.
  The executor's CUDA graphs, pool and admission control run it like every native graph.
* ``torch`` -- the imported graph lowered to a torch module (``importers/onnx_lower.py``:
  the folded nodes, before Ferry's fusions) and served by the torch engine: compiled with
  ``torch.compile``, in Ferry's CUDA graphs on a GPU, eager on the CPU.

``backend: auto`` (the entry's; the default) is ``torch`` where the model runs on a GPU,
torch is installed and the model has an image input, else ``native``: on the H200 the
lowered graph runs at ``torch.compile``'s speed, the native one at about half of it (issue
29, ``benchmarks/results/models.json``), and a laptop keeps numpy without torch. A node the
lowering cannot take keeps the model on ``native`` (logged); ``backend: torch`` refuses it.
The choice is made per load context (``_pick``), so the precision probe's trials run on
the backend that serves.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
from typing import Any

from ..device import Stream
from ..errors import InvalidInput, ModelRefused
from ..importers.onnx_graph import ImageFeed, load_onnx
from ..importers.onnx_lower import NotLowered, lower
from ..models.registry import LoadedModel
from .base import BoundModel, Engine, EngineContext, EnginePlan, Feed, ImageInput, TensorInfo
from .native import GraphEngine
from .torch_engine import TorchEngine
from .torch_sources import _torch

logger = logging.getLogger(__name__)
BACKENDS = ("auto", "native", "torch")


class NativeOnnx(GraphEngine):
    """The imported graph on Ferry's ops (the ``native`` backend)."""

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


class OnnxEngine(Engine):
    """The ``onnx`` engine: its signature from the file, everything else from the backend
    ``_pick`` chooses for the load context (see the module's docstring)."""

    name = "onnx"
    gate_key: str | None = None
    """The file (path, size, modification time) for the compile gate of the lowered graph."""

    def __init__(
        self, model: str, imported: Any, image: ImageInput | None = None, backend: str = "auto"
    ) -> None:
        super().__init__(model)
        if backend not in BACKENDS:
            raise InvalidInput("unknown onnx backend", model=model, backend=backend, known=BACKENDS)
        self.imported, self.image, self.backend = imported, image, backend
        self.native = NativeOnnx(model, imported, image)
        self._lowered: Engine | None = None  # the torch engine on the lowered graph
        self.impl: Engine = self.native
        self.why = "native: not loaded yet"

    # -- which backend
    def _pick(self, ctx: EngineContext) -> Engine:
        """The backend for ``ctx`` (the torch engine built on first use), made current."""
        want = self.backend
        if want == "auto":
            has_torch = importlib.util.find_spec("torch") is not None
            want = "torch" if ctx.target == "cuda" and has_torch and self.image else "native"
        impl: Engine = self.native
        if want == "torch":
            try:
                impl = self._torch_engine()
                self.why = f"torch: the graph lowered to torch ({self.backend})"
            except NotLowered as exc:
                if self.backend == "torch":
                    raise ModelRefused(
                        "this model cannot be lowered to torch", model=self.model, why=str(exc)
                    ) from None
                self.why = f"native: {exc}"
                logger.warning("model %s: onnx backend native, not torch: %s", self.model, exc)
        else:
            self.why = f"native ({self.backend}, target {ctx.target})"
        if impl is not self.impl:
            self.impl.close()
            self.impl = impl
        return impl

    def _torch_engine(self) -> Engine:
        if self._lowered is None:
            _torch()  # InvalidInput naming the extra where torch is not installed
            if self.image is None:
                raise InvalidInput(
                    "the torch backend serves models with an image input", model=self.model
                )
            module = lower(self.imported)
            self._lowered = TorchEngine(self.model, module, self.image, "float32", False)
            self._lowered.gate_key = self.gate_key
        return self._lowered

    # -- the model's own signature, from the file
    @property
    def inputs(self) -> tuple[TensorInfo, ...]:
        return self.native.inputs

    @property
    def outputs(self) -> tuple[TensorInfo, ...]:
        return self.native.outputs

    @property
    def feeds(self) -> tuple[Feed, ...]:
        return self.native.feeds

    @property
    def trial_loads(self) -> bool:  # type: ignore[override]
        return self.impl.trial_loads

    @property
    def late_capture(self) -> bool:  # type: ignore[override]
        return self.impl.late_capture

    @property
    def weights_bytes(self) -> int:
        return self.impl.weights_bytes

    # -- the rest, by the backend
    def load(self, ctx: EngineContext) -> None:
        self.ctx = ctx
        self._pick(ctx).load(ctx)
        logger.info("model %s: onnx backend %s", self.model, self.why)

    def dtype_in(self, ctx: EngineContext) -> str:
        return self._pick(ctx).dtype_in(ctx)

    def trial(self, ctx: EngineContext, feed: Feed, stream: Stream) -> tuple[Any, ...]:
        return self._pick(ctx).trial(ctx, feed, stream)

    def plan(self, bucket: int, feed: Feed = "image") -> EnginePlan:
        return self.impl.plan(bucket, feed)

    def bind(self, plan: EnginePlan, arena: Any) -> BoundModel:
        return self.impl.bind(plan, arena)

    def warm_gate(self, buckets: tuple[int, ...]) -> contextlib.AbstractContextManager:
        return self.impl.warm_gate(buckets)

    def close(self) -> None:
        self.impl.close()


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
    engine = OnnxEngine(entry.name, imported, image, getattr(entry, "backend", "auto"))
    st = os.stat(path)
    engine.gate_key = f"onnx:{os.path.abspath(path)}:{st.st_size}:{st.st_mtime_ns}"
    return LoadedModel(entry.name, None, None, False, path, engine=engine)
