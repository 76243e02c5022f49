"""PreprocessGpuCore on the numpy backend: the local form's batches come from the one
scheduler (many calls' images in one fit), rows equal the CPU stage's within a level, and
one bad image never fails its neighbours."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from pipeline.config import PipelineConfig
from pipeline.device import Backend, Stream
from pipeline.imaging import decode, encode_jpeg, encode_png
from pipeline.preprocess_gpu.rounds import Landing
from pipeline.preprocess_gpu.stage import PreprocessGpuCore
from pipeline.stages.decode import PreprocessStage
from pipeline.stages.messages import DeviceRows, Encoded


def _core(overlap_rounds=False, stream_priority="normal", decode_rounds=1, **transport):
    pre = {
        "overlap_rounds": overlap_rounds,
        "stream_priority": stream_priority,
        "decode_rounds": decode_rounds,
    }
    cfg = PipelineConfig.model_validate(
        {
            "models": [{"name": "digits", "source": "digits", "max_batch": 64}],
            "transport": transport or {"staging_slots": 2, "staging_slot_bytes": 1 << 20},
            "preprocess": pre,
        }
    )
    cpu = PreprocessStage(cfg, fitted=False)
    return PreprocessGpuCore(cfg, cpu, local=True, backend=Backend("numpy"))


def _checked(core, data, ct):
    """As the ingress sends an image on: checked and planned from its header."""
    return Encoded.checked(data, ct, core.targets["digits"], 1 << 24, 1 << 30)


def _blobs(n, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        img = rng.integers(0, 256, (20 + i, 30 - i, 1), dtype=np.uint8)
        img[:10] //= 4
        out.append((encode_png(img), "image/png") if i % 2 else (encode_jpeg(img), "image/jpeg"))
    return out


@pytest.mark.parametrize("overlap_rounds", [False, True])
def test_local_stage_batches_calls_through_the_scheduler_and_matches_cpu(overlap_rounds):
    """(``overlap_rounds``: a round's rows come back before its device work is waited for,
    and each call takes its rows once their round is done.)"""
    core = _core(overlap_rounds)
    target = core.targets["digits"]
    seen: list[int] = []
    run = core.scheduler.run_batch

    landings: list[int] = []

    async def counted(batch):
        seen.append(len(batch))
        out = await run(batch)
        landings.append(sum(isinstance(r, Landing) for r in out))
        return out

    core.scheduler.run_batch = counted
    calls = [_blobs(5, seed=s) for s in range(4)]
    truncated = calls[1][1][0][:60]  # a PNG whose header passes the ingress's checks
    calls[1].insert(2, (truncated, "image/png"))
    checked = [[_checked(core, *it) for it in c] for c in calls]

    async def go():
        return await asyncio.gather(*(core.process("digits", c) for c in checked))

    results = asyncio.run(go())
    assert sum(seen) == 20 and len(seen) < 20  # images of several calls shared a fit
    # with overlap_rounds every row of a round left it early (the truncated PNG failed on
    # the CPU before any round)
    assert sum(landings) == (20 if overlap_rounds else 0)
    for items, got in zip(calls, results, strict=True):
        rows, owner, errors = got.data or [], got.owner, got.errors
        assert isinstance(got, DeviceRows) and got.envelope is None and got.preprocess_ms > 0
        bad = [i for i, (d, _) in enumerate(items) if d is truncated]
        assert sorted(errors) == bad and owner == [i for i in range(len(items)) if i not in bad]
        for row, i in zip(rows, owner, strict=True):
            want = decode(*items[i], target, 1 << 20)
            assert row.shape == want.shape
            assert np.abs(row.astype(np.int16) - want).max() <= 1
    assert core.ring.available() == core.ring.slots
    del results, rows, row, got
    # every batch's bytes are back with its rows gone -- once the stage's pool thread, which
    # holds its call's result for a moment after handing it on, has let go of it too
    until = time.monotonic() + 5.0
    while core.pool.bytes_in_use and time.monotonic() < until:
        time.sleep(0.01)
    assert core.pool.bytes_in_use == 0
    core.close()


def test_stage_fits_a_call_bigger_than_the_ring_in_parts():
    core = _core(staging_slots=1, staging_slot_bytes=1 << 20)
    rng = np.random.default_rng(1)
    big = [rng.integers(0, 256, (600, 700, 1), dtype=np.uint8) for _ in range(5)]  # 420 KB
    out, keep, refused = core.batch("digits", big)
    assert keep == [0, 1, 2, 3, 4] and not refused
    target = core.targets["digits"]
    for k in range(5):
        want = decode(encode_png(big[k]), "image/png", target, 1 << 30)
        assert np.abs(out[k].astype(np.int16) - want).max() <= 1
    core.close()


def test_overlapped_rounds_hand_rows_on_only_when_done_and_two_at_most_are_out():
    """With ``overlap_rounds`` the next round starts while one waits for the device, but a
    call gets its rows only when their round is done, and a third round waits until the
    first is done. The device's completions are held here by hand (``_when_done``)."""
    core = _core(overlap_rounds=True)
    checked = [[_checked(core, *it) for it in _blobs(3, seed=s)] for s in range(3)]
    gates: list[asyncio.Future] = []
    started = []
    run = core.scheduler.run_batch

    async def counted(batch):
        started.append(len(batch))
        return await run(batch)

    core.scheduler.run_batch = counted

    async def go():
        loop = asyncio.get_running_loop()
        new_gate = asyncio.Event()

        async def held(event, model, since):  # the round's device work: when the test says
            gates.append(loop.create_future())
            new_gate.set()
            await gates[-1]

        core._when_done = held

        async def gate(n):  # wait until n rounds wait on the device (a hang guard only)
            while len(gates) < n:
                new_gate.clear()
                await asyncio.wait_for(new_gate.wait(), 60)

        async def spin():  # let every ready task run (no thread work is pending)
            for _ in range(50):
                await asyncio.sleep(0)

        a = asyncio.ensure_future(core.process("digits", checked[0]))
        await gate(1)
        b = asyncio.ensure_future(core.process("digits", checked[1]))
        await gate(2)  # round 2 is enqueued while round 1 is on the device
        c = asyncio.ensure_future(core.process("digits", checked[2]))
        # c's images are decoded on CPU threads first (numpy), then queued: wait for that,
        # or for a third round (which the bound forbids: the assertion below says so)
        deadline = loop.time() + 60  # a hang guard only
        while core.scheduler.queue.depth("digits") < 3 and len(started) < 3:
            assert loop.time() < deadline, "c's images never reached the queue"
            await asyncio.sleep(0.01)
        await spin()
        assert not a.done() and not b.done() and not c.done()
        assert len(started) == 2  # round 3 waits for round 1
        gates[0].set_result(None)
        got_a = await asyncio.wait_for(a, 60)
        await gate(3)  # round 1 done: round 3 started
        await spin()
        assert not b.done() and not c.done()
        gates[1].set_result(None)
        gates[2].set_result(None)
        return got_a, await b, await c

    results = asyncio.run(go())
    assert started == [3, 3, 3]
    target = core.targets["digits"]
    for items, r in zip([_blobs(3, seed=s) for s in range(3)], results, strict=True):
        assert r.owner == [0, 1, 2] and not r.errors
        for row, it in zip(r.data, items, strict=True):
            assert np.abs(row.astype(np.int16) - decode(*it, target, 1 << 20)).max() <= 1
    core.close()


class _CpuDecoder:
    """The GPU decoder's interface over the CPU's full decode (nvImageCodec does not run
    here; ``tests/gpu`` runs the real one): what each call held, in decoded bytes."""

    def __init__(self):
        self.calls: list[int] = []

    def decode(self, datas, channels, stream):
        import simplejpeg

        space = "GRAY" if channels == 1 else "RGB"
        imgs = [simplejpeg.decode_jpeg(d, colorspace=space) for d in datas]
        self.calls.append(sum(i.nbytes for i in imgs))
        return imgs


def test_a_round_past_its_decoded_bytes_is_decoded_in_runs_with_the_same_rows():
    """``preprocess.gpu_decode_round_bytes``: a round's JPEGs go to the decoder in runs of
    at most that many decoded bytes (one image larger than that alone), each fitted before
    the next is decoded; the rows are the same as from one call."""
    rng = np.random.default_rng(3)
    sizes = [(40, 50), (300, 200), (30, 30), (120, 90), (20, 70), (64, 64)]
    jpegs = [encode_jpeg(rng.integers(0, 256, (h, w, 1), dtype=np.uint8)) for h, w in sizes]
    got = {}
    for budget in (1 << 20, 16_000):
        core = _core()
        core.config.preprocess.gpu_decode_round_bytes = budget
        core.lanes.all[0].decoder = dec = _CpuDecoder()
        items = [_checked(core, j, "image/jpeg") for j in jpegs]
        rows = asyncio.run(core.process("digits", items))
        assert rows.owner == list(range(len(jpegs))) and not rows.errors
        got[budget] = (dec.calls, [np.asarray(r).copy() for r in rows.data])
        core.close()
    assert got[1 << 20][0] == [sum(h * w for h, w in sizes)]  # one call: under the budget
    # 2000 + 60000 (alone: past it), 900 + 10800 + 1400, 4096
    assert got[16_000][0] == [2000, 60000, 13100, 4096]
    for a, b in zip(got[1 << 20][1], got[16_000][1], strict=True):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("priority", ["normal", "high"])
def test_stream_priority_reaches_the_fit_and_its_copies_and_a_round_still_runs(priority):
    """(On numpy a stream runs inline and the priority is only carried; the CUDA streams'
    own priorities are checked in tests/gpu/test_preprocess_gpu.py.)"""
    core = _core(stream_priority=priority)
    assert core.stream.priority == core.fitter.compute.priority == priority
    assert core.fitter.copy.priority == priority
    blob, ct = _blobs(1)[0]
    rows = asyncio.run(core.process("digits", [_checked(core, blob, ct)]))
    assert rows.owner == [0] and not rows.errors


def test_an_unknown_stream_priority_is_refused_by_the_config_and_the_stream():
    with pytest.raises(ValueError, match="stream_priority"):
        _core(stream_priority="urgent")
    with pytest.raises(ValueError, match="'normal' or 'high'"):
        Stream("x", Backend("numpy"), "urgent")  # type: ignore[arg-type]


def test_a_round_reports_its_wait_an_image_and_its_host_and_device_time_a_round(monkeypatch):
    """(The split of a request's preprocess time, as stage metrics: ``decode_wait`` for each
    image queued, ``decode_host``, its thread's CPU ``decode_cpu`` and ``decode_device``
    once a round each; on numpy no decoder is called, so no ``decode_call``.)"""
    from pipeline import metrics

    seen: dict[str, list[tuple[float, int]]] = {}
    monkeypatch.setattr(
        metrics, "observe_stage", lambda st, m, ms, n=1: seen.setdefault(st, []).append((ms, n))
    )
    monkeypatch.setattr(
        metrics,
        "observe_items",
        lambda st, m, ms: seen.setdefault(st, []).extend((v, 1) for v in ms),
    )
    core = _core()
    slow, first = core._round, threading.Event()

    def slowed(*a):  # each round's host call at least 50 ms; the first starts its 50 only
        if not first.is_set():  # once the other two calls' 8 images are queued behind it
            first.set()
            while core.scheduler.queue.depth("digits") < 8:
                time.sleep(0.001)
        time.sleep(0.05)
        return slow(*a)

    core._round = slowed
    calls = [[_checked(core, *it) for it in _blobs(4, seed=s)] for s in range(3)]

    async def go():  # the first call's round runs while the other two queue behind it
        a = asyncio.ensure_future(core.process("digits", calls[0]))
        while not first.is_set() and not a.done():  # (a hang: pytest's timeout)
            await asyncio.sleep(0.001)
        rest = await asyncio.gather(*(core.process("digits", c) for c in calls[1:]))
        return [await a, *rest]

    rows = asyncio.run(go())
    assert all(r.owner == [0, 1, 2, 3] and not r.errors for r in rows)
    assert len(seen["decode_wait"]) == 12  # each image once
    rounds = len(seen["decode_host"])
    assert 2 <= rounds <= 12 and len(seen["decode_device"]) == rounds
    assert len(seen["decode_cpu"]) == rounds and "decode_call" not in seen
    parts = ("decode_wait", "decode_host", "decode_device", "decode_cpu")
    assert all(ms >= 0 and n == 1 for st in parts for ms, n in seen[st])
    # in ms: every round's host call took its 50 at least, and the 8 images queued behind
    # the first round before its 50 began (one round at a time) waited that long at least
    assert min(ms for ms, _ in seen["decode_host"]) >= 50
    # the 50 ms asleep count in a round's wall time, not in its thread's CPU
    cpu, host = seen["decode_cpu"], seen["decode_host"]
    assert all(c < h for (c, _), (h, _) in zip(cpu, host, strict=True))
    assert sum(ms >= 50 for ms, _ in seen["decode_wait"]) >= 8
    assert [n for _, n in seen["preprocess"]] == [4, 4, 4]  # the calls' own, as before
    core.close()


class _MeetingDecoder(_CpuDecoder):
    """A lane's decoder whose call returns only once the other lane's decoder is inside its
    own call too: two rounds decoding at once, or the barrier's timeout fails the test."""

    def __init__(self, barrier):
        super().__init__()
        self.barrier = barrier
        self.threads: set[str] = set()

    def decode(self, datas, channels, stream):
        self.threads.add(threading.current_thread().name)
        self.barrier.wait()
        return super().decode(datas, channels, stream)


def test_two_decode_rounds_run_at_once_each_on_its_own_lane_with_the_same_rows():
    """``preprocess.decode_rounds: 2``: while one round waits inside its decoder call, the
    next call's images go to the decoder of the other lane, on another thread, and every
    call gets the rows one lane alone gives (``preprocess_gpu.lanes``)."""
    rng = np.random.default_rng(5)
    jpegs = [encode_jpeg(rng.integers(0, 256, (24 + i, 28, 1), dtype=np.uint8)) for i in range(6)]
    core = _core(decode_rounds=2, staging_slots=4)
    assert len(core.lanes.all) == 2 and core.scheduler.max_in_flight == 2
    a, b = core.lanes.all
    assert a.stream is not b.stream and a.watcher is not b.watcher and a.fitter is not b.fitter
    barrier = threading.Barrier(2, timeout=60)  # a hang guard only
    decs = [_MeetingDecoder(barrier) for _ in core.lanes.all]
    for lane, dec in zip(core.lanes.all, decs, strict=True):
        lane.decoder = dec
    calls = [[_checked(core, j, "image/jpeg") for j in jpegs[:3]]]
    calls.append([_checked(core, j, "image/jpeg") for j in jpegs[3:]])

    async def go():
        first = asyncio.ensure_future(core.process("digits", calls[0]))
        while not any(d.threads for d in decs):  # round 1 is inside its decoder call
            await asyncio.sleep(0.005)
        second = asyncio.ensure_future(core.process("digits", calls[1]))
        return await first, await second

    got = asyncio.run(go())
    assert [len(d.calls) for d in decs] == [1, 1]
    assert decs[0].threads.isdisjoint(decs[1].threads)
    core.close()
    one = _core()
    one.lanes.all[0].decoder = _CpuDecoder()
    for rows, call in zip(got, calls, strict=True):
        want = asyncio.run(one.process("digits", call))
        assert rows.owner == want.owner == [0, 1, 2] and not rows.errors
        for a, b in zip(rows.data, want.data, strict=True):
            assert np.array_equal(np.asarray(a), np.asarray(b))
    one.close()


def test_decode_rounds_and_overlap_rounds_are_refused_together():
    with pytest.raises(ValueError, match="choose one"):
        _core(overlap_rounds=True, decode_rounds=2)
