"""ONNX models built with ``onnx.helper`` (no torch) for the importer's tests, and a runner of
Ferry graphs on numpy.

``small_net`` combines the families torchvision's classifiers use: a conv with batch norm
and hardswish, a depthwise conv with asymmetric padding, squeeze-excite, a residual add,
a channel concat and a channel shuffle, max and average pools, Gemm and Softmax.
``resnet50`` writes the native ResNet-50 (``pipeline.models.resnet50``) as torchvision
exports it: Conv + BatchNormalization + Relu, Add + Relu, MaxPool, GlobalAveragePool,
Flatten, Gemm.
"""

from __future__ import annotations

import numpy as np

from pipeline.device import Backend, Stream


def run_host(graph, x: np.ndarray) -> list[np.ndarray]:
    """Run a Ferry graph once on numpy (fp32) and return copies of its outputs."""
    plan = graph.prepare(x.shape[0], "float32", "host")
    arena = np.zeros(plan.arena_bytes, np.uint8)
    bound = plan.bind(arena, graph.constant_arrays("float32"))
    bound.input[...] = x
    stream = Stream("test", Backend("numpy"))
    bound.run(stream)
    return [np.array(o) for o in bound.outputs]


class Builder:
    """Nodes, initializers and a fresh-name counter for one ``onnx.helper`` graph."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list = []
        self.inits: list = []
        self.n = 0

    def name(self, base: str) -> str:
        self.n += 1
        return f"{base}_{self.n}"

    def const(self, value, base: str = "c") -> str:
        from onnx import numpy_helper

        name = self.name(base)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op: str, inputs: list[str], n_out: int = 1, **attrs) -> str | list[str]:
        from onnx import helper

        outs = [self.name(op.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=self.name(op), **attrs))
        return outs[0] if n_out == 1 else outs

    def weights(self, *shape: int, scale: float = 0.3) -> str:
        return self.const((self.rng.standard_normal(shape) * scale).astype(np.float32), "w")

    def conv_bn(
        self,
        x: str,
        cin: int,
        cout: int,
        k: int,
        stride: int = 1,
        groups: int = 1,
        pads: list[int] | None = None,
        act: str | None = "Relu",
        act_inputs: tuple[str, ...] = (),
    ) -> str:
        p = k // 2
        y = self.node(
            "Conv",
            [x, self.weights(cout, cin // groups, k, k)],
            kernel_shape=[k, k],
            strides=[stride, stride],
            pads=pads or [p, p, p, p],
            group=groups,
        )
        rng = self.rng
        bn = [
            self.const(v.astype(np.float32), "bn")
            for v in (
                rng.uniform(0.5, 1.5, cout),
                rng.standard_normal(cout) * 0.1,
                rng.standard_normal(cout) * 0.1,
                rng.uniform(0.5, 2.0, cout),
            )
        ]
        y = self.node("BatchNormalization", [y, *bn], epsilon=1e-5)
        return self.node(act, [y, *act_inputs]) if act else y

    def model(self, inputs, outputs, opset: int = 17):
        from onnx import helper

        graph = helper.make_graph(self.nodes, "test", inputs, outputs, self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def tensor(name: str, shape: list, elem=None):
    from onnx import TensorProto, helper

    return helper.make_tensor_value_info(name, elem or TensorProto.FLOAT, shape)


def small_net(seed: int = 0, size: int = 16, classes: int = 10):
    """A MobileNet/ShuffleNet-like net; input x [batch, 3, size, size], outputs logits, prob."""
    b = Builder(seed)
    x = b.conv_bn("x", 3, 16, 3, stride=2, act="HardSwish")  # 16 x s/2
    # depthwise with asymmetric pads, then squeeze-excite
    d = b.conv_bn(x, 16, 16, 3, groups=16, pads=[0, 0, 2, 2], act="Relu")
    s = b.node("GlobalAveragePool", [d])
    s = b.node(
        "Conv", [s, b.weights(4, 16, 1, 1), b.const(np.zeros(4, np.float32))], kernel_shape=[1, 1]
    )
    s = b.node("Relu", [s])
    s = b.node(
        "Conv",
        [s, b.weights(16, 4, 1, 1), b.const(np.full(16, 0.1, np.float32))],
        kernel_shape=[1, 1],
    )
    s = b.node("HardSigmoid", [s], alpha=1 / 6, beta=0.5)
    d = b.node("Mul", [d, s])
    d = b.conv_bn(d, 16, 16, 1, act=None)
    r = b.node("Add", [d, x])  # residual
    # two branches, concat, channel shuffle (groups 2)
    left = b.conv_bn(r, 16, 8, 1)
    right = b.node("MaxPool", [r], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])
    right = b.conv_bn(right, 16, 8, 1, act="Sigmoid")
    c = b.node("Concat", [left, right], axis=1)
    h = size // 2
    c = b.node("Reshape", [c, b.const(np.array([-1, 2, 8, h, h], np.int64))])
    c = b.node("Transpose", [c], perm=[0, 2, 1, 3, 4])
    c = b.node("Reshape", [c, b.const(np.array([-1, 16, h, h], np.int64))])
    c = b.node("AveragePool", [c], kernel_shape=[2, 2], strides=[2, 2])
    c = b.conv_bn(
        c, 16, 32, 3, act="Clip", act_inputs=(b.const(np.float32(0)), b.const(np.float32(6)))
    )
    g = b.node("GlobalAveragePool", [c])
    f = b.node("Flatten", [g], axis=1)
    logits = b.node(
        "Gemm", [f, b.weights(classes, 32), b.const(np.zeros(classes, np.float32))], transB=1
    )
    b.node("Softmax", [logits], axis=-1)
    b.nodes[-2].output[0] = "logits"
    b.nodes[-1].input[0] = "logits"
    b.nodes[-1].output[0] = "prob"
    return b.model(
        [tensor("x", ["batch", 3, size, size])],
        [tensor("logits", ["batch", classes]), tensor("prob", ["batch", classes])],
    )


def resnet50(sd: dict[str, np.ndarray], image_size: int = 224):
    """The native ResNet-50's weights as the ONNX graph torchvision's export writes."""
    from pipeline.models.resnet50 import block_names

    b = Builder()

    def conv_bn(x: str, name: str, bn: str, stride: int, pad: int, relu: bool) -> str:
        w = sd[f"{name}.weight"]
        k = w.shape[2]
        y = b.node(
            "Conv", [x, b.const(w)], kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4
        )
        y = b.node(
            "BatchNormalization",
            [
                y,
                *(
                    b.const(sd[f"{bn}.{p}"])
                    for p in ("weight", "bias", "running_mean", "running_var")
                ),
            ],
        )
        return b.node("Relu", [y]) if relu else y

    x = conv_bn("x", "conv1", "bn1", 2, 3, True)
    x = b.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    for prefix, _cin, _w, stride, down in block_names():
        y = conv_bn(x, f"{prefix}.conv1", f"{prefix}.bn1", 1, 0, True)
        y = conv_bn(y, f"{prefix}.conv2", f"{prefix}.bn2", stride, 1, True)
        y = conv_bn(y, f"{prefix}.conv3", f"{prefix}.bn3", 1, 0, False)
        identity = x
        if down:
            identity = conv_bn(
                x, f"{prefix}.downsample.0", f"{prefix}.downsample.1", stride, 0, False
            )
        x = b.node("Relu", [b.node("Add", [y, identity])])
    x = b.node("Flatten", [b.node("GlobalAveragePool", [x])], axis=1)
    b.node("Gemm", [x, b.const(sd["fc.weight"]), b.const(sd["fc.bias"])], transB=1)
    b.nodes[-1].output[0] = "logits"
    return b.model(
        [tensor("x", ["batch", 3, image_size, image_size])], [tensor("logits", ["batch", 1000])]
    )


def single_relu_lrn():
    """Relu then LRN (which Ferry does not run): a model to refuse at load time."""
    b = Builder()
    b.node("LRN", [b.node("Relu", ["x"])], size=3)
    b.nodes[-1].output[0] = "y"
    return b.model([tensor("x", ["batch", 4, 3, 3])], [tensor("y", ["batch", 4, 3, 3])])


def topk_unnamed():
    """Relu then TopK (which Ferry does not run), neither node named (ONNX makes names
    optional; torch's exporters leave some out): a refusal must name the TopK by its
    first output, ``scores``."""
    from onnx import TensorProto, helper

    b = Builder()
    k = b.const(np.array([3], np.int64), "k")
    b.nodes.append(helper.make_node("Relu", ["x"], ["r"]))
    b.nodes.append(helper.make_node("TopK", ["r", k], ["scores", "indices"], axis=-1))
    return b.model(
        [tensor("x", ["batch", 10])],
        [tensor("scores", ["batch", 3]), tensor("indices", ["batch", 3], TensorProto.INT64)],
    )


def topk_image_net(classes: int = 10):
    """An image model Ferry refuses at load: x [batch, 3, 16, 16] -> GlobalAveragePool ->
    Flatten -> Gemm (logits) -> TopK (which Ferry does not run); outputs logits and the top
    3 scores."""
    b = Builder(0)
    y = b.node("Flatten", [b.node("GlobalAveragePool", ["x"])])
    bias = b.const(np.zeros(classes, np.float32))
    logits = b.node("Gemm", [y, b.weights(classes, 3), bias], transB=1)
    scores, _ = b.node("TopK", [logits, b.const(np.array([3], np.int64))], n_out=2)
    return b.model(
        [tensor("x", ["batch", 3, 16, 16])],
        [tensor(logits, ["batch", classes]), tensor(scores, ["batch", 3])],
    )


def overflow_net(size: int = 8, hidden: int = 32, classes: int = 10, scale: float = 1e3):
    """An image classifier whose activations overflow float16 (65504) and nothing else:
    x [batch, 3, size, size] -> Flatten -> Gemm (weights ~``scale``) -> Relu -> Gemm
    (weights ~``scale``) -> logits. On a normalised image its hidden layer reaches ~1e4-1e5
    and its logits ~1e8: infinite in float16, exact enough in float32."""
    b = Builder(0)
    f = b.node("Flatten", ["x"], axis=1)
    zeros = b.const(np.zeros(hidden, np.float32))
    h = b.node(
        "Relu",
        [b.node("Gemm", [f, b.weights(hidden, 3 * size * size, scale=scale), zeros], transB=1)],
    )
    bias = b.const(np.zeros(classes, np.float32))
    logits = b.node("Gemm", [h, b.weights(classes, hidden, scale=scale), bias], transB=1)
    return b.model([tensor("x", ["batch", 3, size, size])], [tensor(logits, ["batch", classes])])
