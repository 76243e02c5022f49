"""The ONNX importer on the CPU: every op family against onnx's ReferenceEvaluator (fp32,
1e-3 relative), a small network combining them, the native ResNet-50 imported op for op,
and the refusals at load time. Models are built with ``onnx.helper``; no torch."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx.reference import ReferenceEvaluator  # noqa: E402

from pipeline.importers.onnx_graph import ImageFeed, load_onnx  # noqa: E402
from pipeline.importers.onnx_lower import lower  # noqa: E402
from tests.onnx_models import (  # noqa: E402
    Builder,
    resnet50,
    run_host,
    small_net,
    tensor,
)

RTOL = 1e-3
try:
    import torch
except ImportError:  # the lowering to torch is checked where torch is installed
    torch = None


def _load(tmp_path, model, name="m"):
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    return load_onnx(str(path))


def check(tmp_path, model, x, batch_sizes=(2,)):
    """Import, run on numpy, compare every output with the reference evaluator; where torch
    is installed, the same for the import lowered to torch (the onnx engine's torch backend,
    ``pipeline/importers/onnx_lower.py``), eager on the CPU."""
    m = _load(tmp_path, model)
    g = m.graph()
    lowered = lower(m) if torch is not None else None
    ref_eval = ReferenceEvaluator(model)
    for n in batch_sizes:
        xb = x[:n]
        ref = ref_eval.run(None, {"x": xb})
        runs = {"native": run_host(g, xb)}
        if lowered is not None:
            with torch.no_grad():
                runs["torch"] = [t.numpy() for t in lowered(torch.from_numpy(xb))]
        for how, got in runs.items():
            assert len(got) == len(ref), how
            for a, b, o in zip(got, ref, m.outputs, strict=True):
                assert a.shape == b.shape, (how, o.name, a.shape, b.shape)
                np.testing.assert_allclose(
                    a, b, rtol=RTOL, atol=1e-5 * max(1.0, float(np.abs(b).max())), err_msg=how
                )
    return m


def single(op_fn, in_shape, out_shape=None, opset=17, seed=0):
    """A model whose body ``op_fn(builder, "x")`` returns the output tensor's name."""
    b = Builder(seed)
    y = op_fn(b, "x")
    b.nodes[-1].output[list(b.nodes[-1].output).index(y)] = "y"
    return b.model(
        [tensor("x", ["batch", *in_shape])], [tensor("y", out_shape or ["batch"])], opset
    )


def x_of(*shape, seed=1):
    return np.random.default_rng(seed).standard_normal((3, *shape)).astype(np.float32)


# ------------------------------------------------------------------ conv family
CONVS = [
    dict(cin=4, cout=6, k=3, stride=1, pads=[1, 1, 1, 1], groups=1, dil=1),  # native conv2d
    dict(cin=4, cout=6, k=3, stride=2, pads=[0, 1, 2, 1], groups=1, dil=1),  # asymmetric
    dict(cin=4, cout=6, k=3, stride=1, pads=[2, 2, 2, 2], groups=1, dil=2),  # dilated
    dict(cin=8, cout=8, k=3, stride=2, pads=[1, 1, 1, 1], groups=8, dil=1),  # depthwise
    dict(cin=8, cout=8, k=5, stride=1, pads=[2, 2, 2, 2], groups=8, dil=1),  # depthwise 5x5
    dict(cin=8, cout=12, k=3, stride=1, pads=[1, 1, 1, 1], groups=4, dil=1),  # grouped
    dict(cin=6, cout=6, k=1, stride=1, pads=[0, 0, 0, 0], groups=3, dil=1),  # grouped 1x1
]


@pytest.mark.parametrize(
    "case", CONVS, ids=lambda c: f"g{c['groups']}k{c['k']}s{c['stride']}d{c['dil']}p{c['pads']}"
)
@pytest.mark.parametrize("act", [None, "Relu", "HardSwish", "Sigmoid"])
def test_conv_with_bn_and_activation(tmp_path, case, act):
    def body(b, x):
        y = b.node(
            "Conv",
            [
                x,
                b.weights(case["cout"], case["cin"] // case["groups"], case["k"], case["k"]),
                b.weights(case["cout"]),
            ],
            kernel_shape=[case["k"]] * 2,
            strides=[case["stride"]] * 2,
            pads=case["pads"],
            group=case["groups"],
            dilations=[case["dil"]] * 2,
        )
        c = case["cout"]
        y = b.node(
            "BatchNormalization",
            [
                y,
                *(
                    b.const(v.astype(np.float32))
                    for v in (
                        b.rng.uniform(0.5, 1.5, c),
                        b.rng.standard_normal(c),
                        b.rng.standard_normal(c) * 0.1,
                        b.rng.uniform(0.5, 2, c),
                    )
                ),
            ],
        )
        return b.node(act, [y]) if act else y

    m = check(
        tmp_path,
        single(body, (case["cin"], 9, 9), ["batch", case["cout"], None, None]),
        x_of(case["cin"], 9, 9),
        batch_sizes=(1, 3),
    )
    kinds = m.op_kinds()
    assert "channel_affine" not in kinds and "activation" not in kinds  # folded, fused


def test_conv_residual_add_relu_fuse_into_the_conv(tmp_path):
    def body(b, x):
        y = b.node("Conv", [x, b.weights(4, 4, 3, 3)], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
        return b.node("Relu", [b.node("Add", [y, x])])

    m = check(tmp_path, single(body, (4, 6, 6), ["batch", 4, 6, 6]), x_of(4, 6, 6))
    assert m.op_kinds() == ["transpose", "conv2d", "transpose"]


# ------------------------------------------------------------------ dense
def test_gemm_trans_alpha_beta(tmp_path):
    def body(b, x):
        return b.node("Gemm", [x, b.weights(5, 7), b.weights(1, 5)], transB=1, alpha=0.5, beta=2.0)

    check(tmp_path, single(body, (7,), ["batch", 5]), x_of(7))


def test_matmul_with_bias_on_the_last_axis_of_nhwc(tmp_path):
    def body(b, x):  # ConvNeXt's block: permute to NHWC, Linear, GELU, Linear, permute back
        t = b.node("Transpose", [x], perm=[0, 2, 3, 1])
        y = b.node("Add", [b.node("MatMul", [t, b.weights(6, 12)]), b.weights(12)])
        y = b.node("Gelu", [y])
        y = b.node("Add", [b.node("MatMul", [y, b.weights(12, 6)]), b.weights(6)])
        y = b.node("Mul", [y, b.weights(6)])
        return b.node("Add", [b.node("Transpose", [y], perm=[0, 3, 1, 2]), x])

    m = check(tmp_path, single(body, (6, 5, 5), ["batch", 6, 5, 5], opset=20), x_of(6, 5, 5))
    assert m.op_kinds().count("gemm") == 2 and "transpose" in m.op_kinds()


# ------------------------------------------------------------------ activations, elementwise
ACTS = [
    ("Relu", {}, ()),
    ("Sigmoid", {}, ()),
    ("Tanh", {}, ()),
    ("Erf", {}, ()),
    ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, ()),
    ("HardSwish", {}, ()),
    ("Clip", {}, (0.0, 6.0)),
    ("Clip", {}, (-1.0, 0.5)),
    ("Gelu", {}, ()),
    ("Gelu", {"approximate": "tanh"}, ()),
]


@pytest.mark.parametrize("op,attrs,bounds", ACTS, ids=lambda v: str(v))
def test_activation(tmp_path, op, attrs, bounds):
    def body(b, x):
        return b.node(op, [x, *(b.const(np.float32(v)) for v in bounds)], **attrs)

    check(tmp_path, single(body, (4, 3, 3), ["batch", 4, 3, 3], opset=20), x_of(4, 3, 3) * 3)


@pytest.mark.parametrize("pattern", ["silu", "gelu_erf", "gelu_erf_half_first"])
def test_activation_patterns_become_one_op(tmp_path, pattern):
    def body(b, x):
        if pattern == "silu":
            return b.node("Mul", [x, b.node("Sigmoid", [x])])
        e = b.node(
            "Add",
            [
                b.node("Erf", [b.node("Div", [x, b.const(np.float32(np.sqrt(2)))])]),
                b.const(np.float32(1)),
            ],
        )
        if pattern == "gelu_erf":
            return b.node("Mul", [b.node("Mul", [x, e]), b.const(np.float32(0.5))])
        return b.node("Mul", [b.node("Mul", [x, b.const(np.float32(0.5))]), e])

    m = check(tmp_path, single(body, (8,), ["batch", 8]), x_of(8) * 3)
    assert m.op_kinds() == ["transpose", "activation"]


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("other", ["chan", "scalar", "full", "se"])
def test_binary_broadcasting(tmp_path, op, other):
    def body(b, x):
        if other == "chan":
            o = b.const((b.rng.uniform(0.5, 2, (4, 1, 1))).astype(np.float32))
        elif other == "scalar":
            o = b.const(np.float32(1.5))
        elif other == "full":
            o = b.node("Relu", [x])
            o = b.node("Add", [o, b.const(np.float32(1))])
        else:  # squeeze-excite: [N, C, 1, 1] against [N, C, H, W]
            o = b.node("Sigmoid", [b.node("GlobalAveragePool", [x])])
        return b.node(op, [x, o])

    check(tmp_path, single(body, (4, 5, 6), ["batch", 4, 5, 6]), x_of(4, 5, 6))


def test_standalone_batch_norm_then_relu(tmp_path):
    def body(b, x):  # DenseNet's order: norm, relu, conv
        c = 4
        y = b.node(
            "BatchNormalization",
            [
                x,
                *(
                    b.const(v.astype(np.float32))
                    for v in (
                        b.rng.uniform(0.5, 1.5, c),
                        b.rng.standard_normal(c),
                        b.rng.standard_normal(c),
                        b.rng.uniform(0.5, 2, c),
                    )
                ),
            ],
        )
        return b.node("Conv", [b.node("Relu", [y]), b.weights(3, 4, 1, 1)], kernel_shape=[1, 1])

    m = check(tmp_path, single(body, (4, 5, 5), ["batch", 3, 5, 5]), x_of(4, 5, 5))
    assert "channel_affine" in m.op_kinds() and "activation" not in m.op_kinds()


# ------------------------------------------------------------------ pools, reductions
POOLS = [
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    ("MaxPool", dict(kernel_shape=[2, 3], strides=[1, 2], pads=[0, 1, 1, 0])),
    (
        "AveragePool",
        dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=0),
    ),
    (
        "AveragePool",
        dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1),
    ),
    ("AveragePool", dict(kernel_shape=[2, 2], strides=[2, 2])),
    ("AveragePool", dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    # ceil mode with uneven pads: a window that would start in the end pad is dropped (torch
    # keeps it once the pads are applied by hand: the lowering crops it)
    ("MaxPool", dict(kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 1, 1], ceil_mode=1)),
    (
        "AveragePool",
        dict(
            kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 1, 1], ceil_mode=1, count_include_pad=1
        ),
    ),
]


@pytest.mark.parametrize("op,attrs", POOLS, ids=lambda v: str(v))
def test_pools(tmp_path, op, attrs):
    check(
        tmp_path,
        single(lambda b, x: b.node(op, [x], **attrs), (3, 9, 8), ["batch", 3, None, None]),
        x_of(3, 9, 8),
    )


@pytest.mark.parametrize("axes,keep", [([2, 3], 1), ([2, 3], 0), ([-1], 1), ([1], 0)])
def test_reduce_mean(tmp_path, axes, keep):
    def body(b, x):
        return b.node("ReduceMean", [x], axes=axes, keepdims=keep)

    check(
        tmp_path,
        single(body, (3, 4, 5), ["batch", None, None, None][: 4 - (0 if keep else len(axes))]),
        x_of(3, 4, 5),
    )


def test_global_average_pool_flatten_gemm(tmp_path):
    def body(b, x):
        f = b.node("Flatten", [b.node("GlobalAveragePool", [x])], axis=1)
        return b.node("Gemm", [f, b.weights(5, 3), b.weights(5)], transB=1)

    m = check(tmp_path, single(body, (3, 4, 4), ["batch", 5]), x_of(3, 4, 4))
    assert m.op_kinds() == ["transpose", "global_avg_pool", "gemm"]  # flatten is free


def test_flatten_of_a_map_folds_into_the_gemm_weights(tmp_path):
    def body(b, x):  # VGG's classifier: flatten a 3x3 map, Linear
        f = b.node("Flatten", [b.node("Relu", [x])], axis=1)
        return b.node("Gemm", [f, b.weights(5, 4 * 3 * 3), b.weights(5)], transB=1)

    m = check(tmp_path, single(body, (4, 3, 3), ["batch", 5]), x_of(4, 3, 3))
    assert m.op_kinds() == ["transpose", "activation", "reshape", "gemm"]  # a view, no transpose


# ------------------------------------------------------------------ shapes, layout
def test_reshape_from_dynamic_shape_arithmetic(tmp_path):
    def body(b, x):  # x.view(x.size(0), -1), as the TorchScript exporter writes it
        n = b.node("Gather", [b.node("Shape", [x]), b.const(np.array(0, np.int64))], axis=0)
        shape = b.node(
            "Concat",
            [
                b.node("Unsqueeze", [n, b.const(np.array([0], np.int64))]),
                b.const(np.array([-1], np.int64)),
            ],
            axis=0,
        )
        return b.node("Reshape", [b.node("Relu", [x]), shape])

    check(tmp_path, single(body, (3, 4, 5), ["batch", 60]), x_of(3, 4, 5), batch_sizes=(1, 3))


def test_squeeze_unsqueeze_transpose_softmax(tmp_path):
    def body(b, x):
        y = b.node(
            "Squeeze", [b.node("GlobalAveragePool", [x]), b.const(np.array([3, 2], np.int64))]
        )
        y = b.node("Unsqueeze", [y, b.const(np.array([1], np.int64))])  # [N, 1, C]
        y = b.node("Transpose", [y], perm=[0, 2, 1])  # [N, C, 1]
        y = b.node("Reshape", [y, b.const(np.array([0, -1], np.int64))])
        return b.node("Softmax", [y], axis=-1)

    check(tmp_path, single(body, (6, 3, 3), ["batch", 6]), x_of(6, 3, 3))


def test_flatten_at_a_negative_axis(tmp_path):
    def body(b, x):  # axis -3 of a 4-D tensor is axis 1 (ONNX takes axis in [-r, r])
        return b.node("Flatten", [b.node("Relu", [x])], axis=-3)

    check(tmp_path, single(body, (3, 4, 5), ["batch", 60]), x_of(3, 4, 5))


def test_squeeze_without_axes_keeps_a_batch_of_one(tmp_path):
    def body(b, x):  # x.squeeze() as the TorchScript exporter writes it: no axes
        return b.node("Squeeze", [b.node("ReduceMean", [x], axes=[2])])

    model = single(body, (3, 4, 5), ["batch", 3, 5], opset=11)
    m = check(tmp_path, model, x_of(3, 4, 5), batch_sizes=(2, 3))
    if torch is not None:  # the batch's axis stays at a batch of one, as on the native backend
        x = x_of(3, 4, 5)[:1]
        with torch.no_grad():
            got = lower(m)(torch.from_numpy(x))[0].numpy()
        np.testing.assert_allclose(got, run_host(m.graph(), x)[0], rtol=RTOL, atol=1e-6)


def test_channel_shuffle_concat_split_slice(tmp_path):
    def body(b, x):  # ShuffleNet v2: split channels, branch, concat, shuffle
        a, c = b.node("Split", [x, b.const(np.array([4, 4], np.int64))], n_out=2, axis=1)
        c = b.node("Conv", [c, b.weights(4, 4, 1, 1)], kernel_shape=[1, 1])
        y = b.node("Concat", [a, b.node("Relu", [c])], axis=1)
        y = b.node("Reshape", [y, b.const(np.array([-1, 2, 4, 5, 5], np.int64))])
        y = b.node("Transpose", [y], perm=[0, 2, 1, 3, 4])
        y = b.node("Reshape", [y, b.const(np.array([-1, 8, 5, 5], np.int64))])
        return b.node(
            "Slice",
            [
                y,
                b.const(np.array([1, 0], np.int64)),
                b.const(np.array([7, 4], np.int64)),
                b.const(np.array([1, 3], np.int64)),
            ],
        )

    m = check(tmp_path, single(body, (8, 5, 5), ["batch", 6, 5, 4]), x_of(8, 5, 5))
    assert m.op_kinds().count("transpose") == 3  # input, the shuffle itself, output


def test_layer_norm_over_channels_last(tmp_path):
    def body(b, x):
        t = b.node("Transpose", [x], perm=[0, 2, 3, 1])
        y = b.node("LayerNormalization", [t, b.weights(6), b.weights(6)], axis=-1, epsilon=1e-6)
        return b.node("Transpose", [y], perm=[0, 3, 1, 2])

    check(tmp_path, single(body, (6, 4, 3), ["batch", 6, 4, 3]), x_of(6, 4, 3))


# ------------------------------------------------------------------ networks
def test_small_network_matches_the_reference(tmp_path):
    model = small_net()
    m = check(tmp_path, model, x_of(3, 16, 16), batch_sizes=(1, 3))
    assert [o.name for o in m.outputs] == ["logits", "prob"]
    assert m.inputs[0].name == "x" and m.inputs[0].shape == (-1, 3, 16, 16)
    kinds = m.op_kinds()
    for k in ("conv2d_grouped", "concat", "pool2d", "maxpool2d", "gemm", "softmax", "binary"):
        assert k in kinds


def test_resnet50_imports_op_for_op_as_the_native_graph(tmp_path):
    from pipeline.models import resnet50 as r50

    sd = r50.random_state_dict(0)
    m = _load(tmp_path, resnet50(sd, 64), "r50")
    feed = ImageFeed(r50.MEAN, r50.STD)
    native = r50.build(sd, image_size=64)
    imported = m.graph(feed)
    assert [n.op.name for n in imported.nodes] == [n.op.name for n in native.nodes]
    assert len(native.nodes) == 57
    img = np.random.default_rng(2).integers(0, 256, (2, 64, 64, 3), dtype=np.uint8)
    want = run_host(native, img)[0]
    np.testing.assert_allclose(run_host(imported, img)[0], want, rtol=1e-5, atol=1e-5)
    # the model's own FP32 NCHW input gives the same logits
    x = ((img / 255.0 - np.array(r50.MEAN)) / np.array(r50.STD)).transpose(0, 3, 1, 2)
    got = run_host(m.graph(), x.astype(np.float32))[0]
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=1e-4 * float(np.abs(want).max()))
