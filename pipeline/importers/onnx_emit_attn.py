"""Handlers a transformer needs beyond the CNNs': MatMul of two computed tensors
(attention's q @ k^T and p @ v, batched over the leading dimensions) and Pad (Swin's
windows). The batch must sit in a leading dimension of both MatMul operands, one it
does not contract, so each batch item's rows stay its own."""

from __future__ import annotations

import numpy as np

from ..ops.activation import ACTIVATION
from ..ops.matmul import MATMUL
from ..ops.pad import MODES, PAD
from .onnx_emit import Emitter, handles
from .onnx_ir import INode, batch_axis, is_batch, refuse


def matmul_activations(em: Emitter, n: INode) -> None:
    if em.has_const(n.inputs[0]):
        raise refuse(
            n,
            "MatMul of a constant by a computed tensor is not supported",
            supported="a computed tensor times a constant or a computed tensor",
        )
    a, b = (em.plain(em.val(n, x)) for x in n.inputs[:2])
    ba, bb = batch_axis(a.shape), batch_axis(b.shape)
    if a.rank != b.rank or a.rank < 3 or ba is None or ba >= a.rank - 2 or ba != bb:
        raise refuse(
            n,
            "MatMul of two computed tensors needs the batch in one leading dimension of both",
            a=a.shape,
            b=b.shape,
        )
    if a.shape[:-2] != b.shape[:-2]:
        raise refuse(
            n, "MatMul of two computed tensors needs equal leading dimensions", a=a.shape, b=b.shape
        )
    if is_batch(a.shape[-1]) or a.shape[-1] != b.shape[-2]:
        raise refuse(n, "MatMul needs [..., M, K] x [..., K, N]", a=a.shape, b=b.shape)
    t = em.add(MATMUL, [em.full(a), em.full(b)], n.name or "matmul")
    f = n.fused
    if f.get("act", "none") != "none":
        t = em.add(
            ACTIVATION, [t], f["act"], act=f["act"], alpha=f.get("alpha", 0.0), beta=f.get("beta", 0.0)
        )  # fmt: skip
    shape = (*a.shape[:-1], b.shape[-1])
    em.put(n.outputs[0], t, shape, False, shape[1:])


def _pads(em: Emitter, n: INode, rank: int) -> list[tuple[int, int]]:
    raw = n.attrs.get("pads")
    if raw is None:
        raw = em.const(n, n.inputs[1]).reshape(-1) if len(n.inputs) > 1 and n.inputs[1] else []
    raw = [int(p) for p in raw]
    axes = list(range(rank))
    if len(n.inputs) > 3 and n.inputs[3]:
        axes = [
            int(a) + rank if int(a) < 0 else int(a) for a in em.const(n, n.inputs[3]).reshape(-1)
        ]
    if len(raw) != 2 * len(axes):
        raise refuse(n, "Pad needs a begin and an end per axis", pads=raw, rank=rank)
    pairs = [(0, 0)] * rank
    for k, a in enumerate(axes):
        pairs[a] = (raw[k], raw[k + len(axes)])
    return pairs


@handles("Pad")
def _pad(em: Emitter, n: INode) -> None:
    v = em.plain(em.val(n, n.inputs[0]))
    mode = n.attrs.get("mode", "constant")
    if mode not in MODES:
        raise refuse(n, "this Pad mode is not supported", mode=mode, supported=tuple(MODES))
    pairs = _pads(em, n, v.rank)
    if any(a < 0 or b < 0 for a, b in pairs):
        raise refuse(n, "Pad with negative pads (a crop) is not supported", pads=pairs)
    b = batch_axis(v.shape)
    if b is None or pairs[b] != (0, 0):
        raise refuse(n, "Pad along the batch axis is not supported", pads=pairs)
    if all(p == (0, 0) for p in pairs):
        em.vals[n.outputs[0]] = v
        return
    value = 0.0
    if len(n.inputs) > 2 and n.inputs[2]:
        value = float(np.asarray(em.const(n, n.inputs[2])).reshape(-1)[0])
    t = em.add(PAD, [em.full(v)], "pad", pads=tuple(pairs), mode=mode, value=value)
    shape = tuple(
        d if is_batch(d) else int(d) + p + q for d, (p, q) in zip(v.shape, pairs, strict=True)
    )
    em.put(n.outputs[0], t, shape, False, shape[1:])
