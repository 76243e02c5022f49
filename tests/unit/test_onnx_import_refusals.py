"""The ONNX importer's refusals at load time (each naming the node, the op and what is
supported), and a file whose input name collides with none of Ferry's own; split from
test_onnx_import.py, whose helpers these use."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto  # noqa: E402

from pipeline.errors import ModelRefused  # noqa: E402
from pipeline.importers.onnx_graph import supported_ops  # noqa: E402
from tests.onnx_models import Builder, run_host, tensor, topk_unnamed  # noqa: E402
from tests.unit.test_onnx_import import RTOL, _load, single, x_of  # noqa: E402


def _refused(tmp_path, model) -> ModelRefused:
    with pytest.raises(ModelRefused) as info:
        _load(tmp_path, model)
    return info.value


def test_refuses_an_unsupported_op_naming_node_and_where_the_supported_ones_are(tmp_path):
    model = single(lambda b, x: b.node("LRN", [x], size=3), (4, 3, 3), ["batch", 4, 3, 3])
    err = _refused(tmp_path, model)
    assert err.fields["op"] == "LRN" and err.fields["node"].startswith("LRN")
    n = len(supported_ops())
    assert err.fields["supported"] == f"{n} ops, listed by `ferry models --ops`"
    assert err.message == "this op is not supported; `ferry models --ops` lists the ops that are"
    assert "..." not in str(err)  # nothing in the message is cut short


def test_an_unnamed_node_is_named_by_the_tensor_it_produces(tmp_path):
    err = _refused(tmp_path, topk_unnamed())
    assert err.fields["node"] == "node producing 'scores'" and err.fields["op"] == "TopK"
    assert str(err).startswith(
        "this op is not supported; `ferry models --ops` lists the ops that are "
        "(node=\"node producing 'scores'\", op='TopK', supported="
    )
    assert "(unnamed)" not in str(err)


def test_a_refused_shape_op_lists_every_op_that_computes_on_the_batch(tmp_path):
    from pipeline.importers.onnx_fold import SHAPE_OPS

    model = single(  # Abs of a shape that holds the batch size: not folded symbolically
        lambda b, x: b.node("Reshape", [x, b.node("Abs", [b.node("Shape", [x])])]),
        (4,),
        ["batch", 4],
    )
    err = _refused(tmp_path, model)
    assert err.fields["op"] == "Abs"
    assert err.fields["supported"] == ", ".join(sorted(SHAPE_OPS))  # whole, not 8 and "..."
    assert "..." not in str(err) and "Unsqueeze" in str(err)


def test_refuses_an_unsupported_attribute(tmp_path):
    model = single(
        lambda b, x: b.node("Gelu", [x], approximate="cubic"), (4,), ["batch", 4], opset=20
    )
    err = _refused(tmp_path, model)
    assert err.fields["op"] == "Gelu" and "supported" in err.fields


def test_refuses_an_old_opset(tmp_path):
    err = _refused(tmp_path, single(lambda b, x: b.node("Relu", [x]), (4,), ["batch", 4], opset=9))
    assert err.fields["opset"] == 9 and "supported" in err.fields


def test_refuses_a_non_float_input(tmp_path):
    b = Builder()
    b.node("Cast", ["x"], to=TensorProto.FLOAT)
    b.nodes[-1].output[0] = "y"
    model = b.model([tensor("x", ["batch", 4], TensorProto.INT64)], [tensor("y", ["batch", 4])])
    err = _refused(tmp_path, model)
    assert err.fields["dtype"] == "int64" and err.fields["supported"] == "float32"


def test_refuses_a_matmul_over_the_batch_and_batch_mixing_reshapes(tmp_path):
    """A MatMul of two computed tensors runs batched (tests/unit/test_onnx_transformers.py);
    one that contracts the batch axis, or a reshape that splits a batch item across
    dimensions, would mix a bucket's rows (padding would change answers): refused."""
    err = _refused(
        tmp_path,
        single(
            lambda b, x: b.node("MatMul", [b.node("Transpose", [x], perm=[1, 0]), x]),
            (4,),
            [4, 4],
        ),
    )
    assert err.fields["op"] == "MatMul" and "leading dimension" in err.message
    err = _refused(
        tmp_path,
        single(
            lambda b, x: b.node("Reshape", [x, b.const(np.array([2, -1], np.int64))]),
            (4,),
            [2, None],
        ),
    )
    assert err.fields["op"] == "Reshape" and "splits a batch item" in err.message


def test_refusal_survives_pickling():
    import pickle

    err = ModelRefused("this op is not supported", node="n1", op="LRN", supported=("Conv",))
    assert pickle.loads(pickle.dumps(err)) == err


def test_a_file_whose_input_is_called_input_imports(tmp_path):
    """torch.onnx.export names the input "input": the importer's own tensors must not collide
    (found by bench_models on the H200)."""
    b = Builder(0)
    b.nodes.append(onnx.helper.make_node("Relu", ["input"], ["normalize"]))
    model = b.model(
        [tensor("input", ["batch", 3, 4, 4])], [tensor("normalize", ["batch", 3, 4, 4])], 17
    )
    m = _load(tmp_path, model)
    x = x_of(3, 4, 4)
    (got,) = run_host(m.graph(), x[:2])
    np.testing.assert_allclose(got, np.maximum(x[:2], 0), rtol=RTOL)
