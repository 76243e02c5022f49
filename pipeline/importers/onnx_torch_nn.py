"""The torch lowerings of the nn and elementwise ops (see ``onnx_torch``)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .onnx_ir import INode
from .onnx_torch import Call, NotLowered, lowers, pads_2d, prepares, torch_, torch_pad


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


def _pool_size(size: int, k: int, s: int, p0: int, p1: int, ceil: bool) -> int:
    """ONNX's output size of a pool (``pool2d.pool_out_size``, ``k`` dilated): with
    ``ceil_mode`` a window that starts past the input and its begin pad is dropped."""
    span = size + p0 + p1 - k
    o = (-(-span // s) if ceil else span // s) + 1
    return o - 1 if ceil and (o - 1) * s >= size + p0 else o


def _crop_pooled(y: Any, x: Any, pads: list[int], kernel: Any, strides: Any, dil: Any) -> Any:
    """``y`` pooled in ceil mode from ``x`` padded by hand (uneven pads): torch takes the end
    pads for input and keeps windows that start in them; ONNX drops those."""
    k = len(kernel)
    sizes = [
        _pool_size(int(x.shape[2 + a]), d * (kk - 1) + 1, s, pads[a], pads[a + k], True)
        for a, (kk, s, d) in enumerate(zip(kernel, strides, dil, strict=True))
    ]
    return y[(..., *(slice(0, o) for o in sizes))]


@lowers("MaxPool", "AveragePool")
def _pool(m: Call, n: INode, ins: list[Any]) -> Any:
    F = torch_().nn.functional
    x = ins[0]
    rank = x.dim()
    k = rank - 2
    pads, sym = pads_2d(n, rank)
    kernel = tuple(int(s) for s in n.attrs["kernel_shape"])
    strides = tuple(int(s) for s in n.attrs.get("strides", [1] * k))
    dil = tuple(int(d) for d in n.attrs.get("dilations", [1] * k))
    ceil = bool(int(n.attrs.get("ceil_mode", 0)))
    fill = float("-inf") if n.op == "MaxPool" else 0.0  # uneven AveragePool: include, at load
    padded = x if sym else F.pad(x, torch_pad(pads), value=fill)
    at = tuple(pads[:k]) if sym else 0
    if n.op == "MaxPool":
        if int(n.attrs.get("storage_order", 0)) or (len(n.outputs) > 1 and n.outputs[1]):
            raise NotLowered(n, "MaxPool's indices output or storage order")
        pool = F.max_pool2d if k == 2 else F.max_pool1d
        y = pool(padded, kernel, strides, at, dil, ceil_mode=ceil)
    else:
        if dil != (1,) * k:
            raise NotLowered(n, "AveragePool with dilations")
        include = bool(int(n.attrs.get("count_include_pad", 0)))
        pool = F.avg_pool2d if k == 2 else F.avg_pool1d
        y = pool(padded, kernel, strides, at, ceil_mode=ceil, count_include_pad=include)
    return _crop_pooled(y, x, pads, kernel, strides, dil) if ceil and not sym else y


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


@prepares("Cast")
def _cast_to(model: Any, n: INode) -> Any:
    """The torch dtype of a Cast; None for a float, which computes in the model's dtype."""
    import onnx  # optional: onnx

    torch = torch_()
    dt = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(int(n.attrs["to"])))
    if np.issubdtype(dt, np.floating):
        return None
    return torch.bool if dt == np.bool_ else getattr(torch, dt.name)


@lowers("Cast")
def _cast(m: Call, n: INode, ins: list[Any]) -> Any:
    to = m.prepared(n)
    return ins[0].to(m.cdtype if to is None else to)  # floats compute in the model's dtype
