"""The torch lowerings of the nn and elementwise ops (see ``onnx_torch``)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .onnx_ir import INode
from .onnx_torch import Call, NotLowered, lowers, pads_2d, torch_, torch_pad


# ----------------------------------------------------------------------------- nn
@lowers("Conv")
def _conv(m: Call, n: INode, ins: list[Any]) -> Any:
    F = torch_().nn.functional
    x, w = ins[0], ins[1]
    b = ins[2] if m.has(n, 2) else None
    rank = x.dim()
    pads, sym = pads_2d(n, rank)
    if not sym:
        x = F.pad(x, torch_pad(pads))
        pads = [0] * len(pads)
    k = rank - 2
    conv = F.conv2d if k == 2 else F.conv1d if k == 1 else F.conv3d
    return conv(
        x,
        w,
        b,
        stride=tuple(int(s) for s in n.attrs.get("strides", [1] * k)),
        padding=tuple(pads[:k]),
        dilation=tuple(int(d) for d in n.attrs.get("dilations", [1] * k)),
        groups=int(n.attrs.get("group", 1)),
    )


@lowers("BatchNormalization")
def _batch_norm(m: Call, n: INode, ins: list[Any]) -> Any:
    F = torch_().nn.functional
    x, scale, bias, mean, var = ins[:5]
    return F.batch_norm(x, mean, var, scale, bias, False, 0.0, float(n.attrs.get("epsilon", 1e-5)))


@lowers("Gemm")
def _gemm(m: Call, n: INode, ins: list[Any]) -> Any:
    torch = torch_()
    a, b = ins[0], ins[1]
    if int(n.attrs.get("transA", 0)):
        a = a.t()
    alpha, beta = float(n.attrs.get("alpha", 1.0)), float(n.attrs.get("beta", 1.0))
    c = ins[2] if m.has(n, 2) else None
    if int(n.attrs.get("transB", 0)) and alpha == 1.0 and beta == 1.0:
        return torch.nn.functional.linear(a, b, c)
    if int(n.attrs.get("transB", 0)):
        b = b.t()
    y = torch.matmul(a, b)
    if alpha != 1.0:
        y = y * alpha
    return y if c is None else y + (c * beta if beta != 1.0 else c)


@lowers("MatMul")
def _matmul(m: Call, n: INode, ins: list[Any]) -> Any:
    return torch_().matmul(ins[0], ins[1])


@lowers("MaxPool", "AveragePool")
def _pool(m: Call, n: INode, ins: list[Any]) -> Any:
    F = torch_().nn.functional
    x = ins[0]
    rank = x.dim()
    k = rank - 2
    pads, sym = pads_2d(n, rank)
    kernel = tuple(int(s) for s in n.attrs["kernel_shape"])
    strides = tuple(int(s) for s in n.attrs.get("strides", [1] * k))
    ceil = bool(int(n.attrs.get("ceil_mode", 0)))
    if n.op == "MaxPool":
        if int(n.attrs.get("storage_order", 0)) or (len(n.outputs) > 1 and n.outputs[1]):
            raise NotLowered(n, "MaxPool's indices output or storage order")
        if not sym:
            x = F.pad(x, torch_pad(pads), value=float("-inf"))
            pads = [0] * len(pads)
        dil = tuple(int(d) for d in n.attrs.get("dilations", [1] * k))
        pool = F.max_pool2d if k == 2 else F.max_pool1d
        return pool(x, kernel, strides, tuple(pads[:k]), dil, ceil_mode=ceil)
    include = bool(int(n.attrs.get("count_include_pad", 0)))
    if not sym:  # include: checked at load
        x = F.pad(x, torch_pad(pads))
        pads = [0] * len(pads)
    pool = F.avg_pool2d if k == 2 else F.avg_pool1d
    return pool(x, kernel, strides, tuple(pads[:k]), ceil_mode=ceil, count_include_pad=include)


@lowers("GlobalAveragePool")
def _gap(m: Call, n: INode, ins: list[Any]) -> Any:
    x = ins[0]
    return x.mean(dim=tuple(range(2, x.dim())), keepdim=True)


@lowers("ReduceMean")
def _reduce_mean(m: Call, n: INode, ins: list[Any]) -> Any:
    x = ins[0]
    axes = n.attrs.get("axes")
    if axes is None and m.has(n, 1):
        axes = m.ints(n.inputs[1])
    keep = bool(int(n.attrs.get("keepdims", 1)))
    if not axes:
        if int(n.attrs.get("noop_with_empty_axes", 0)):
            return x
        axes = list(range(x.dim()))
    return x.mean(dim=tuple(int(a) for a in axes), keepdim=keep)


@lowers("LayerNormalization")
def _layer_norm(m: Call, n: INode, ins: list[Any]) -> Any:
    F = torch_().nn.functional
    x = ins[0]
    axis = int(n.attrs.get("axis", -1)) % x.dim()
    shape = tuple(x.shape[axis:])
    w = ins[1].reshape(shape) if ins[1] is not None else None
    b = ins[2].reshape(shape) if m.has(n, 2) else None
    return F.layer_norm(x, shape, w, b, float(n.attrs.get("epsilon", 1e-5)))


@lowers("Softmax")
def _softmax(m: Call, n: INode, ins: list[Any]) -> Any:
    x = ins[0]
    axis = int(n.attrs.get("axis", -1 if m.opset >= 13 else 1)) % x.dim()
    if m.opset >= 13 or axis == x.dim() - 1:
        return x.softmax(axis)
    shape = x.shape
    return x.reshape(math.prod(shape[:axis]), -1).softmax(-1).reshape(shape)


# ----------------------------------------------------------------------------- elementwise
@lowers("Add", "Sub", "Mul", "Div")
def _binary(m: Call, n: INode, ins: list[Any]) -> Any:
    a, b = ins
    if n.op == "Add":
        return a + b
    if n.op == "Sub":
        return a - b
    if n.op == "Mul":
        return a * b
    if a.is_floating_point() or b.is_floating_point():
        return a / b
    return torch_().div(a, b, rounding_mode="trunc")


def _clip_bound(m: Call, n: INode, k: int, attr: str) -> float | None:
    if attr in n.attrs:
        return float(n.attrs[attr])
    if m.has(n, k):
        return m.floats(n.inputs[k])[0]
    return None


@lowers("Relu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Erf", "Gelu")
def _act(m: Call, n: INode, ins: list[Any]) -> Any:
    torch = torch_()
    x, op = ins[0], n.op
    if op == "Relu":
        return torch.relu(x)
    if op == "Clip":
        return torch.clamp(x, _clip_bound(m, n, 1, "min"), _clip_bound(m, n, 2, "max"))
    if op == "Sigmoid":
        return torch.sigmoid(x)
    if op == "HardSigmoid":
        alpha, beta = float(n.attrs.get("alpha", 0.2)), float(n.attrs.get("beta", 0.5))
        return torch.clamp(x * alpha + beta, 0.0, 1.0)
    if op == "HardSwish":
        return torch.nn.functional.hardswish(x)
    if op == "Tanh":
        return torch.tanh(x)
    if op == "Erf":
        return torch.erf(x)
    return torch.nn.functional.gelu(x, approximate=n.attrs.get("approximate", "none"))


@lowers("Cast")
def _cast(m: Call, n: INode, ins: list[Any]) -> Any:
    import onnx  # optional: onnx

    torch = torch_()
    dt = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(int(n.attrs["to"])))
    if np.issubdtype(dt, np.floating):
        return ins[0].to(m.cdtype)  # floats compute in the model's dtype
    return ins[0].to(getattr(torch, "bool" if dt == np.bool_ else dt.name))
