"""ONNX files into Ferry's native graph of two-phase ops.

    model = load_onnx("model.onnx")                 # read, check, fold, fuse; refuses here
    g = model.graph()                               # input: the model's own tensor (v2)
    g = model.graph(ImageFeed(mean, std))           # input: uint8 NHWC images, normalised inside

Loading checks the opset, the single input's dtype (float32), every op and attribute, and
plans the built graph once for the CPU and once for the GPU, so anything Ferry cannot run is
refused now (``ModelRefused`` naming the node, the op and what is supported) and never when
a request comes. The batch dimension (dynamic, or the file's fixed one) becomes Ferry's:
every bucket plans the same graph. Everything else -- names, dtypes and shapes of the
inputs and outputs -- comes from the file.
"""

from __future__ import annotations

import heapq
import os
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..errors import InvalidInput
from ..graph import COMPUTE_DTYPE, Graph
from ..ops.image import NORMALIZE
from ..ops.layout import TRANSPOSE
from . import onnx_emit_attn, onnx_emit_nn, onnx_emit_shape, onnx_emit_tensor  # noqa: F401
from .onnx_emit import HANDLERS, TO_NHWC, Emitter
from .onnx_fold import Folder
from .onnx_fuse import ACT_OPS, Fuser
from .onnx_ir import BATCH, BatchMoved, INode, Val, refuse

OPSETS = (11, 23)  # default-domain opset versions accepted, inclusive
FOLDED_OPS = (
    "Constant",
    "Identity",
    "Dropout",
    "Shape",
    "Size",
    "Gather",
    "Range",
    "ConstantOfShape",
    "any op on constants",
)
PATTERNS = ("Relu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Erf", "Gelu")


def supported_ops() -> tuple[str, ...]:
    return tuple(sorted(set(HANDLERS) - {"Act", "ChannelShuffle"} | set(PATTERNS)))


@dataclass(frozen=True)
class OnnxTensor:
    """A named input or output of the file: numpy dtype name, shape with -1 as the batch."""

    name: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class ImageFeed:
    """Feed uint8 NHWC images; ``(x / 255 - mean) / std`` runs inside the graph."""

    mean: tuple[float, ...]
    std: tuple[float, ...]


@dataclass
class OnnxModel:
    path: str
    name: str
    opset: int
    inputs: tuple[OnnxTensor, ...]
    outputs: tuple[OnnxTensor, ...]
    static_batch: int | None  # the file's fixed batch size, None where it is dynamic
    nodes: list[INode] = field(repr=False)
    consts: dict[str, np.ndarray] = field(repr=False)
    # the nodes before Ferry's fusions (plain ONNX semantics: what ``onnx_lower`` lowers to
    # torch) and the tensors that are the outputs, in the file's order
    folded: list[INode] = field(default_factory=list, repr=False)
    results: tuple[str, ...] = ()
    # the ONNX shapes of the runtime tensors, the batch a ``Batch`` (``Folder.shapes``)
    shapes: dict[str, tuple[Any, ...]] = field(default_factory=dict, repr=False)

    def graph(self, image: ImageFeed | None = None) -> Graph:
        """Ferry's graph; with ``image``, its input is uint8 [N, H, W, C] images."""
        em = start_graph(self.name, self.inputs[0], self.consts, image)
        em.static_batch, em.opset = self.static_batch, self.opset
        em.outputs = {o.name for o in self.outputs}
        g = em.g
        for node in self.nodes:
            emit_node(em, node)
        outs = []
        for o in self.outputs:
            v = em.plain(em.val(None, o.name)) if o.name in em.vals else None  # type: ignore[arg-type]
            if v is None:
                raise refuse(None, "a model output is not computed from the input", output=o.name)
            if not v.batch_first:
                raise refuse(
                    None, "a model output needs the batch as its first dimension", output=o.name,
                    shape=str(v.shape),
                )  # fmt: skip
            outs.append(em.tensor(v, v.item))
        if len(set(outs)) != len(outs) or g.input_name in outs:
            raise refuse(
                None,
                "two outputs are one tensor, or an output is the input",
                outputs=[o.name for o in self.outputs],
            )
        g.set_outputs(*outs)
        return g

    def op_kinds(self, image: ImageFeed | None = None) -> list[str]:
        """The op names of the built graph, in order (views included)."""
        return [n.op.name for n in self.graph(image).nodes]


def start_graph(
    name: str, inp: OnnxTensor, consts: dict[str, np.ndarray], image: ImageFeed | None = None
) -> Emitter:
    """A graph with the input's first op (a cast to NHWC, or normalisation of images)."""
    item = inp.shape[1:]
    if image is not None:
        if len(item) != 3 or item[0] not in (1, 3):
            raise InvalidInput("an image feed needs a [N, 1|3, H, W] input", input=inp.shape)
        c, h, w = item
        if len(image.mean) != c or len(image.std) != c:
            raise InvalidInput(
                "mean/std need one value per channel", channels=c, mean=image.mean, std=image.std
            )
        g = Graph(name, "image", (h, w, c), "uint8")
        t = g.add(
            NORMALIZE,
            ["image"],
            "ferry:normalize",
            mean=tuple(image.mean),
            std=tuple(image.std),
            layout="nhwc",
            dtype=COMPUTE_DTYPE,
        )
        first = Val(t, (BATCH, *item), True, (h, w, c))
    else:
        g = Graph(name, inp.name, item, inp.dtype)
        nhwc = len(inp.shape) == 4
        perm = TO_NHWC if nhwc else tuple(range(len(inp.shape)))
        # Ferry's own names carry a colon, which no exporter gives a tensor: a file whose
        # input is called "input" (torch.onnx.export's habit) must not collide with them
        t = g.add(TRANSPOSE, [inp.name], "ferry:input", perm=perm, dtype=COMPUTE_DTYPE)
        phys = (item[1], item[2], item[0]) if nhwc else item
        first = Val(t, (BATCH, *item), nhwc, phys)
    em = Emitter(g, consts)
    em.vals[inp.name] = first
    return em


OPS_COMMAND = "ferry models --ops"  # prints supported_ops(), FOLDED_OPS and OPSETS whole


def emit_node(em: Emitter, node: INode) -> None:
    handler = HANDLERS.get(node.op)
    if handler is None:
        # the list itself is one command away, not in the message: 31 names and growing
        # would be cut short in the error's one line (fields show 8 items) and bury the
        # node and the op, which are what the reader needs first
        raise refuse(
            node,
            f"this op is not supported; `{OPS_COMMAND}` lists the ops that are",
            supported=f"{len(supported_ops())} ops, listed by `{OPS_COMMAND}`",
        )
    try:
        handler(em, node)
    except BatchMoved:
        shapes = [str(em.vals[i].shape) for i in node.inputs if i in em.vals]
        raise refuse(
            node, "this op needs the batch as the first dimension of its input", shapes=shapes
        ) from None


class ShapeOracle:
    """The ONNX shapes of runtime tensors, as the emitters compute them, node by node while
    the file is folded (a ``Shape`` of a computed tensor needs them; onnx's own inference
    loses them behind a ``Slice`` whose bounds are computed)."""

    def __init__(
        self,
        name: str,
        inp: OnnxTensor,
        consts: dict[str, np.ndarray],
        static_batch: int | None,
        opset: int,
    ) -> None:
        self.em = start_graph(name, inp, consts)
        self.em.static_batch, self.em.opset = static_batch, opset

    def __call__(self, node: INode) -> dict[str, tuple[Any, ...]]:
        em = self.em
        if node.op in ACT_OPS:  # elementwise: the input's shape
            em.vals[node.outputs[0]] = em.val(node, node.inputs[0])
        else:
            emit_node(em, node)
        return {o: em.vals[o].shape for o in node.outputs if o in em.vals}


def _np_dtype(elem_type: int) -> str:
    import onnx  # optional: onnx

    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).name


def load_onnx(path: str, name: str | None = None) -> OnnxModel:
    """Read, check, fold and fuse an ONNX file; refuse what Ferry cannot run."""
    model, opset = _read(path)
    gr = model.graph
    inp, dtype, in_shape, static_batch = _the_input(gr)
    folder = Folder(gr, opset)
    oracle = ShapeOracle(
        model.graph.name or "onnx",
        OnnxTensor(inp.name, dtype, in_shape),
        folder.consts,
        static_batch,
        opset,
    )
    folder.shapes[inp.name] = (BATCH, *in_shape[1:])
    folder.on_runtime = oracle
    nodes = folder.run()
    folded = [replace(n, inputs=list(n.inputs), outputs=list(n.outputs), attrs=dict(n.attrs),
                      fused=dict(n.fused)) for n in nodes]  # fmt: skip - the Fuser edits nodes
    out_names = [folder.resolve(o.name) for o in gr.output]
    nodes = Fuser(nodes, folder.consts, folder.shapes, set(out_names)).run()
    nodes = _topo(nodes, inp.name, folder.consts)
    outputs = []
    for o, resolved in zip(gr.output, out_names, strict=True):
        odt = _np_dtype(o.type.tensor_type.elem_type)
        if odt not in ("float32", "float16"):
            raise refuse(None, "model outputs must be float", output=o.name, dtype=odt)
        outputs.append((o.name, resolved))
    m = OnnxModel(
        path=path,
        name=name or os.path.splitext(os.path.basename(path))[0],
        opset=opset,
        inputs=(OnnxTensor(inp.name, dtype, in_shape),),
        outputs=tuple(OnnxTensor(r, "float32", ()) for _o, r in outputs),
        static_batch=static_batch,
        nodes=nodes,
        consts=folder.consts,
        folded=folded,
        results=tuple(out_names),
        shapes=folder.shapes,
    )
    _validate(m)
    # the file's own output names, with the shapes Ferry's plan gives
    plan = m.graph().prepare(1, "float32", "host")
    m.outputs = tuple(
        OnnxTensor(o, "float32", (-1, *spec.shape[1:]))
        for (o, _r), spec in zip(outputs, plan.output_specs, strict=True)
    )
    return m


def _read(path: str) -> tuple[Any, int]:
    """The file's checked model (local functions inlined) and its opset."""
    import onnx  # optional: onnx

    if not os.path.isfile(path):
        raise InvalidInput("ONNX file not found", path=path)
    try:
        model = onnx.load(path)
        onnx.checker.check_model(model)
    except Exception as exc:
        raise refuse(
            None, "not a valid ONNX model", path=path, error=f"{type(exc).__name__}: {exc}"
        ) from None
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if not OPSETS[0] <= opset <= OPSETS[1]:
        raise refuse(None, "unsupported opset", opset=opset, supported=f"{OPSETS[0]}..{OPSETS[1]}")
    if model.functions:
        from onnx import inliner  # optional: onnx

        model = inliner.inline_local_functions(model)
    return model, opset


def _the_input(gr: Any) -> tuple[Any, str, tuple[int, ...], int | None]:
    """The graph's one input: (its proto, dtype, shape with -1 for the batch, a fixed batch
    or None); refused unless it is one float32 tensor with a batch and fixed other dims."""
    inits = {i.name for i in gr.initializer}
    ins = [i for i in gr.input if i.name not in inits]
    if len(ins) != 1:
        raise refuse(
            None, "a model with exactly one input is supported", inputs=[i.name for i in ins]
        )
    inp = ins[0]
    dtype = _np_dtype(inp.type.tensor_type.elem_type)
    if dtype != "float32":
        raise refuse(
            None,
            "the model input must be float32",
            input=inp.name,
            dtype=dtype,
            supported="float32",
        )
    dims = inp.type.tensor_type.shape.dim
    if len(dims) < 2 or any(not d.HasField("dim_value") for d in list(dims)[1:]):
        raise refuse(
            None,
            "the input needs a batch and fixed other dimensions",
            input=inp.name,
            shape=[d.dim_value or d.dim_param or "?" for d in dims],
        )
    static_batch = int(dims[0].dim_value) if dims[0].HasField("dim_value") else None
    return inp, dtype, (-1, *(int(d.dim_value) for d in list(dims)[1:])), static_batch


def _validate(m: OnnxModel) -> None:
    """Plan the built graph as the CPU and the GPU would, so no request finds a bad node."""
    for image in (None,):
        g = m.graph(image)
        for dtype, target in (("float32", "host"), ("float16", "cuda")):
            try:
                g.prepare(2, dtype, target)
            except InvalidInput as exc:
                raise refuse(
                    None,
                    "the imported graph does not plan",
                    error=str(exc),
                    node=exc.node,
                ) from None


def _topo(nodes: list[INode], input_name: str, consts: dict[str, np.ndarray]) -> list[INode]:
    """Nodes in an order where every input is made first (fusion moves residual reads)."""
    producer = {o: k for k, n in enumerate(nodes) for o in n.outputs}
    deps: list[set[int]] = []
    for n in nodes:
        reads = [*n.inputs, n.fused.get("residual", "")]
        deps.append({producer[t] for t in reads if t and t in producer})
    readers: dict[int, list[int]] = {k: [] for k in range(len(nodes))}
    for k, d in enumerate(deps):
        for j in d:
            readers[j].append(k)
    ready = [(nodes[k].index, k) for k, d in enumerate(deps) if not d]
    heapq.heapify(ready)
    out: list[INode] = []
    left = [len(d) for d in deps]
    while ready:
        _, k = heapq.heappop(ready)
        out.append(nodes[k])
        for r in readers[k]:
            left[r] -= 1
            if left[r] == 0:
                heapq.heappush(ready, (nodes[r].index, r))
    if len(out) != len(nodes):
        raise refuse(None, "the graph has a cycle")
    return out
