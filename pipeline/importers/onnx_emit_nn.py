"""Handlers of the network ops: Conv, Gemm, MatMul, batch norm, pools, ReduceMean.

A conv with groups = 1, no dilation and symmetric padding is Ferry's own ``conv2d`` (the
op the native ResNet-50 runs); others are ``conv2d_grouped``. A max pool that the native
``maxpool2d`` covers is that op, and a global average pool is ``global_avg_pool``, so an
imported ResNet-50 is op for op the hand-built one.
"""

from __future__ import annotations

import numpy as np

from ..ops import CONV2D, GEMM, GLOBAL_AVG_POOL, MAXPOOL2D, weights_to_matrix
from ..ops.conv_grouped import CONV2D_GROUPED, grouped_weights
from ..ops.norm import CHANNEL_AFFINE
from ..ops.pool2d import POOL2D, REDUCE_MEAN, pool_out_size
from .onnx_emit import Emitter, handles, ints_input, no_batch_axis, onnx_axis
from .onnx_emit_attn import matmul_activations
from .onnx_ir import BATCH, INode, Val, refuse


def _act_attrs(n: INode) -> dict:
    f = n.fused
    out = {"act": f.get("act", "none")}
    if out["act"] not in ("none", "relu"):
        out.update(alpha=f.get("alpha", 0.0), beta=f.get("beta", 0.0))
    return out


def _spatial(n: INode, name: str, default: int) -> tuple[int, int]:
    v = n.attrs.get(name)
    if v is None:
        return default, default
    if len(v) != 2:
        raise refuse(n, f"only 2-D {name} is supported", value=list(v))
    return int(v[0]), int(v[1])


def _pads(
    n: INode,
    kernel: tuple[int, int],
    stride: tuple[int, int],
    dil: tuple[int, int],
    hw: tuple[int, int],
) -> tuple[int, int, int, int]:
    """(top, left, bottom, right) from ``pads`` or ``auto_pad``."""
    auto = n.attrs.get("auto_pad", "NOTSET")
    if auto in ("NOTSET", "VALID"):
        p = [int(x) for x in n.attrs.get("pads", [0, 0, 0, 0])] if auto == "NOTSET" else [0] * 4
        if len(p) != 4:
            raise refuse(n, "only 2-D pads are supported", pads=p)
        return p[0], p[1], p[2], p[3]
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        out = []
        for k in range(2):
            o = -(-hw[k] // stride[k])
            total = max(0, (o - 1) * stride[k] + (kernel[k] - 1) * dil[k] + 1 - hw[k])
            small, big = total // 2, total - total // 2
            out.append((small, big) if auto == "SAME_UPPER" else (big, small))
        return out[0][0], out[1][0], out[0][1], out[1][1]
    raise refuse(
        n,
        "unknown auto_pad",
        auto_pad=auto,
        supported=("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"),
    )


@handles("Conv")
def _conv(em: Emitter, n: INode) -> None:
    x = em.val(n, n.inputs[0])
    if x.rank != 4:
        raise refuse(n, "only 2-D convolutions (4-D input) are supported", shape=x.shape)
    x = em.nhwc(n, x)
    w = em.const(n, n.inputs[1]).astype(np.float32)
    cout, cg, kh, kw = w.shape
    groups = int(n.attrs.get("group", 1))
    c, h, wd = x.item
    if cg * groups != c:
        raise refuse(n, "weights do not match the input channels", c=c, w=w.shape, groups=groups)
    bias = (
        em.const(n, n.inputs[2]).astype(np.float32)
        if len(n.inputs) > 2 and n.inputs[2]
        else np.zeros(cout, np.float32)
    )
    stride, dil = _spatial(n, "strides", 1), _spatial(n, "dilations", 1)
    pt, pl, pb, pr = _pads(n, (kh, kw), stride, dil, (h, wd))
    oh = (h + pt + pb - dil[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + pl + pr - dil[1] * (kw - 1) - 1) // stride[1] + 1
    ins = [em.tensor(x, (h, wd, c))]
    base = n.name or "conv"
    bname = em.graph_const(f"{base}.b", bias, cast=False)
    res = n.fused.get("residual")
    res_t = []
    if res:
        r = em.nhwc(n, em.val(n, res))
        res_t = [em.tensor(r, (oh, ow, cout))]
    if groups == 1 and dil == (1, 1) and pt == pb and pl == pr:
        wname = em.graph_const(f"{base}.w", weights_to_matrix(w))
        t = em.add(
            CONV2D,
            ins + [wname, bname] + res_t,
            base,
            kernel=(kh, kw),
            stride=stride,
            padding=(pt, pl),
            **_act_attrs(n),
        )
    else:
        wname = em.graph_const(f"{base}.w", grouped_weights(w, groups))
        t = em.add(
            CONV2D_GROUPED,
            ins + [wname, bname] + res_t,
            base,
            kernel=(kh, kw),
            stride=stride,
            dilation=dil,
            pads=(pt, pl, pb, pr),
            groups=groups,
            **_act_attrs(n),
        )
    em.put(n.outputs[0], t, (BATCH, cout, oh, ow), True, (oh, ow, cout))


def _gemm_node(
    em: Emitter, n: INode, a: Val, k: int, b: np.ndarray, bias: np.ndarray | None
) -> str:
    base = n.name or "gemm"
    ins = [em.tensor(a, (k,)), em.graph_const(f"{base}.w", np.ascontiguousarray(b))]
    if bias is not None:
        ins.append(em.graph_const(f"{base}.b", bias.astype(np.float32).reshape(-1), cast=False))
    return em.add(GEMM, ins, base, **_act_attrs(n))


@handles("Gemm")
def _gemm(em: Emitter, n: INode) -> None:
    a = em.val(n, n.inputs[0])
    if int(n.attrs.get("transA", 0)):
        raise refuse(n, "Gemm with transA is not supported", supported="transA=0")
    b = em.const(n, n.inputs[1]).astype(np.float32)
    if int(n.attrs.get("transB", 0)):
        b = b.T
    if n.fused.get("flatten"):  # a Flatten folded in: read the 4-D map as it is stored
        c, h, w = a.item
        if a.nhwc and h * w > 1:  # rows in NCHW order -> NHWC order: no transpose at run time
            b = b.reshape(c, h, w, -1).transpose(1, 2, 0, 3).reshape(c * h * w, -1)
            a = Val(a.tensor, (BATCH, c * h * w), False, a.phys)
        else:
            a = em.plain(a)
            a = Val(a.tensor, (BATCH, c * h * w), False, a.phys)
    a = em.plain(a)
    if a.rank != 2:
        raise refuse(n, "Gemm takes a 2-D input", shape=a.shape)
    b = b * float(n.attrs.get("alpha", 1.0))
    k, nout = b.shape
    bias = None
    if len(n.inputs) > 2 and n.inputs[2]:
        c = em.const(n, n.inputs[2]).astype(np.float32) * float(n.attrs.get("beta", 1.0))
        if c.size not in (1, nout) or (c.ndim == 2 and c.shape[0] != 1):
            raise refuse(
                n,
                "Gemm's C must broadcast along the rows",
                c=c.shape,
                supported=f"[{nout}] or [1, {nout}]",
            )
        bias = np.broadcast_to(c.reshape(-1), (nout,)).copy()
    t = _gemm_node(em, n, a, k, b, bias)
    em.put(n.outputs[0], t, (a.shape[0], nout), False, (nout,))


@handles("MatMul")
def _matmul(em: Emitter, n: INode) -> None:
    if not em.has_const(n.inputs[1]):
        matmul_activations(em, n)
        return
    a = em.plain(em.val(n, n.inputs[0]))
    b = em.const(n, n.inputs[1]).astype(np.float32)
    if b.ndim != 2 or a.rank < 2 or int(a.shape[-1]) != b.shape[0]:
        raise refuse(n, "MatMul needs [..., K] x [K, M]", a=a.shape, b=b.shape)
    bias = em.const(n, n.fused["bias"]) if "bias" in n.fused else None
    t = _gemm_node(em, n, a, b.shape[0], b, bias)
    shape = (*a.shape[:-1], b.shape[1])
    em.put(n.outputs[0], t, shape, False, (b.shape[1],))


@handles("BatchNormalization")
def _bn(em: Emitter, n: INode) -> None:
    v = em.val(n, n.inputs[0])
    v = em.nhwc(n, v) if v.rank == 4 else em.plain(v)
    if v.rank not in (2, 4):
        raise refuse(n, "batch norm on 2-D or 4-D inputs only", shape=v.shape)
    gamma, beta, mean, var = (em.const(n, x).astype(np.float64) for x in n.inputs[1:5])
    scale = gamma / np.sqrt(var + float(n.attrs.get("epsilon", 1e-5)))
    shift = beta - mean * scale
    c = int(v.shape[1])
    base = n.name or "bn"
    t = em.add(
        CHANNEL_AFFINE,
        [
            em.tensor(v, em.phys_of(v)),
            em.graph_const(f"{base}.s", scale, cast=False),
            em.graph_const(f"{base}.t", shift, cast=False),
        ],
        base,
        **_act_attrs(n),
    )
    em.put(n.outputs[0], t, v.shape, v.nhwc, em.phys_of(v) if v.rank == 4 else (c,))


@handles("MaxPool", "AveragePool")
def _pool(em: Emitter, n: INode) -> None:
    x = em.val(n, n.inputs[0])
    if x.rank != 4:
        raise refuse(n, "only 2-D pooling is supported", shape=x.shape)
    if len([o for o in n.outputs if o]) > 1:
        raise refuse(n, "MaxPool's indices output is not supported")
    x = em.nhwc(n, x)
    c, h, w = x.item
    kernel = _spatial(n, "kernel_shape", 1)
    stride = _spatial(n, "strides", 1)
    if _spatial(n, "dilations", 1) != (1, 1):
        raise refuse(n, "pooling with dilation is not supported", supported="dilations 1")
    if int(n.attrs.get("storage_order", 0)):
        raise refuse(n, "storage_order 1 is not supported")
    pads = _pads(n, kernel, stride, (1, 1), (h, w))
    ceil = bool(int(n.attrs.get("ceil_mode", 0)))
    kind = "max" if n.op == "MaxPool" else "avg"
    include = bool(int(n.attrs.get("count_include_pad", 0)))
    pt, pl, pb, pr = pads
    k = kernel[0]
    if (
        kind == "max"
        and not ceil
        and kernel[0] == kernel[1]
        and stride[0] == stride[1]
        and pt == pl == pb == pr
        and pt <= k // 2
    ):
        t = em.add(
            MAXPOOL2D, [em.tensor(x, (h, w, c))], "maxpool", kernel=k, stride=stride[0], padding=pt
        )
    else:
        t = em.add(
            POOL2D,
            [em.tensor(x, (h, w, c))],
            f"{kind}pool",
            kind=kind,
            kernel=kernel,
            stride=stride,
            pads=pads,
            ceil_mode=ceil,
            count_include_pad=include,
        )
    oh = pool_out_size(h, kernel[0], stride[0], pt, pb, ceil)
    ow = pool_out_size(w, kernel[1], stride[1], pl, pr, ceil)
    em.put(n.outputs[0], t, (BATCH, c, oh, ow), True, (oh, ow, c))


@handles("GlobalAveragePool")
def _gap(em: Emitter, n: INode) -> None:
    x = em.val(n, n.inputs[0])
    if x.rank != 4:
        raise refuse(n, "only 2-D global pooling is supported", shape=x.shape)
    x = em.nhwc(n, x)
    c, h, w = x.item
    t = em.add(GLOBAL_AVG_POOL, [em.tensor(x, (h, w, c))], "avgpool")
    em.put(n.outputs[0], t, (BATCH, c, 1, 1), True, (c,))


@handles("ReduceMean")
def _reduce_mean(em: Emitter, n: INode) -> None:
    v = em.val(n, n.inputs[0])
    axes = ints_input(em, n, 1, "axes")
    if axes is None:
        raise refuse(n, "ReduceMean over every axis (the batch too) is not supported")
    axes = sorted(onnx_axis(n, a, v.rank) for a in axes)
    for a in axes:
        no_batch_axis(n, a, v)
    keep = bool(int(n.attrs.get("keepdims", 1)))
    shape = tuple(1 if k in axes else d for k, d in enumerate(v.shape))
    out_shape = shape if keep else tuple(d for k, d in enumerate(v.shape) if k not in axes)
    if v.rank == 4 and axes == [2, 3] and v.batch_first:  # a global average pool
        x = em.nhwc(n, v)
        c, h, w = x.item
        t = em.add(GLOBAL_AVG_POOL, [em.tensor(x, (h, w, c))], "avgpool")
        em.put(n.outputs[0], t, out_shape, keep, (c,))
        return
    if axes != list(range(axes[0], axes[-1] + 1)):
        raise refuse(n, "ReduceMean over axes that are not adjacent", axes=axes)
    t = em.add(REDUCE_MEAN, [em.full(v)], "reduce_mean", axes=(axes[0], axes[-1] + 1))
    rest = tuple(d for k, d in enumerate(v.shape) if k not in axes)
    em.put(n.outputs[0], t, out_shape, False, rest[1:])
