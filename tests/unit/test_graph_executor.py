"""Graphs, arenas, models and the executor on the CPU backend."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.config import ExecutorConfig
from pipeline.errors import InvalidInput, ModelNotFound, ResourceExhausted
from pipeline.executor import GpuExecutor
from pipeline.graph import Graph
from pipeline.models import digits, resnet50
from pipeline.models.registry import LoadedModel, labels, load_model, model_info
from pipeline.models.weights import load_weights, save_weights
from pipeline.ops import NORMALIZE
from tests.reference import batchnorm_ref
from tests.threads import all_at_once

# ----------------------------------------------------------------------------- arena


@pytest.mark.parametrize("batch", [1, 8])
def test_arena_reuses_memory_and_live_tensors_never_overlap(batch):
    g = resnet50.build(resnet50.random_state_dict(0), image_size=64)
    plan = g.prepare(batch, "float32", "host", max_workspace_bytes=1 << 20)
    assert plan.arena_bytes < plan.total_tensor_bytes / 3  # liveness reuse pays a lot
    roots = [
        (name, plan.offsets[name], plan.specs[name].nbytes, plan.live[name]) for name in plan.live
    ]
    for i, (na, oa, sa, (fa, la)) in enumerate(roots):
        assert oa + sa <= plan.arena_bytes
        for nb, ob, sb, (fb, lb) in roots[i + 1 :]:
            if fa <= lb and fb <= la:  # both alive at some step
                assert oa + sa <= ob or ob + sb <= oa, f"{na} and {nb} overlap while both live"
    # a workspace never overlaps a tensor alive during its step
    for step, (_node, op_plan, ws_off) in enumerate(plan.steps):
        if not op_plan.workspace_bytes:
            continue
        for name, off, size, (first, last) in roots:
            if first <= step <= last:
                assert ws_off + op_plan.workspace_bytes <= off or off + size <= ws_off, name


def test_views_share_their_input_bytes():
    g = digits.build(load_weights(digits.WEIGHTS))
    plan = g.prepare(4)
    assert plan.offsets["flatten"] == plan.offsets["conv2"]
    assert plan.specs["flatten"].shape == (4, 512)


def test_graph_rejects_unknown_tensors_and_reports_the_node():
    g = digits.build(load_weights(digits.WEIGHTS))
    with pytest.raises(ValueError):
        g.add(g.nodes[0].op, ["nope"], "x")
    bad = Graph("bad", "image", (8, 8, 5), "uint8")  # five channels: not an image
    bad.set_outputs(bad.add(NORMALIZE, ["image"], "normalize"))
    with pytest.raises(InvalidInput) as info:
        bad.prepare(1)
    assert info.value.fields["node"] == "normalize" and info.value.fields["channels"] == 5


# ----------------------------------------------------------------------------- ResNet-50 parity


def _conv_ref(x, w, stride, pad):
    """Convolution by shifted windows and einsum: no im2col, no shared code."""
    n, h, wd, c = x.shape
    cout, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    oh, ow = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    out = np.zeros((n, oh, ow, cout))
    for i in range(kh):
        for j in range(kw):
            win = xp[:, i : i + stride * oh : stride, j : j + stride * ow : stride, :]
            out += np.einsum("nhwc,oc->nhwo", win, w[:, :, i, j])
    return out


def resnet50_reference(sd, images_u8):
    """A straightforward float64 ResNet-50 forward with unfused batch norm."""
    x = (images_u8 / 255.0 - np.array(resnet50.MEAN)) / np.array(resnet50.STD)

    def bn(t, name):
        return batchnorm_ref(
            t,
            sd[f"{name}.weight"],
            sd[f"{name}.bias"],
            sd[f"{name}.running_mean"],
            sd[f"{name}.running_var"],
        )

    relu = lambda t: np.maximum(t, 0)  # noqa: E731
    x = relu(bn(_conv_ref(x, sd["conv1.weight"], 2, 3), "bn1"))
    xp = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)), constant_values=-np.inf)
    oh = (x.shape[1] + 2 - 3) // 2 + 1
    ow = (x.shape[2] + 2 - 3) // 2 + 1
    x = np.max(
        [xp[:, i : i + 2 * oh : 2, j : j + 2 * ow : 2] for i in range(3) for j in range(3)], axis=0
    )
    for prefix, _cin, _w, stride, down in resnet50.block_names():
        y = relu(bn(_conv_ref(x, sd[f"{prefix}.conv1.weight"], 1, 0), f"{prefix}.bn1"))
        y = relu(bn(_conv_ref(y, sd[f"{prefix}.conv2.weight"], stride, 1), f"{prefix}.bn2"))
        y = bn(_conv_ref(y, sd[f"{prefix}.conv3.weight"], 1, 0), f"{prefix}.bn3")
        idn = (
            bn(
                _conv_ref(x, sd[f"{prefix}.downsample.0.weight"], stride, 0),
                f"{prefix}.downsample.1",
            )
            if down
            else x
        )
        x = relu(y + idn)
    x = x.mean(axis=(1, 2))
    return x @ sd["fc.weight"].T + sd["fc.bias"]


def _perturbed_state(seed):
    """Random weights with non-trivial batch norms, so folding is really tested."""
    rng = np.random.default_rng(seed)
    sd = resnet50.random_state_dict(seed)
    for k in list(sd):
        if k.endswith("running_var"):
            sd[k] = rng.uniform(0.5, 2.0, sd[k].shape).astype(np.float32)
        elif k.endswith("running_mean") or k.endswith(".bias") and not k.startswith("fc"):
            sd[k] = rng.normal(0, 0.1, sd[k].shape).astype(np.float32)
    return sd


def test_resnet50_on_cpu_equals_an_unfused_reference():
    sd = _perturbed_state(3)
    g = resnet50.build(sd, image_size=64)
    ex = GpuExecutor(ExecutorConfig(backend="numpy", buckets=(1, 2, 4)))
    ex.load(LoadedModel("r", resnet50_info(), g, True, "test"))
    images = np.random.default_rng(0).integers(0, 256, (3, 64, 64, 3), dtype=np.uint8)
    got = ex.infer("r", images)
    ref = resnet50_reference(sd, images.astype(np.float64))
    assert got.shape == (3, 1000)
    err = np.abs(got - ref).max() / np.abs(ref).max()
    assert err < 1e-4, err
    ex.close()


def resnet50_info():
    return model_info("resnet50")


# ----------------------------------------------------------------------------- digits


def test_digits_reaches_97_percent_through_the_executor():
    _, _, xte, yte = digits.load_split()
    ex = GpuExecutor(ExecutorConfig(backend="numpy", buckets=(1, 8, 64)))
    ex.load_model("digits", "digits")
    logits = ex.infer("digits", xte)
    acc = float((logits.argmax(1) == yte).mean())
    assert acc >= 0.97, acc
    ex.close()


def test_labels():
    assert labels("digits") == tuple(str(i) for i in range(10))
    assert len(labels("resnet50")) == 1000


def test_weights_round_trip_npz_and_safetensors(tmp_path):
    sd = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(4, np.float16)}
    for ext in ("npz", "safetensors"):
        p = str(tmp_path / f"w.{ext}")
        save_weights(p, sd)
        back = load_weights(p)
        assert set(back) == set(sd)
        for k in sd:
            np.testing.assert_array_equal(back[k], sd[k])
            assert back[k].dtype == sd[k].dtype
    with pytest.raises(InvalidInput):
        load_weights(str(tmp_path / "missing.npz"))
    (tmp_path / "bad.safetensors").write_bytes(b"\x01")
    with pytest.raises(InvalidInput):
        load_weights(str(tmp_path / "bad.safetensors"))


def test_random_weights_are_flagged_and_seeded():
    a = load_model("r", "resnet50", seed=1)
    b = load_model("r", "resnet50", seed=1)
    assert a.random_weights and a.source == "random(seed=1)"
    np.testing.assert_array_equal(a.graph.constants["fc.w"].array, b.graph.constants["fc.w"].array)
    d = load_model("d", "digits")
    assert not d.random_weights


# ----------------------------------------------------------------------------- executor


@pytest.fixture
def digits_executor():
    ex = GpuExecutor(ExecutorConfig(backend="numpy", buckets=(1, 2, 4, 8, 16), max_in_flight=4))
    ex.load_model("digits", "digits")
    yield ex
    ex.close()


def test_commits_from_16_threads_equal_one_at_a_time(digits_executor):
    ex = digits_executor
    _, _, xte, _ = digits.load_split()
    chunks = [xte[i : i + 1 + i % 13] for i in range(0, 320, 10)]
    expected = [ex.infer("digits", c) for c in chunks]
    got: dict[int, np.ndarray] = {}

    def worker(k):
        for i in range(k, len(chunks), 16):
            p = ex.prepare("digits", len(chunks[i]))
            got[i] = ex.commit(p, chunks[i]).wait(30)

    all_at_once(16, worker)
    for i, e in enumerate(expected):
        np.testing.assert_array_equal(got[i], e)
    assert ex.pool.stats().bytes_in_use == 0
    assert ex.ring.available() == ex.ring.slots


def test_a_commit_that_raises_returns_its_reservation(digits_executor):
    ex = digits_executor
    p = ex.prepare("digits", 3)
    assert ex.pool.stats().bytes_in_use > 0 and ex.ring.available() == ex.ring.slots - 1
    with pytest.raises(InvalidInput) as info:
        ex.commit(p, np.zeros((3, 8, 8, 3), np.uint8))  # wrong channel count
    assert info.value.fields["expected"] == (3, 8, 8, 1)
    assert ex.pool.stats().bytes_in_use == 0 and ex.ring.available() == ex.ring.slots
    with pytest.raises(RuntimeError):
        ex.commit(p, np.zeros((3, 8, 8, 1), np.uint8))  # committed once only
    p2 = ex.prepare("digits", 2)
    with pytest.raises(InvalidInput):
        ex.commit(p2, np.zeros((2, 8, 8, 1), np.float32))  # wrong dtype
    assert ex.pool.stats().bytes_in_use == 0


def test_prepared_batch_context_manager_releases_when_not_committed(digits_executor):
    ex = digits_executor
    with ex.prepare("digits", 5) as p:
        assert p.bucket == 8
    assert p.released and ex.pool.stats().bytes_in_use == 0


def test_resource_exhausted_when_the_limit_is_too_small():
    ex = GpuExecutor(ExecutorConfig(backend="numpy", buckets=(1, 64), pool_limit_bytes=4 << 20))
    ex.load(
        LoadedModel(
            "r",
            resnet50_info(),
            resnet50.build(resnet50.random_state_dict(0), image_size=64),
            True,
            "t",
        )
    )
    ex.prepare("r", 1).release()  # a batch of one fits
    with pytest.raises(ResourceExhausted) as info:
        ex.prepare("r", 64)
    assert info.value.fields["limit_bytes"] == 4 << 20
    assert ex.pool.stats().bytes_in_use == 0 and ex.ring.available() == ex.ring.slots
    ex.close()


def test_prepare_checks_model_and_batch(digits_executor):
    ex = digits_executor
    with pytest.raises(ModelNotFound):
        ex.prepare("nope", 1)
    with pytest.raises(InvalidInput):
        ex.prepare("digits", 0)
    with pytest.raises(InvalidInput) as info:
        ex.prepare("digits", 17)
    assert info.value.fields["max_bucket"] == 16


def test_naive_mode_equals_the_real_path():
    _, _, xte, _ = digits.load_split()
    real = GpuExecutor(ExecutorConfig(backend="numpy", buckets=(1, 4, 16)))
    naive = GpuExecutor(ExecutorConfig(backend="numpy", buckets=(1, 4, 16), mode="naive"))
    for ex in (real, naive):
        ex.load_model("digits", "digits")
        ex.warmup()
    np.testing.assert_array_equal(real.infer("digits", xte[:37]), naive.infer("digits", xte[:37]))
    assert naive.stats()["pool"]["reservations"] == 0  # naive never touches the pool
    real.close()
    naive.close()


def test_stats_count_batches_items_and_padding(digits_executor):
    ex = digits_executor
    ex.infer("digits", np.zeros((5, 8, 8, 1), np.uint8))
    s = ex.stats()
    assert s["batches"] == 1 and s["items"] == 5 and s["padded_items"] == 3
    assert s["in_flight"] == 0 and s["pool"]["bytes_in_use"] == 0


def test_commit_takes_a_list_of_rows(digits_executor):
    ex = digits_executor
    rows = [np.full((8, 8, 1), 16 * i, np.uint8) for i in range(5)]
    a = ex.commit(ex.prepare("digits", 5), rows).wait()
    b = ex.commit(ex.prepare("digits", 5), np.stack(rows)).wait()
    np.testing.assert_array_equal(a, b)
    with pytest.raises(InvalidInput):
        ex.commit(ex.prepare("digits", 2), [rows[0], np.zeros((8, 8, 3), np.uint8)])
    assert ex.pool.stats().bytes_in_use == 0


def test_converter_checks_and_writes_weights_that_load_the_same(tmp_path):
    from pipeline.models.convert import main as convert_main

    sd = resnet50.random_state_dict(5)
    sd["bn1.num_batches_tracked"] = np.array(
        7
    )  # torchvision carries these; the converter drops them
    src = str(tmp_path / "sd.npz")
    np.savez(src, **sd)
    dst = str(tmp_path / "resnet50.safetensors")
    assert convert_main(["resnet50", src, dst]) == 0
    loaded = load_model("r", "resnet50", weights=dst)
    assert not loaded.random_weights and loaded.source == dst
    direct = resnet50.build(resnet50.random_state_dict(5), "r")
    for k, c in direct.constants.items():
        np.testing.assert_array_equal(loaded.graph.constants[k].array, c.array)
    bad = dict(sd)
    del bad["fc.weight"]
    np.savez(str(tmp_path / "bad.npz"), **bad)
    with pytest.raises(KeyError):
        convert_main(["resnet50", str(tmp_path / "bad.npz"), str(tmp_path / "x.npz")])


def test_ferry_backend_env_forces_the_backend_of_auto_configs(monkeypatch):
    monkeypatch.setenv("FERRY_BACKEND", "numpy")
    ex = GpuExecutor(ExecutorConfig(backend="auto", buckets=(1,)))
    assert ex.backend.name == "numpy"
    ex.close()
    monkeypatch.setenv("FERRY_BACKEND", "tpu")
    with pytest.raises(ValueError):
        GpuExecutor(ExecutorConfig(backend="auto", buckets=(1,)))
