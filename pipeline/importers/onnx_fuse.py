"""Rewrites of the importer's nodes into what Ferry's ops fuse (what the native graph fuses).

In order: batch norm folded into the conv before it; activation patterns recognised
(x * sigmoid(x) -> silu, x * hardsigmoid(x) -> hardswish, the erf form of GELU -> gelu)
and every activation node turned into ``Act``; a residual ``Add`` folded into the conv that
makes one operand; an activation folded into the conv / GEMM / add before it; a
``MatMul`` + constant ``Add`` made one GEMM with a bias; ShuffleNet's
reshape-transpose-reshape made one ``ChannelShuffle``. A rewrite applies only where the
intermediate tensor has no other reader and is not a model output.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import numpy as np

from ..models.layers import fold_bn
from .onnx_ir import INode, refuse

ACT_OPS = {"Relu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Erf", "Gelu"}
EPILOGUE_HOSTS = {"Conv", "Gemm", "MatMul", "Add", "Sub", "Mul", "Div", "BatchNormalization"}


class Fuser:
    def __init__(
        self,
        nodes: list[INode],
        consts: dict[str, np.ndarray],
        shapes: dict[str, tuple[Any, ...]],
        outputs: set[str],
    ) -> None:
        self.nodes = nodes
        self.consts = consts
        self.shapes = shapes
        self.graph_outputs = outputs

    # ------------------------------------------------------------------ helpers
    def _index(self) -> None:
        self.producer: dict[str, INode] = {}
        self.readers: dict[str, list[INode]] = defaultdict(list)
        for n in self.nodes:
            for o in n.outputs:
                self.producer[o] = n
            for i in n.inputs + ([n.fused["residual"]] if "residual" in n.fused else []):
                if i:
                    self.readers[i].append(n)

    def _only_reader(self, tensor: str) -> INode | None:
        r = self.readers.get(tensor, [])
        if len(r) != 1 or tensor in self.graph_outputs:
            return None
        return r[0]

    def _const(self, name: str) -> np.ndarray | None:
        v = self.consts.get(name)
        return None if v is None or v.dtype == object else v

    def _scalar(self, name: str) -> float | None:
        v = self._const(name)
        return float(v.reshape(-1)[0]) if v is not None and v.size == 1 else None

    def _drop(self, *nodes: INode) -> None:
        ids = {id(n) for n in nodes}
        self.nodes = [n for n in self.nodes if id(n) not in ids]

    def _new_const(self, base: str, value: np.ndarray) -> str:
        name, k = f"{base}__ferry", 0
        while name in self.consts:
            k += 1
            name = f"{base}__ferry{k}"
        self.consts[name] = value
        return name

    # ------------------------------------------------------------------ passes
    def run(self) -> list[INode]:
        for p in (
            self.fold_bn,
            self.activations,
            self.residuals,
            self.epilogues,
            self.matmul_bias,
            self.channel_shuffle,
            self.flatten_into_gemm,
        ):
            self._index()
            p()
        return self.nodes

    def fold_bn(self) -> None:
        for bn in list(self.nodes):
            if bn.op != "BatchNormalization":
                continue
            if len([o for o in bn.outputs if o]) > 1 or int(bn.attrs.get("training_mode", 0)):
                raise refuse(
                    bn,
                    "batch norm in training mode is not supported",
                    supported="inference batch norm (one output)",
                )
            conv = self.producer.get(bn.inputs[0])
            params = [self._const(x) for x in bn.inputs[1:5]]
            if conv is None or conv.op != "Conv" or self._only_reader(bn.inputs[0]) is not bn:
                continue
            w = self._const(conv.inputs[1])
            if w is None or any(p is None for p in params) or w.ndim != 4:
                continue
            b = self._const(conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2] else None
            wf, bf = fold_bn(w, b, *params, eps=float(bn.attrs.get("epsilon", 1e-5)))
            conv.inputs = [
                conv.inputs[0],
                self._new_const(conv.inputs[1], wf),
                self._new_const(conv.inputs[1] + ".bias", bf),
            ]
            conv.outputs = [bn.outputs[0]]
            self._drop(bn)
            self._index()

    def _act_of(self, n: INode) -> tuple[str, float, float] | None:
        op = n.op
        if op == "Relu":
            return ("relu", 0.0, 0.0)
        if op == "Clip":
            lo = (
                n.attrs.get("min")
                if "min" in n.attrs
                else (self._scalar(n.inputs[1]) if len(n.inputs) > 1 and n.inputs[1] else -math.inf)
            )
            hi = (
                n.attrs.get("max")
                if "max" in n.attrs
                else (self._scalar(n.inputs[2]) if len(n.inputs) > 2 and n.inputs[2] else math.inf)
            )
            if lo is None or hi is None:
                raise refuse(n, "Clip bounds must be constants")
            if lo == 0 and hi == math.inf:
                return ("relu", 0.0, 0.0)
            return ("clip", float(lo), float(min(hi, 3.0e38)))
        if op == "Sigmoid":
            return ("sigmoid", 0.0, 0.0)
        if op == "HardSigmoid":
            return (
                "hardsigmoid",
                float(n.attrs.get("alpha", 0.2)),
                float(n.attrs.get("beta", 0.5)),
            )
        if op == "HardSwish":
            return ("hardswish", 0.0, 0.0)
        if op == "Tanh":
            return ("tanh", 0.0, 0.0)
        if op == "Erf":
            return ("erf", 0.0, 0.0)
        if op == "Gelu":
            approx = n.attrs.get("approximate", "none")
            if approx not in ("none", "tanh"):
                raise refuse(
                    n, "unknown Gelu approximation", approximate=approx, supported=("none", "tanh")
                )
            return ("gelu" if approx == "none" else "gelu_tanh", 0.0, 0.0)
        return None

    def _as_act(self, n: INode, x: str, act: tuple[str, float, float], outputs: list[str]) -> None:
        n.op, n.inputs, n.outputs, n.attrs = "Act", [x], outputs, {}
        n.fused.update(act=act[0], alpha=act[1], beta=act[2])

    def activations(self) -> None:
        for n in list(self.nodes):
            if n.op == "Mul" and len(n.inputs) == 2:  # x * sigmoid(x), x * hardsigmoid(x)
                for k in (0, 1):
                    x, s = n.inputs[k], n.inputs[1 - k]
                    p = self.producer.get(s)
                    if p is None or p.inputs[:1] != [x] or self._only_reader(s) is not n:
                        continue
                    a = self._act_of(p)
                    if a == ("sigmoid", 0.0, 0.0):
                        self._as_act(n, x, ("silu", 0.0, 0.0), n.outputs)
                    elif a and a[0] == "hardsigmoid" and abs(a[1] - 1 / 6) < 1e-6 and a[2] == 0.5:
                        self._as_act(n, x, ("hardswish", 0.0, 0.0), n.outputs)
                    else:
                        continue
                    self._drop(p)
                    self._index()
                    break
        for e in list(self.nodes):
            if e.op == "Erf":
                self._gelu(e)
        for n in self.nodes:
            a = self._act_of(n)
            if a is not None:
                self._as_act(n, n.inputs[0], a, n.outputs)

    def _gelu(self, e: INode) -> None:
        """0.5 * x * (1 + erf(x / sqrt 2)), in the orders exporters write it."""
        d = self.producer.get(e.inputs[0])
        if d is None or self._only_reader(e.inputs[0]) is not e or len(d.inputs) != 2:
            return
        c = self._scalar(d.inputs[1])
        if c is None or not (
            (d.op == "Div" and abs(c - math.sqrt(2)) < 1e-4)
            or (d.op == "Mul" and abs(c - 1 / math.sqrt(2)) < 1e-4)
        ):
            return
        x = d.inputs[0]
        add = self._only_reader(e.outputs[0])
        if add is None or add.op != "Add":
            return
        one = [i for i in add.inputs if i != e.outputs[0]]
        if len(one) != 1 or self._scalar(one[0]) != 1.0:
            return
        m1 = self._only_reader(add.outputs[0])
        if m1 is None or m1.op != "Mul":
            return
        other = [i for i in m1.inputs if i != add.outputs[0]]
        if len(other) != 1:
            return
        if other[0] == x:  # (x * (1 + erf)) * 0.5
            m2 = self._only_reader(m1.outputs[0])
            half = [i for i in m2.inputs if i != m1.outputs[0]] if m2 and m2.op == "Mul" else []
            if len(half) != 1 or self._scalar(half[0]) != 0.5:
                return
            self._as_act(m2, x, ("gelu", 0.0, 0.0), m2.outputs)
            self._drop(d, e, add, m1)
        else:  # (x * 0.5) * (1 + erf)
            h = self.producer.get(other[0])
            if h is None or h.op != "Mul" or self._only_reader(other[0]) is not m1:
                return
            hk = [i for i in h.inputs if i != x]
            if x not in h.inputs or len(hk) != 1 or self._scalar(hk[0]) != 0.5:
                return
            self._as_act(m1, x, ("gelu", 0.0, 0.0), m1.outputs)
            self._drop(d, e, add, h)
        self._index()

    def _free_conv(self, t: str, reader: INode) -> INode | None:
        p = self.producer.get(t)
        if p is None or p.op != "Conv" or "act" in p.fused or "residual" in p.fused:
            return None
        return p if self._only_reader(t) is reader else None

    def residuals(self) -> None:
        for add in list(self.nodes):
            if add.op != "Add" or len(add.inputs) != 2:
                continue
            for k in (0, 1):
                a, b = add.inputs[k], add.inputs[1 - k]
                conv = self._free_conv(a, add)
                sa, sb = self.shapes.get(a), self.shapes.get(b)
                if conv is None or b in self.consts or sa is None or sa != sb:
                    continue
                if self._depends_on(b, conv):
                    continue
                conv.fused["residual"] = b
                conv.outputs = list(add.outputs)
                self._drop(add)
                self._index()
                break

    def _depends_on(self, tensor: str, node: INode) -> bool:
        seen, todo = set(), [tensor]
        while todo:
            t = todo.pop()
            p = self.producer.get(t)
            if p is None or id(p) in seen:
                continue
            if p is node:
                return True
            seen.add(id(p))
            todo += [i for i in p.inputs if i]
        return False

    def epilogues(self) -> None:
        for act in list(self.nodes):
            if act.op != "Act":
                continue
            p = self.producer.get(act.inputs[0])
            if p is None or p.op not in EPILOGUE_HOSTS or "act" in p.fused:
                continue
            if self._only_reader(act.inputs[0]) is not act:
                continue
            p.fused.update(act=act.fused["act"], alpha=act.fused["alpha"], beta=act.fused["beta"])
            p.outputs = list(act.outputs)
            self._drop(act)
            self._index()

    def flatten_into_gemm(self) -> None:
        """Flatten (axis 1) read only by a Gemm with constant weights: the Gemm reads the
        4-D map itself, so its weight rows can follow Ferry's NHWC order (no transpose)."""
        for fl in list(self.nodes):
            if fl.op != "Flatten" or int(fl.attrs.get("axis", 1)) != 1:
                continue
            gemm = self._only_reader(fl.outputs[0])
            if gemm is None or gemm.op != "Gemm" or gemm.inputs[0] != fl.outputs[0]:
                continue
            if self._const(gemm.inputs[1]) is None or int(gemm.attrs.get("transA", 0)):
                continue
            if len(self.shapes.get(fl.inputs[0], ())) != 4:
                continue
            gemm.inputs[0] = fl.inputs[0]
            gemm.fused["flatten"] = True
            self._drop(fl)
            self._index()

    def matmul_bias(self) -> None:
        for mm in list(self.nodes):
            if mm.op != "MatMul" or "act" in mm.fused or "bias" in mm.fused:
                continue
            add = self._only_reader(mm.outputs[0])
            if add is None or add.op != "Add":
                continue
            other = [i for i in add.inputs if i != mm.outputs[0]]
            bias = self._const(other[0]) if len(other) == 1 else None
            w = self._const(mm.inputs[1])
            if bias is None or w is None or w.ndim != 2 or bias.size != w.shape[1]:
                continue
            if bias.ndim > 1 and bias.shape[-1] != bias.size:
                continue
            mm.fused["bias"] = other[0]
            mm.fused.update({k: v for k, v in add.fused.items() if k in ("act", "alpha", "beta")})
            mm.outputs = list(add.outputs)
            self._drop(add)
            self._index()

    def channel_shuffle(self) -> None:
        for r1 in list(self.nodes):
            if r1.op != "Reshape":
                continue
            s_in, s5 = self.shapes.get(r1.inputs[0]), self.shapes.get(r1.outputs[0])
            tr = self._only_reader(r1.outputs[0])
            if (
                not s_in
                or not s5
                or len(s_in) != 4
                or len(s5) != 5
                or tr is None
                or tr.op != "Transpose"
            ):
                continue
            if list(tr.attrs.get("perm", [])) != [0, 2, 1, 3, 4]:
                continue
            r2 = self._only_reader(tr.outputs[0])
            if r2 is None or r2.op != "Reshape" or self.shapes.get(r2.outputs[0]) != s_in:
                continue
            if tuple(s5[3:]) != tuple(s_in[2:]) or s5[1] * s5[2] != s_in[1]:
                continue
            r2.op, r2.inputs, r2.attrs = "ChannelShuffle", [r1.inputs[0]], {"groups": int(s5[1])}
            self._drop(r1, tr)
            self._index()
