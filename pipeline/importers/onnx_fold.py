"""Reading an ONNX graph into the importer's nodes, folding what is constant on the way.

Initializers and ``Constant`` nodes become constants; ``Identity`` and ``Dropout`` (an
inference model's dropout is the identity) disappear; a node whose inputs are all known
is evaluated now -- numbers with ``onnx.reference`` one node at a time, shape arithmetic
that involves the batch (``Shape``, ``Gather``, ``Concat``, ... on ``[N, C, H, W]``) with
the symbolic ``Batch``. What is left is the runtime graph.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .onnx_iota import BatchIota, fold_iota
from .onnx_ir import Batch, INode, per_item, refuse

# ops that only compute on their inputs (safe to evaluate at import time)
NOT_FOLDABLE = {
    "RandomNormal",
    "RandomUniform",
    "RandomNormalLike",
    "RandomUniformLike",
    "Multinomial",
    "Bernoulli",
}
SHAPE_OPS = {
    "Shape",
    "Gather",
    "Slice",
    "Concat",
    "Unsqueeze",
    "Squeeze",
    "Cast",
    "Mul",
    "Div",
    "Add",
    "Sub",
    "Reshape",
    "Identity",
    "Size",
    "Expand",
    "Equal",
    "Where",
    "Not",
    "Max",
    "Range",
}


def attrs_of(node: Any) -> dict[str, Any]:
    import onnx  # optional: onnx

    out: dict[str, Any] = {}
    for a in node.attribute:
        v = onnx.helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode()
        elif isinstance(v, onnx.TensorProto):
            v = onnx.numpy_helper.to_array(v)
        elif isinstance(v, list):
            v = [e.decode() if isinstance(e, bytes) else e for e in v]
        out[a.name] = v
    return out


class Folder:
    """Walks the ONNX nodes in order; keeps constants (numbers or symbolic shape arrays)."""

    def __init__(self, graph: Any, opset: int) -> None:
        import onnx  # optional: onnx

        self.opset = opset
        self.consts: dict[str, np.ndarray] = {}
        for init in graph.initializer:
            self.consts[init.name] = onnx.numpy_helper.to_array(init)
        self.shapes: dict[str, tuple[Any, ...]] = {}  # ONNX shapes of runtime tensors
        # called with each runtime node, returns its outputs' shapes (ShapeOracle)
        self.on_runtime: Any = None
        self.alias: dict[str, str] = {}
        self.nodes: list[INode] = []
        self._graph = graph

    def resolve(self, name: str) -> str:
        while name in self.alias:
            name = self.alias[name]
        return name

    def run(self) -> list[INode]:
        for i, pn in enumerate(self._graph.node):
            node = INode(
                pn.op_type,
                [self.resolve(x) if x else "" for x in pn.input],
                list(pn.output),
                attrs_of(pn),
                pn.name,
                i,
            )
            if pn.domain not in ("", "ai.onnx"):
                raise refuse(
                    node,
                    "ops of other domains are not supported",
                    domain=pn.domain,
                    supported="the default ONNX domain",
                )
            self._visit(node)
        return self.nodes

    # ---------------------------------------------------------------- one node
    def _visit(self, node: INode) -> None:
        op = node.op
        if op == "Constant":
            self.consts[node.outputs[0]] = _constant_value(node)
            return
        if op in ("Identity", "Dropout"):
            if len(node.outputs) > 1 and node.outputs[1]:
                raise refuse(node, "a Dropout whose mask is used cannot be removed")
            src = node.inputs[0]
            if src in self.consts:
                self.consts[node.outputs[0]] = self.consts[src]
            else:
                self.alias[node.outputs[0]] = src
            return
        if op == "Shape" and node.inputs[0] not in self.consts:
            shape = self._runtime_shape(node)
            if any(d is None for d in shape):
                raise refuse(
                    node,
                    "the shape of this tensor is not known at import time",
                    tensor=node.inputs[0],
                    shape=[str(d) for d in shape],
                )
            start = int(node.attrs.get("start", 0))
            end = node.attrs.get("end")
            dims = [Batch(d.k) if isinstance(d, Batch) else int(d) for d in shape]
            self.consts[node.outputs[0]] = np.array(dims[start:end], dtype=object)
            return
        if op == "Size" and node.inputs[0] not in self.consts:
            self.consts[node.outputs[0]] = np.array(
                Batch(per_item(self._runtime_shape(node))), dtype=object
            )
            return
        known = [x for x in node.inputs if x]
        if known and all(x in self.consts for x in known) and not _makes_batch(node, self.consts):
            self._fold(node)
            return
        self.nodes.append(node)
        if self.on_runtime is not None:
            self.shapes.update(self.on_runtime(node))

    def _runtime_shape(self, node: INode) -> tuple[Any, ...]:
        shape = self.shapes.get(node.inputs[0])
        if shape is None:
            raise refuse(
                node, "the shape of this tensor is not known at import time", tensor=node.inputs[0]
            )
        return shape

    def _fold(self, node: INode) -> None:
        ins = [self.consts[x] if x else None for x in node.inputs]
        symbolic = any(a is not None and a.dtype == object for a in ins)
        iota = fold_iota(node, ins) if symbolic else None
        if iota is not None:
            outs = [iota]
        elif symbolic:
            outs = [_fold_symbolic(node, ins)]
        else:
            outs = _fold_reference(node, ins, self.opset)
        for name, v in zip(node.outputs, outs, strict=False):
            if name:
                self.consts[name] = _demote(np.asarray(v))


def _makes_batch(node: INode, consts: dict[str, np.ndarray]) -> bool:
    """A node of constants whose output is a runtime tensor: random ops, and numbers
    expanded to a shape that holds the batch (ViT's class token)."""
    if node.op in NOT_FOLDABLE:
        return True
    if node.op in ("Expand", "ConstantOfShape"):
        data = consts[node.inputs[0]] if node.op == "Expand" else None
        shape = consts[node.inputs[-1]]
        return shape.dtype == object and (data is None or data.dtype != object)
    return False


def _demote(a: np.ndarray) -> np.ndarray:
    """A symbolic array without the batch in it is plain int64 (or bool) again."""
    flat = a.reshape(-1)
    if a.dtype == object and not any(isinstance(v, Batch | BatchIota) for v in flat):
        is_bool = flat.size and all(isinstance(v, bool | np.bool_) for v in flat)
        return a.astype(bool if is_bool else np.int64)
    return a


def _constant_value(node: INode) -> np.ndarray:
    a = node.attrs
    for key, dt in (("value_float", np.float32), ("value_int", np.int64)):
        if key in a:
            return np.array(a[key], dtype=dt)
    for key, dt in (("value_floats", np.float32), ("value_ints", np.int64)):
        if key in a:
            return np.array(a[key], dtype=dt)
    if "value" in a:
        return np.asarray(a["value"])
    raise refuse(
        node,
        "this kind of Constant is not supported",
        attrs=sorted(a),
        supported=("value", "value_float(s)", "value_int(s)"),
    )


def _fold_reference(node: INode, ins: list[Any], opset: int) -> list[Any]:
    """Evaluate one node on numbers with ONNX's reference implementation."""
    import onnx  # optional: onnx
    from onnx import helper  # optional: onnx
    from onnx.reference import ReferenceEvaluator  # optional: onnx

    names = [f"i{k}" if x is not None else "" for k, x in enumerate(ins)]
    outs = [f"o{k}" if o else "" for k, o in enumerate(node.outputs)]
    attrs = {}
    for k, v in node.attrs.items():
        attrs[k] = (
            helper.make_tensor(
                k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape, v.flatten().tolist()
            )
            if isinstance(v, np.ndarray)
            else v
        )
    pn = helper.make_node(node.op, names, outs, **attrs)
    feeds = {n: x for n, x in zip(names, ins, strict=True) if n}
    inputs = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
        for n, x in feeds.items()
    ]
    outputs = [
        helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in outs if o
    ]
    model = helper.make_model(
        helper.make_graph([pn], "fold", inputs, outputs),
        opset_imports=[helper.make_opsetid("", opset)],
    )
    try:
        res = ReferenceEvaluator(model).run(None, feeds)
    except Exception as exc:
        raise refuse(
            node, "folding this constant node failed", error=f"{type(exc).__name__}: {exc}"
        ) from None
    it = iter(res)
    return [next(it) if o else None for o in outs]


def _ints(a: Any) -> list[int]:
    return [int(v) for v in np.asarray(a).reshape(-1)]


def _sym_div(u: Any, v: Any) -> Any:
    if isinstance(u, Batch) and isinstance(v, Batch) and u.k % v.k == 0:
        return u.k // v.k  # (k N) / (j N): an ordinary number again
    return u // v


def _sym_max(u: Any, v: Any) -> Any:
    if isinstance(u, Batch) and not isinstance(v, Batch) and int(v) <= 1:
        return u  # N >= 1
    if isinstance(v, Batch) and not isinstance(u, Batch) and int(u) <= 1:
        return v
    return max(u, v)


def _sym_eq(u: Any, v: Any) -> bool:
    bu, bv = isinstance(u, Batch), isinstance(v, Batch)
    if bu and bv or not (bu or bv):
        return bool(u == v)
    if int(v if bu else u) <= 0:
        return False  # k N is at least 1: never 0 or -1 (the "infer" marker)
    raise TypeError("whether the batch size equals a number is not known at import time")


_SYM_BINARY = {
    "Mul": lambda u, v: u * v,
    "Div": _sym_div,
    "Add": lambda u, v: u + v,
    "Sub": lambda u, v: u - v,
    "Equal": lambda u, v: _sym_eq(u, v),
    "Max": _sym_max,
}


def _sym_slice(x: np.ndarray, ins: list[Any]) -> np.ndarray:
    starts, ends = _ints(ins[1]), _ints(ins[2])
    axes = _ints(ins[3]) if len(ins) > 3 and ins[3] is not None else list(range(len(starts)))
    steps = _ints(ins[4]) if len(ins) > 4 and ins[4] is not None else [1] * len(starts)
    idx = [slice(None)] * x.ndim
    for s, e, a, st in zip(starts, ends, axes, steps, strict=True):
        idx[a] = slice(s, e, st)
    return x[tuple(idx)]


def _sym_squeeze(op: str, x: np.ndarray, at: dict[str, Any], ins: list[Any]) -> np.ndarray:
    axes = (
        at.get("axes")
        if "axes" in at
        else (_ints(ins[1]) if len(ins) > 1 and ins[1] is not None else None)
    )
    if op == "Unsqueeze":
        out = x
        for a in sorted(int(v) % (x.ndim + len(axes)) for v in axes):
            out = np.expand_dims(out, a)
        return out
    return np.squeeze(x, axis=tuple(int(v) for v in axes) if axes is not None else None)


def _fold_symbolic(node: INode, ins: list[Any]) -> np.ndarray:
    """Shape arithmetic on arrays that hold the symbolic batch (object dtype)."""
    op, at = node.op, node.attrs
    x = ins[0]
    try:
        if op == "Gather":
            axis = int(at.get("axis", 0))
            return np.take(x, np.asarray(ins[1]).astype(np.int64), axis=axis)
        if op == "Slice":
            return _sym_slice(x, ins)
        if op == "Concat":
            parts = [
                np.asarray(a, dtype=object).reshape(np.asarray(a).shape)
                for a in ins
                if a is not None
            ]
            return np.concatenate(parts, axis=int(at.get("axis", 0)))
        if op in ("Unsqueeze", "Squeeze"):
            return _sym_squeeze(op, x, at, ins)
        if op == "Cast":
            return x
        if op == "Shape":
            return np.array(x.shape[int(at.get("start", 0)) : at.get("end")], dtype=np.int64)
        if op == "Reshape":
            dims = [int(d) for d in _ints(ins[1])]
            dims = [
                x.shape[k] if d == 0 and not at.get("allowzero") else d for k, d in enumerate(dims)
            ]
            return x.reshape(dims)
        if op == "Expand":
            shape = tuple(int(d) for d in _ints(ins[1]))
            out = np.empty(np.broadcast_shapes(x.shape, shape), dtype=object)
            out[...] = x
            return out
        if op == "Where":
            cond = np.asarray(ins[0]).astype(bool)
            return np.where(
                cond, np.asarray(ins[1], dtype=object), np.asarray(ins[2], dtype=object)
            )
        if op == "Not":
            return np.logical_not(np.asarray(x).astype(bool))
        fn2 = _SYM_BINARY.get(op)
        if fn2 is not None:
            a, b = np.asarray(ins[0], dtype=object), np.asarray(ins[1], dtype=object)
            return np.asarray(np.frompyfunc(fn2, 2, 1)(a, b), dtype=object)
    except TypeError as exc:
        raise refuse(
            node, "shape arithmetic on the batch size is not supported here", error=str(exc)
        ) from None
    raise refuse(
        node,
        "this op cannot compute on the batch size at import time",
        supported=", ".join(sorted(SHAPE_OPS)),
    )
