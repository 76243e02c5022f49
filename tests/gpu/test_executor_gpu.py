"""ResNet-50 against torchvision, graph replay against eager, naive against real, 50 threads;
who finishes a batch (the thread that waits, the completion thread for awaiters and bounded
waits, and batches nobody waits for), with one event per staging slot."""

from __future__ import annotations

import asyncio
from collections import deque

import numpy as np
import pytest

from pipeline.config import ExecutorConfig
from pipeline.executor import GpuExecutor
from pipeline.imaging import encode_jpeg
from pipeline.models import digits, resnet50
from pipeline.models.registry import LoadedModel, model_info
from tests.threads import all_at_once

pytestmark = pytest.mark.gpu


def torchvision_state(seed: int = 0):
    """torchvision's resnet50 with its own random init, batch norms perturbed, as numpy."""
    import torch
    import torchvision

    torch.manual_seed(seed)
    m = torchvision.models.resnet50(weights=None).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, mod in m.named_modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                c = mod.num_features
                mod.running_mean.copy_(torch.randn(c, generator=g) * 0.1)
                mod.running_var.copy_(torch.rand(c, generator=g) * 1.5 + 0.5)
                mod.bias.copy_(torch.randn(c, generator=g) * 0.1)
                scale = 0.3 if name.endswith("bn3") else 1.0  # keep 16 residual sums in fp16 range
                mod.weight.copy_((torch.rand(c, generator=g) * 0.5 + 0.75) * scale)
    sd = {
        k: v.detach().numpy().astype(np.float32)
        for k, v in m.state_dict().items()
        if not k.endswith("num_batches_tracked")
    }
    return m, sd


def photos() -> np.ndarray:
    """scikit-image's bundled photos through Ferry's own decode path (JPEG, centre crop)."""
    import skimage.data as d

    from pipeline.imaging import decode

    target = model_info("resnet50").target()
    imgs = []
    for name in (
        "chelsea",
        "astronaut",
        "coffee",
        "rocket",
        "hubble_deep_field",
        "immunohistochemistry",
    ):
        img = getattr(d, name)()
        imgs.append(decode(encode_jpeg(img, 95), "image/jpeg", target, 40_000_000))
    return np.stack(imgs)


@pytest.fixture(scope="module")
def parity():
    import torch

    tmodel, sd = torchvision_state(0)
    images = photos()
    x = (images / 255.0 - np.array(resnet50.MEAN)) / np.array(resnet50.STD)
    with torch.no_grad():
        ref = (
            tmodel.cuda()
            .float()(torch.from_numpy(x.transpose(0, 3, 1, 2).copy()).float().cuda())
            .cpu()
            .numpy()
        )
    return sd, images, ref


def executor(**kw) -> GpuExecutor:
    cfg = dict(backend="cupy", buckets=(1, 2, 4, 8), pool_limit_bytes=16 << 30)
    cfg.update(kw)
    return GpuExecutor(ExecutorConfig(**cfg))


def test_resnet50_fp16_matches_torchvision(parity):
    sd, images, ref = parity
    ex = executor()
    ex.load(LoadedModel("r", model_info("resnet50"), resnet50.build(sd, "r"), False, "torchvision"))
    ex.warmup()
    got = ex.infer("r", images).astype(np.float32)
    err = np.abs(got - ref).max() / np.abs(ref).max()
    print(f"resnet50 fp16 vs torchvision fp32: max relative error of the logits {err:.2e}")
    assert err <= 1e-2
    for g, r in zip(got, ref, strict=True):
        top_g, top_r = np.argsort(-g)[:5], np.argsort(-r)[:5]
        # the same top-5; a swap is allowed only between classes whose torch logits are
        # closer than the fp16 error itself
        tol = 2e-2 * np.abs(r).max()
        for a, b in zip(top_g, top_r, strict=True):
            assert a == b or abs(r[a] - r[b]) < tol, (top_g, top_r)
    ex.close()


def test_graph_replay_equals_eager_and_naive_equals_real(parity):
    sd, images, _ = parity
    outs = {}
    for name, kw in {
        "graph": {},
        "eager": {"mode": "eager"},
        "naive": {"mode": "naive"},
    }.items():
        ex = executor(**kw)
        ex.load(
            LoadedModel("r", model_info("resnet50"), resnet50.build(sd, "r"), False, "torchvision")
        )
        ex.warmup()
        outs[name] = ex.infer("r", images[:4])
        s = ex.stats()
        if name == "graph":
            assert s["graph_replays"] > 0 and s["captures"] > 0
        if name == "eager":
            assert s["captures"] == 0
        ex.close()
    scale = float(np.abs(outs["eager"]).max())
    d_graph = float(np.abs(outs["graph"].astype(np.float32) - outs["eager"]).max())
    d_naive = float(np.abs(outs["naive"].astype(np.float32) - outs["graph"]).max())
    print(
        f"graph vs eager: max |diff| {d_graph:.3g}; naive vs real: {d_naive:.3g} (logit scale {scale:.3g})"
    )
    assert d_graph <= 1e-3 * scale  # same kernels; identical in practice
    assert d_naive <= 1e-3 * scale


def test_digits_on_the_gpu_keeps_its_accuracy():
    _, _, xte, yte = digits.load_split()
    ex = executor(buckets=(1, 16, 128))
    ex.load_model("digits", "digits")
    ex.warmup()
    acc = float((ex.infer("digits", xte).argmax(1) == yte).mean())
    print(f"digits held-out accuracy on the GPU (fp16): {acc:.4f}")
    assert acc >= 0.97
    ex.close()


def test_a_batch_mixing_device_and_host_rows_equals_the_host_batch():
    """Device rows (GPU preprocessing) beside host rows: the host rows go up on the copy
    stream, the device rows are copied on the device; nothing is fetched to the host."""
    import cupy

    _, _, xte, _ = digits.load_split()
    ex = executor(buckets=(1, 8, 16))
    ex.load_model("digits", "digits")
    rows = list(xte[:11])
    want = ex.commit(ex.prepare("digits", 11), np.stack(rows)).wait(30)
    mixed = [cupy.asarray(r) if i % 3 else r for i, r in enumerate(rows)]
    got = ex.commit(ex.prepare("digits", 11), mixed).wait(30)
    np.testing.assert_array_equal(got, want)
    every = ex.commit(ex.prepare("digits", 11), [cupy.asarray(r) for r in rows]).wait(30)
    np.testing.assert_array_equal(every, want)
    ex.close()


def test_device_rows_as_views_of_fitted_batches_are_copied_by_runs():
    """Rows as the GPU preprocess stage hands them over -- views of its fits' batches, so
    a round's rows are consecutive in memory -- interleaved from two batches, with a strided
    row and a bucket's padding: the same answers as the host batch (one ``memcpyAsync`` a
    run, ``row_runs``; a copy kernel for the strided row; the bucket's padding set by a
    memset, which no row's answer reads)."""
    import cupy

    _, _, xte, _ = digits.load_split()
    ex = executor(buckets=(16,))
    ex.load_model("digits", "digits")
    rows = list(xte[:11])
    want = ex.commit(ex.prepare("digits", 11), np.stack(rows)).wait(30)
    one, two = cupy.asarray(np.stack(rows[:6])), cupy.asarray(np.stack(rows[6:]))
    flipped = cupy.asarray(np.ascontiguousarray(rows[10][::-1]))[::-1]  # strided, same values
    assert not flipped.flags.c_contiguous
    views = [one[0], one[1], one[2], two[0], two[1], one[3], one[4], one[5], two[2], two[3]]
    views.append(flipped)
    order = [0, 1, 2, 6, 7, 3, 4, 5, 8, 9, 10]  # which host row each view holds
    want_mixed = ex.commit(ex.prepare("digits", 11), np.stack([rows[k] for k in order])).wait(30)
    for _ in range(3):  # each slot and arena of the ring
        got = ex.commit(ex.prepare("digits", 11), views).wait(30)
        np.testing.assert_array_equal(got, want_mixed)
    got = ex.commit(
        ex.prepare("digits", 11), [one[k] for k in range(6)] + [two[k] for k in range(5)]
    ).wait(30)
    np.testing.assert_array_equal(got, want)
    ex.close()


def test_50_threads_committing_concurrently():
    ex = executor(buckets=(1, 2, 4, 8, 16), max_in_flight=3)
    ex.load_model("r", "resnet50", seed=0)
    ex.load_model("digits", "digits")
    ex.warmup()
    allocs = ex.pool.stats().driver_allocs
    rng = np.random.default_rng(0)
    inputs = [
        (
            ("r", rng.integers(0, 256, (1 + i % 9, 224, 224, 3), dtype=np.uint8))
            if i % 2
            else ("digits", rng.integers(0, 256, (1 + i % 16, 8, 8, 1), dtype=np.uint8))
        )
        for i in range(100)
    ]
    expected = [ex.infer(m, x) for m, x in inputs]
    got: dict[int, np.ndarray] = {}

    def worker(k):
        for i in range(k, len(inputs), 50):
            m, x = inputs[i]
            got[i] = ex.commit(ex.prepare(m, len(x)), x).wait(60)

    all_at_once(50, worker, timeout=120)
    for i, e in enumerate(expected):
        np.testing.assert_array_equal(got[i], e)
    s = ex.stats()
    print(
        f"50 threads: {s['batches']} batches, {s['graph_replays']} graph replays, "
        f"max in flight {s['max_in_flight_seen']}, pool {s['pool']}"
    )
    assert s["pool"]["bytes_in_use"] == 0 and s["in_flight"] == 0
    assert s["pool"]["driver_allocs"] == allocs, "a driver allocation after warm-up"
    ex.close()


def three_in_flight(ex: GpuExecutor, chunks: list[np.ndarray]) -> list[np.ndarray]:
    """Each chunk's answer, from one thread with three batches out: it waits on the oldest
    (finishing it itself) before committing the next, as bench_models' loop does."""
    got, pending = [], deque()
    for x in chunks:
        if len(pending) >= 3:
            got.append(pending.popleft().wait())
        pending.append(ex.commit(ex.prepare("digits", len(x)), x))
    return got + [r.wait() for r in pending]


def test_a_waiting_thread_finishes_its_batches_and_each_slot_keeps_its_events():
    """prepare/commit/wait from one thread, 3 in flight: the waiting thread finishes every
    batch itself (the completion thread never starts), the events are the slots' own (made
    once per slot), and one stream per in-flight batch (compute_streams >= max_in_flight:
    copies, graph and event on the arena's stream) answers as the copy streams do."""
    _, _, xte, _ = digits.load_split()
    chunks = [xte[i * 7 : i * 7 + 1 + i % 16] for i in range(40)]
    answers = {}
    for streams in (1, 3):
        ex = executor(buckets=(1, 8, 16), max_in_flight=3, compute_streams=streams)
        ex.load_model("digits", "digits")
        ex.warmup()
        assert ex.mode.one_stream == (streams == 3)
        s0 = ex.stats()
        got = three_in_flight(ex, chunks)
        s = ex.stats()
        assert ex.completions._thread is None  # no second thread was woken for a batch
        assert len(ex.mode._events) == ex.ring.slots
        ran = s["graph_replays"] - s0["graph_replays"], s["eager_runs"] - s0["eager_runs"]
        print(f"{streams} compute streams: {ran[0]} replays, {ran[1]} eager runs")
        assert sum(ran) == len(chunks) and ran[0] > 0 and s["in_flight"] == 0
        assert s["pool"]["bytes_in_use"] == 0 and ex.ring.available() == ex.ring.slots
        answers[streams] = got
        ex.close()
    for a, b in zip(answers[1], answers[3], strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_spinning_batch_wait_answers_as_the_sleeping_one():
    """``executor.batch_wait: spin`` (plain completion events, the engine benchmarks'
    experiment) answers every batch as ``sleep`` does, the waiting thread finishing each."""
    _, _, xte, _ = digits.load_split()
    chunks = [xte[i * 5 : i * 5 + 1 + i % 8] for i in range(24)]
    answers = {}
    for wait in ("sleep", "spin"):
        ex = executor(buckets=(1, 8), max_in_flight=3, compute_streams=3, batch_wait=wait)
        ex.load_model("digits", "digits")
        ex.warmup()
        got = three_in_flight(ex, chunks)
        assert ex.completions._thread is None and ex.stats()["in_flight"] == 0
        answers[wait] = got
        ex.close()
    for a, b in zip(answers["sleep"], answers["spin"], strict=True):
        np.testing.assert_array_equal(a, b)


def test_awaiters_bounded_waits_and_batches_nobody_waits_for():
    """Awaited batches and bounded waits finish on the completion thread; batches whose
    results are dropped hold their slots only until a prepare needs one (it finishes the
    oldest of them itself) or until ``in_flight`` finds their events complete."""
    _, _, xte, _ = digits.load_split()
    ex = executor(buckets=(1, 8), max_in_flight=2, staging_timeout_s=5.0)
    ex.load_model("digits", "digits")
    ex.warmup()
    x = xte[:8]
    want = ex.infer("digits", x)

    async def awaited():  # all six committed before the first await: two slots for six
        results = [ex.commit(ex.prepare("digits", 8), x) for _ in range(6)]
        return await asyncio.gather(*results)

    for got in asyncio.run(awaited()):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(ex.commit(ex.prepare("digits", 8), x).wait(30), want)
    assert ex.completions._thread is not None  # the bounded wait went through it
    for _ in range(7):  # results dropped at once: each prepare past two finishes the oldest
        ex.commit(ex.prepare("digits", 8), x)
    ex.streams.synchronize()
    assert ex.in_flight == 0  # what was left is found complete and finished
    s = ex.stats()
    assert s["pool"]["bytes_in_use"] == 0 and ex.ring.available() == ex.ring.slots
    assert s["failed"] == 0
    ex.close()


def test_kept_arenas_replay_every_batch_after_the_warm_up_while_other_memory_churns():
    """``executor.arenas: kept``: with the pool also handing out buffers of other sizes
    between batches (as the GPU fitter's), every batch after the warm-up replays a graph --
    none is captured -- on at most max_in_flight arenas, with the pooled executor's answers;
    the pooled one, under the same churn, says how many captures it paid."""
    _, _, xte, _ = digits.load_split()
    chunks = [xte[i : i + 1 + i % 16] for i in range(0, 430, 7)]  # 62 batches, every bucket
    seen: dict[str, tuple[list[np.ndarray], dict]] = {}
    for arenas in ("pooled", "kept"):
        ex = executor(buckets=(1, 2, 4, 8, 16), max_in_flight=3, arenas=arenas)
        ex.load_model("digits", "digits")
        ex.warmup()
        before = ex.stats()
        got, pending, held = [], deque(), []
        for k, x in enumerate(chunks):
            held.append(ex.pool.reserve(4096 * (1 + k % 7)))  # another user's buffers
            if len(held) > 5:
                held.pop(0).release()
            if len(pending) >= 3:
                got.append(pending.popleft().wait())
            pending.append(ex.commit(ex.prepare("digits", len(x)), x))
        got += [r.wait() for r in pending]
        for r in held:
            r.release()
        after = ex.stats()
        delta = {k: after[k] - before[k] for k in ("captures", "graph_replays", "eager_runs")}
        seen[arenas] = (got, delta)
        print(f"arenas {arenas}: after the warm-up {delta} over {len(chunks)} batches")
        if arenas == "kept":
            assert delta["captures"] == 0 and delta["graph_replays"] == len(chunks)
            assert ex.mode.kept.count("digits", "image") <= 3
        ex.close()
    for a, b in zip(*(seen[k][0] for k in ("pooled", "kept")), strict=True):
        np.testing.assert_array_equal(a, b)
