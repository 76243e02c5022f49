"""The engine interface: the native engine behind it, the registry of engines."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.config import ExecutorConfig
from pipeline.engines import ENGINES, builder
from pipeline.engines.base import EnginePlan
from pipeline.errors import InvalidInput
from pipeline.executor import GpuExecutor
from pipeline.models.registry import load_model


def test_native_engine_plans_without_binding_and_both_feeds_share_a_plan():
    m = load_model("d", "digits")
    eng = m.engine
    assert eng.name == "native"
    assert [(t.name, t.dtype, t.shape) for t in eng.inputs] == [("image", "uint8", (-1, 8, 8, 1))]
    assert [(t.name, t.shape) for t in eng.outputs] == [("logits", (-1, 10))]
    p = eng.plan(4, "image")
    assert isinstance(p, EnginePlan) and p.bucket == 4 and p.arena_bytes > 0
    assert p.input_spec.shape == (4, 8, 8, 1) and p.output_specs[0].shape == (4, 10)
    assert eng.plan(4, "tensors") is p  # the graph's own input is the image
    assert p.flops > 0


def test_executor_runs_the_native_engine_through_the_interface():
    ex = GpuExecutor(ExecutorConfig(backend="numpy", buckets=(1, 4)))
    m = load_model("d", "digits")
    ex.load(m)
    x = np.random.default_rng(0).integers(0, 256, (3, 8, 8, 1), dtype=np.uint8)
    a = ex.infer("d", x)
    b = ex.infer("d", x, feed="tensors")
    np.testing.assert_array_equal(a, b)
    # the same numbers as the graph run by hand on its own arena
    plan = m.graph.prepare(4, "float32", "host")
    arena = np.zeros(plan.arena_bytes, np.uint8)
    bound = plan.bind(arena, m.graph.constant_arrays("float32"))
    bound.input[:3] = x
    bound.input[3:] = 0
    from pipeline.device import Backend, Stream

    bound.run(Stream("t", Backend("numpy")))
    np.testing.assert_allclose(a, bound.outputs[0][:3], rtol=1e-6)
    ex.close()


def test_engine_registry_names_what_is_missing(monkeypatch, tmp_path):
    assert {"native", "torch", "onnx"} <= set(ENGINES)
    with pytest.raises(InvalidInput) as info:
        builder("tensorrt")
    assert info.value.fields["engine"] == "tensorrt"
    # an engine registered before its file exists says so at load time
    monkeypatch.setitem(ENGINES, "future", "pipeline.engines.future:build")
    with pytest.raises(InvalidInput, match="the future engine is not available yet"):
        builder("future")
    # an engine whose package is missing names it
    d = tmp_path / "engines_extra"
    d.mkdir()
    (d / "needy_engine.py").write_text("import no_such_package_xyz\n")
    monkeypatch.syspath_prepend(str(d))
    monkeypatch.setitem(ENGINES, "needy", "needy_engine:build")
    with pytest.raises(InvalidInput, match="needs a package") as info:
        builder("needy")
    assert info.value.fields["missing"] == "no_such_package_xyz"
    assert callable(builder("native"))


def test_pool_account_counts_bytes_held_elsewhere_against_the_limit():
    from pipeline.device import Backend
    from pipeline.errors import ResourceExhausted
    from pipeline.memory import make_pool

    pool = make_pool(Backend("numpy"), 4 << 20, 0.5)
    r = pool.account(3 << 20)
    assert pool.bytes_in_use == 3 << 20
    with pytest.raises(ResourceExhausted):
        pool.reserve(2 << 20)
    r.release()
    assert pool.bytes_in_use == 0
    pool.reserve(2 << 20).release()
