"""GPU preprocessing's planning, on the numpy backend: the resize_crop op (sizes, refusals,
the reference against Pillow), the staging plan (slots, parts, refusals) and GpuFitter's
two phases (what prepare reserves, what comes back, what it refuses with nothing held)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.async_result import CompletionWatcher
from pipeline.device import Backend, Stream
from pipeline.errors import InvalidInput, ResourceExhausted
from pipeline.imaging import fit
from pipeline.memory import PinnedRing, make_pool
from pipeline.ops.base import TensorSpec, align, eager
from pipeline.ops.resize_crop import RESIZE_CROP, table_offsets, target_attrs
from pipeline.preprocess_gpu.fitter import GpuFitter, size_class
from pipeline.preprocess_gpu.plan import plan_staging, runs_within, split_parts
from pipeline.resize_plan import Target

CPU = Backend("numpy")
rng = np.random.default_rng(7)


def _images(shapes, c=3):
    out = []
    for h, w in shapes:
        img = rng.integers(0, 256, (h, w, c), dtype=np.uint8)
        img[: h // 2] //= 3  # structure, not only noise
        out.append(img)
    return out


# ------------------------------------------------------------------ the op
@pytest.mark.parametrize("kind", ["center_crop", "stretch", "letterbox"])
def test_resize_crop_reference_equals_pillows_fit(kind):
    t = Target(24, 20, 3, kind)
    imgs = _images([(30, 47), (24, 20), (11, 70), (100, 9), (3, 2)])
    (out,) = eager(RESIZE_CROP, *imgs, **target_attrs(t))
    assert out.shape == (5, 24, 20, 3) and out.dtype == np.uint8
    for k, img in enumerate(imgs):
        diff = np.abs(out[k].astype(np.int16) - fit(img, t))
        assert diff.max() <= 1 and diff.mean() < 0.3, (kind, img.shape, diff.max())


def test_resize_crop_prepare_sizes_and_refuses():
    t = Target(16, 16, 3, "center_crop")
    specs = [TensorSpec((40, 30, 3), "uint8"), TensorSpec((9, 70, 3), "uint8")]
    plan = RESIZE_CROP.prepare(*specs, **target_attrs(t))
    assert plan.outputs == (TensorSpec((2, 16, 16, 3), "uint8"),)
    assert plan.workspace_bytes == table_offsets(2)[-1] == 3 * 256
    assert plan.flops > 0 and plan.bytes_moved == sum(s.nbytes for s in specs) + 2 * 16 * 16 * 3
    table = RESIZE_CROP.table(plan, [0x1000, 0x2000])
    assert table.nbytes == plan.workspace_bytes
    assert table[:16].view(np.uint64).tolist() == [0x1000, 0x2000]
    geo = table[256 : 256 + 2 * 11 * 4].view(np.int32).reshape(2, 11)
    assert geo[0, :3].tolist() == [40, 30, 90] and geo[0, 9:].tolist() == [16, 16]
    with pytest.raises(InvalidInput, match="channel"):
        RESIZE_CROP.prepare(TensorSpec((4, 4, 1), "uint8"), **target_attrs(t))
    with pytest.raises(InvalidInput, match="rank"):
        RESIZE_CROP.prepare(TensorSpec((4, 4), "uint8"), **target_attrs(t))
    with pytest.raises(InvalidInput, match="dtype"):
        RESIZE_CROP.prepare(TensorSpec((4, 4, 3), "float32"), **target_attrs(t))
    with pytest.raises(InvalidInput, match="pitch"):
        RESIZE_CROP.prepare(TensorSpec((4, 4, 3), "uint8"), pitches=(11,), **target_attrs(t))
    with pytest.raises(InvalidInput, match="aspect ratio"):
        big = Target(224, 224, 3, "center_crop")
        RESIZE_CROP.prepare(TensorSpec((1, 200_000, 3), "uint8"), **target_attrs(big))
    with pytest.raises(InvalidInput, match="height and width"):
        RESIZE_CROP.prepare(TensorSpec((4, 4, 3), "uint8"))
    with pytest.raises(InvalidInput, match="one pointer per image"):
        RESIZE_CROP.table(plan, [1])


def test_resize_crop_reads_rows_through_the_pitch():
    t = Target(8, 8, 3, "stretch")
    padded = _images([(12, 15)])[0]  # rows of 15 pixels, of which the image uses 10
    view = padded[:, :10]
    plan = RESIZE_CROP.prepare(TensorSpec((12, 10, 3), "uint8"), pitches=(45,), **target_attrs(t))
    out = np.empty(plan.outputs[0].shape, np.uint8)
    RESIZE_CROP.commit(plan, [view], [out], None, Stream("t", CPU))
    (want,) = eager(RESIZE_CROP, np.ascontiguousarray(view), **target_attrs(t))
    np.testing.assert_array_equal(out, want)


# ------------------------------------------------------------------ staging plans
def test_staging_plan_stripes_images_over_slots():
    st = plan_staging([1000, None, 5000, 10], 768, 4096)
    assert st.offsets == (0, -1, 1024, 6144) and st.sizes == (1000, 0, 5000, 10)
    assert st.table_offset == 6400 and st.nbytes == 6400 + 768 and st.slots == 2
    assert st.used(0) == 4096 and st.used(1) == 7168 - 4096 and st.used(2) == 0
    # the 5000-byte image straddles slots 0 and 1 and stays contiguous on the device
    assert st.pieces(1024, 5000) == [(0, 1024, 0, 3072), (1, 0, 3072, 1928)]
    assert st.pieces(0, 0) == []


def test_split_parts_fits_the_ring_and_refuses_what_never_can():
    def tb(n):
        return table_offsets(n)[-1]

    sizes = [3000, None, 3000, 3000, 20000, 100, None]
    parts, refused = split_parts(sizes, tb, 4096, 2)  # 8 KiB of staging
    assert sorted(refused) == [4] and isinstance(refused[4], ResourceExhausted)
    assert refused[4].fields["staging_bytes"] == 8192
    assert [i for p in parts for i in p] == [0, 1, 2, 3, 5, 6]
    for p in parts:
        need = sum(align(sizes[i]) for i in p if sizes[i] is not None) + tb(len(p))
        assert need <= 8192
    assert len(parts) == 2  # 3000 + 3000 + table fit, a third 3000 does not
    assert split_parts([], tb, 4096, 2) == ([], {})


# ------------------------------------------------------------------ the fitter
def _fitter(slot_bytes=4096, slots=3, limit=1 << 20, timeout=0.05):
    pool = make_pool(CPU, limit_bytes=limit)
    ring = PinnedRing(CPU, slot_bytes, slots)
    s = Stream("pre", CPU)
    return GpuFitter(CPU, pool, ring, s, Stream("h2d", CPU), CompletionWatcher("t"), timeout)


def test_fitter_prepare_reserves_commit_returns_and_rows_match():
    f = _fitter()
    t = Target(10, 12, 3, "center_crop")
    imgs = _images([(20, 30), (33, 17), (10, 12)])  # 1800 + 1683 + 360 bytes: slots straddled
    out, lease = f.output(t, 3)
    held = f.pool.bytes_in_use
    p = f.prepare(t, imgs, out)
    assert p.staging.slots == 2 and len(p.slots) == 2 and f.ring.available() == 1
    assert f.pool.bytes_in_use == held + p.reservation.nbytes
    assert p.reservation.nbytes == size_class(p.staging.nbytes) >= p.staging.nbytes
    lease.after = f.commit(p)
    assert f.ring.available() == 3 and f.pool.bytes_in_use == held  # back when done
    (want,) = eager(RESIZE_CROP, *imgs, **target_attrs(t))
    np.testing.assert_array_equal(out, want)
    rows = [out[1]]
    del out, lease, p
    assert f.pool.bytes_in_use == held  # a row still holds the batch
    del rows
    assert f.pool.bytes_in_use == 0
    one, _ = f.output(t, 1)
    p = f.prepare(t, imgs[:1], one)
    f.commit(p)
    with pytest.raises(RuntimeError, match="committed once"):
        f.commit(p)


def test_fitter_refuses_with_nothing_held():
    t = Target(8, 8, 3, "stretch")
    imgs = _images([(40, 40), (40, 40)])  # 4800 bytes each
    f = _fitter(slots=2)
    out, _ = f.output(t, 2)
    base = f.pool.bytes_in_use
    big = _images([(60, 60)])  # 10800 bytes: more than 2 slots of 4096
    with pytest.raises(ResourceExhausted, match="more than the pinned ring"):
        f.prepare(t, big, f.output(t, 1)[0])
    taken = [f.ring.acquire(), f.ring.acquire()]  # every slot out: prepare waits, then refuses
    with pytest.raises(ResourceExhausted, match="pinned staging slot"):
        f.prepare(t, imgs[:1], out[:1])
    assert f.pool.bytes_in_use == base and f.ring.available() == 0
    for s in taken:
        s.release()
    small = _fitter(limit=4096)
    out1, _ = small.output(t, 1)
    with pytest.raises(ResourceExhausted, match="pool limit"):
        small.prepare(t, imgs[:1], out1)  # the batch holds 512 of 4096; staging needs more
    assert small.ring.available() == 3
    with pytest.raises(InvalidInput, match="does not fit"):
        f.prepare(t, imgs, out[:1])


def test_fitter_parts_split_a_batch_bigger_than_the_ring():
    f = _fitter(slots=2)
    t = Target(8, 8, 3, "stretch")
    imgs = _images([(30, 30), (30, 30), (30, 30), (60, 60)])  # 2700 each; the last is 10800
    parts, refused = f.parts(t, imgs)
    assert list(refused) == [3] and parts == [[0, 1], [2]]
    out, lease = f.output(t, 3)
    row = 0
    for part in parts:
        p = f.prepare(t, [imgs[i] for i in part], out[row : row + len(part)])
        lease.after = f.commit(p)
        row += len(part)
    (want,) = eager(RESIZE_CROP, *imgs[:3], **target_attrs(t))
    np.testing.assert_array_equal(out, want)


def test_size_classes_are_powers_of_two_from_4_kib():
    assert [size_class(n) for n in (0, 1, 4096, 4097, 100_000, 1 << 20)] == [
        4096, 4096, 4096, 8192, 131072, 1 << 20,
    ]  # fmt: skip


def test_runs_within_keeps_order_and_puts_an_oversized_image_alone():
    assert runs_within([], 10) == []
    assert runs_within([3, 3, 3, 3], 10) == [[0, 1, 2], [3]]
    assert runs_within([4, 20, 5, 5, 1], 10) == [[0], [1], [2, 3], [4]]
    assert runs_within([10, 10], 10) == [[0], [1]]  # exactly the budget: a run of its own
