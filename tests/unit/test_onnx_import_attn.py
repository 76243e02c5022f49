"""The importer's transformer ops one at a time against onnx's ReferenceEvaluator (models
built with ``onnx.helper``, no torch): MatMul of two computed tensors, Softmax over a
middle axis, Pad, strided Slice, Gather of a computed tensor, Expand of a constant to the
batch, transposes that move the batch; and the refusals at load that keep a batch's items
apart, each naming the node."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from pipeline.errors import ModelRefused  # noqa: E402
from tests.unit.test_onnx_import import _load, check, single, x_of  # noqa: E402


def _i64(*v):
    return np.array(v, np.int64)


def test_matmul_of_two_computed_tensors_and_a_transposed_batch(tmp_path):
    def body(b, x):  # x [N, 4, 6]: (x @ x^T) softmax over its middle axis, then @ x
        xt = b.node("Transpose", [x], perm=[0, 2, 1])
        s = b.node("Softmax", [b.node("MatMul", [x, xt])], axis=1)
        y = b.node("MatMul", [s, x])  # [N, 4, 6]
        moved = b.node("Transpose", [y], perm=[1, 0, 2])  # [4, N, 6]: the batch in axis 1
        flat = b.node("Reshape", [moved, b.const(_i64(-1, 6))])  # [4 * N, 6]
        back = b.node("Reshape", [flat, b.const(_i64(4, -1, 6))])
        return b.node("Transpose", [back], perm=[1, 0, 2])

    m = check(tmp_path, single(body, (4, 6), ["batch", 4, 6]), x_of(4, 6), batch_sizes=(1, 3))
    kinds = m.op_kinds()
    assert kinds.count("matmul") == 2 and "softmax_axis" in kinds


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect"])
def test_pad(tmp_path, mode):
    def body(b, x):
        pads = b.const(_i64(0, 0, 1, 2, 0, 0, 2, 1))
        ins = [x, pads] + ([b.const(np.array(1.5, np.float32))] if mode == "constant" else [])
        return b.node("Pad", ins, mode=mode)

    check(tmp_path, single(body, (3, 4, 5), ["batch", 3, 6, 8]), x_of(3, 4, 5))


@pytest.mark.parametrize(
    "mode, pads, shape",
    [
        ("edge", (0, 0, 0, 1, 0, 0, 0, 2), (3, 4, 5)),  # the last axis of a 4-D tensor
        ("reflect", (0, 0, 0, 0, 0, 0, 0, 0), (3, 4, 5)),  # no pad at all
        ("edge", (0, 0, 0, 1, 2, 0, 0, 0, 2, 1), (2, 3, 4, 5)),  # the last two of a 5-D one
    ],
    ids=["edge-last-axis", "reflect-nothing", "edge-5d-last-two"],
)
def test_pad_edge_and_reflect_of_some_spatial_axes(tmp_path, mode, pads, shape):
    def body(b, x):
        return b.node("Pad", [x, b.const(_i64(*pads))], mode=mode)

    check(tmp_path, single(body, shape, ["batch", *[None] * len(shape)]), x_of(*shape))


def test_strided_slice_gather_and_concat_as_swin_and_vit_write_them(tmp_path):
    def body(b, x):  # x [N, 6, 6, 4]: patch merging, then the first row as ViT's x[:, 0]
        parts = []
        for h0, w0 in ((0, 0), (1, 0), (0, 1), (1, 1)):
            parts.append(
                b.node(
                    "Slice",
                    [
                        x,
                        b.const(_i64(h0, w0)),
                        b.const(_i64(6, 6)),
                        b.const(_i64(1, 2)),
                        b.const(_i64(2, 2)),
                    ],
                )  # fmt: skip
            )
        merged = b.node("Concat", parts, axis=-1)  # [N, 3, 3, 16]
        return b.node("Gather", [merged, b.const(np.array(0, np.int64))], axis=1)  # [N, 3, 16]

    check(tmp_path, single(body, (6, 6, 4), ["batch", 3, 16]), x_of(6, 6, 4))


def test_a_constant_expanded_to_the_batch(tmp_path):
    def body(b, x):  # ViT's class token: Expand([1, 1, 4], [N, 1, 4]) then Concat on tokens
        n = b.node("Gather", [b.node("Shape", [x]), b.const(_i64(0))], axis=0)
        shape = b.node("Concat", [n, b.const(_i64(1, -1))], axis=0)
        ones = b.node("Where", [b.node("Equal", [shape, b.const(_i64(-1))]),
                                b.const(_i64(1, 1, 1)), shape])  # fmt: skip
        token = b.const(np.arange(4, dtype=np.float32).reshape(1, 1, 4))
        return b.node("Concat", [b.node("Expand", [token, ones]), x], axis=1)

    m = check(tmp_path, single(body, (3, 4), ["batch", 4, 4]), x_of(3, 4), batch_sizes=(1, 3))
    assert "expand" in m.op_kinds()


def _refused(tmp_path, model) -> ModelRefused:
    with pytest.raises(ModelRefused) as info:
        _load(tmp_path, model)
    return info.value


@pytest.mark.parametrize(
    "body, out, op, message",
    [
        (
            lambda b, x: b.node("Softmax", [x], axis=0),
            ["batch", 4],
            "Softmax",
            "ops along the batch axis are not supported",
        ),
        (
            lambda b, x: b.node("Pad", [x, b.const(_i64(1, 0, 0, 0))]),
            [None, 4],
            "Pad",
            "Pad along the batch axis is not supported",
        ),
        (
            lambda b, x: b.node("Gather", [x, b.const(_i64(0, 2))], axis=1),
            ["batch", 2],
            "Gather",
            "Gather of a computed tensor needs a scalar or a run of indices",
        ),
        (
            lambda b, x: b.node("Transpose", [x], perm=[1, 0]),
            [4, "batch"],
            None,
            "a model output needs the batch as its first dimension",
        ),
    ],
    ids=["softmax-over-the-batch", "pad-the-batch", "gather-scattered", "output-batch-moved"],
)
def test_refused_at_load_naming_the_node(tmp_path, body, out, op, message):
    err = _refused(tmp_path, single(body, (4,), out))
    assert err.message == message
    if op is None:  # no node to name: the output is
        assert err.fields["output"] == "y"
    else:
        assert err.fields["op"] == op and err.fields["node"].startswith(op)


def test_constant_of_the_batch_shape(tmp_path):
    def body(b, x):  # x + ConstantOfShape(Shape(x), 2.5): a filled tensor of the batch's shape
        value = onnx.numpy_helper.from_array(np.array([2.5], np.float32))
        return b.node("Add", [x, b.node("ConstantOfShape", [b.node("Shape", [x])], value=value)])

    m = check(tmp_path, single(body, (3, 4), ["batch", 3, 4]), x_of(3, 4), batch_sizes=(1, 3))
    assert "expand" in m.op_kinds()


def test_cast_to_float_keeps_the_compute_dtype(tmp_path):
    def body(b, x):  # a float Cast computes in the model's dtype (fp16 on a GPU), on both backends
        c = b.node("Cast", [x], to=onnx.TensorProto.FLOAT)
        return b.node("Mul", [c, x])

    check(tmp_path, single(body, (3, 4), ["batch", 3, 4]), x_of(3, 4))


def test_cast_and_constant_of_shape_trace_into_one_graph(tmp_path):
    torch = pytest.importorskip("torch")
    from pipeline.importers.onnx_lower import lower

    def body(b, x):  # what the torch engine compiles: no onnx or numpy call in the forward
        value = onnx.numpy_helper.from_array(np.array([2.5], np.float32))
        filled = b.node("ConstantOfShape", [b.node("Shape", [x])], value=value)
        return b.node("Mul", [b.node("Cast", [x], to=onnx.TensorProto.FLOAT), filled])

    m = check(tmp_path, single(body, (3, 4), ["batch", 3, 4]), x_of(3, 4))
    torch._dynamo.reset()
    compiled = torch.compile(lower(m), fullgraph=True, backend="eager", dynamic=False)
    x = x_of(3, 4)[:2]
    with torch.no_grad():
        got = compiled(torch.from_numpy(x))[0].numpy()
    np.testing.assert_allclose(got, x * 2.5, rtol=1e-6)
