"""The importer's ops on cupy: small ONNX models (every op family of tests/unit/test_onnx_import)
run on the GPU in fp32 and fp16 against onnx's ReferenceEvaluator, eagerly and replayed from
a CUDA graph. Where a torchvision model of test_onnx_gpu fails, this names the op."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx.reference import ReferenceEvaluator  # noqa: E402

from pipeline.device import Backend, Stream  # noqa: E402
from pipeline.importers.onnx_graph import load_onnx  # noqa: E402
from tests.onnx_models import small_net  # noqa: E402
from tests.unit import test_onnx_import as cases  # noqa: E402

pytestmark = pytest.mark.gpu
TOL = {"float32": 1e-4, "float16": 2e-2}


def run_cupy(graph, x: np.ndarray, dtype: str, replay: bool) -> list[np.ndarray]:
    import cupy

    backend = Backend("cupy")
    plan = graph.prepare(x.shape[0], dtype, "cuda")
    arena = cupy.zeros(plan.arena_bytes, cupy.uint8)
    consts = {k: cupy.asarray(v) for k, v in graph.constant_arrays(dtype).items()}
    bound = plan.bind(arena, consts)
    bound.input[...] = cupy.asarray(x)
    cupy.cuda.Device().synchronize()  # copies on the null stream; Ferry's streams do not wait on it
    stream = Stream("test", backend)
    if replay:  # one eager run first (kernels compile outside the capture), as the executor does
        bound.run(stream)
        stream.synchronize()
        for o in bound.outputs:
            o.fill(0)
        # the arena reuses the input's bytes once it is dead, as the executor does: a batch's
        # input is staged anew before every run or replay, so it is here too
        bound.input[...] = cupy.asarray(x)
        cupy.cuda.Device().synchronize()
        g = bound.capture(stream)
        g.launch(stream.raw)
    else:
        bound.run(stream)
    stream.synchronize()
    return [cupy.asnumpy(o).astype(np.float32) for o in bound.outputs]


def models():
    out = []
    for c in cases.CONVS:
        for act in (None, "HardSwish"):

            def body(b, x, c=c, act=act):
                y = b.node(
                    "Conv",
                    [
                        x,
                        b.weights(c["cout"], c["cin"] // c["groups"], c["k"], c["k"]),
                        b.weights(c["cout"]),
                    ],
                    kernel_shape=[c["k"]] * 2,
                    strides=[c["stride"]] * 2,
                    pads=c["pads"],
                    group=c["groups"],
                    dilations=[c["dil"]] * 2,
                )
                return b.node(act, [y]) if act else y

            out.append(
                (
                    f"conv{c}{act}",
                    cases.single(body, (c["cin"], 9, 9), ["batch", c["cout"], None, None]),
                    (c["cin"], 9, 9),
                )
            )
    for op, attrs, bounds in cases.ACTS:

        def act_body(b, x, op=op, attrs=attrs, bounds=bounds):
            return b.node(op, [x, *(b.const(np.float32(v)) for v in bounds)], **attrs)

        out.append(
            (
                f"{op}{attrs}{bounds}",
                cases.single(act_body, (4, 3, 3), ["batch", 4, 3, 3], opset=20),
                (4, 3, 3),
            )
        )
    for op, attrs in cases.POOLS:
        out.append(
            (
                f"{op}{attrs}",
                cases.single(
                    lambda b, x, op=op, attrs=attrs: b.node(op, [x], **attrs),
                    (3, 9, 8),
                    ["batch", 3, None, None],
                ),
                (3, 9, 8),
            )
        )
    for op in ("Add", "Mul", "Div"):

        def se(b, x, op=op):
            return b.node(op, [x, b.node("Sigmoid", [b.node("GlobalAveragePool", [x])])])

        out.append((f"se_{op}", cases.single(se, (4, 5, 6), ["batch", 4, 5, 6]), (4, 5, 6)))
    out.append(("small_net", small_net(), (3, 16, 16)))
    return out


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("replay", [False, True], ids=["eager", "cuda_graph"])
@pytest.mark.parametrize("name,model,shape", models(), ids=[m[0] for m in models()])
def test_op_on_the_gpu_matches_the_reference(tmp_path, name, model, shape, dtype, replay):
    path = str(tmp_path / "m.onnx")
    onnx.save(model, path)
    g = load_onnx(path).graph()
    x = np.random.default_rng(0).standard_normal((3, *shape)).astype(np.float32)
    ref = ReferenceEvaluator(model).run(None, {"x": x})
    for got, want in zip(run_cupy(g, x, dtype, replay), ref, strict=True):
        err = float(np.abs(got - want).max() / max(1e-6, float(np.abs(want).max())))
        assert err <= TOL[dtype], (
            f"{name} {dtype}: max rel err {err:.2e} ({[n.op.name for n in g.nodes]})"
        )
