"""The queue-time budget: refusal at admission from the predicted wait, drop at dispatch of
what waited past it -- in the pure rules, the GPU stage's scheduler (fake clock) and the
ingress's coalescer; the config and the Triton model configuration that report it."""

from __future__ import annotations

import asyncio
import pickle

import pytest

from pipeline import queue_budget
from pipeline.batch_scheduler import BatchScheduler
from pipeline.batching import BatchQueue
from pipeline.coalescer import Coalescer
from pipeline.config import PipelineConfig
from pipeline.errors import QueueFull
from tests.unit import virtual_time


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 10))  # a wrong answer fails, never hangs


def test_rate_meter_counts_busy_time_only():
    m = queue_budget.RateMeter(alpha=0.5)
    assert m.wait_s(10) is None  # nothing measured yet
    m.done(8, started=0.0, now=0.5)  # 8 items in 0.5 s
    assert m.rate == pytest.approx(16.0)
    m.done(8, started=0.4, now=1.0)  # pipelined: counted from the previous completion
    assert m.rate == pytest.approx(16.0)
    assert m.wait_s(16) is None  # not trusted before its third completion
    m.done(8, started=10.0, now=10.25)  # after an idle gap: only its own 0.25 s
    assert m.rate == pytest.approx(8 / (0.5 + 0.5 * (0.25 - 0.5)))  # mean items / mean time
    m.done(1, started=11.0, now=11.5, busy=False)  # nothing waited: no sample
    assert m.rate == pytest.approx(8 / 0.375) and m.samples == 3
    assert m.wait_s(48) == pytest.approx(48 * 0.375 / 8)


def test_rate_meter_is_not_fooled_by_completions_that_come_back_together():
    """Four groups of 64 out at once, answered by one downstream batch every 20 ms: the
    queue drains 12,800 items/s. The three completions right behind the first (dt ~ 0)
    must not read as a rate of millions (a mean of n/dt did: admission then let nearly
    everything in, and the budget was kept only by dropping requests that had waited it)."""
    m = queue_budget.RateMeter()
    t = 0.0
    for _ in range(50):
        t += 0.02
        for k in range(4):
            m.done(64, started=t - 0.02, now=t + k * 1e-6)
    assert 12_800 / 2 < m.rate < 12_800 * 2


def test_admit_refuses_a_predicted_wait_past_the_budget():
    m = queue_budget.RateMeter(rate=10.0, samples=3)  # 10 items/s
    queue_budget.admit(0.0, 4, m, None, 0.5, 1.0)  # 0.4 s ahead: fits
    with pytest.raises(QueueFull) as e:
        queue_budget.admit(0.2, 4, m, None, 0.5, 2.0, "r1")  # waited 0.2 s already
    f = e.value.fields
    assert f["reason"] == "queue_budget" and f["retry_after_s"] == 2.0
    assert f["predicted_wait_ms"] == pytest.approx(600.0) and f["budget_ms"] == 500.0
    assert f["request_id"] == "r1"
    assert pickle.loads(pickle.dumps(e.value)) == e.value  # crosses a Serve hop intact
    queue_budget.admit(9.0, 10**6, m, 99.0, None, 1.0)  # no budget: never refuses


def test_admit_uses_the_head_age_until_a_rate_is_measured():
    queue_budget.admit(0.0, 3, None, 0.4, 0.5, 1.0)
    with pytest.raises(QueueFull):
        queue_budget.admit(0.0, 3, None, 0.6, 0.5, 1.0)
    queue_budget.admit(0.0, 0, None, None, 0.5, 1.0)  # an empty queue


def test_batch_queue_refuses_at_admission_from_the_key_rate(clock):
    q = BatchQueue(max_batch_size=4, max_wait_s=1.0, max_queue=100, retry_after_s=3.0)
    q.rates["m"] = queue_budget.RateMeter(rate=10.0, samples=3)  # 10 rows/s
    t = clock()
    for i in range(5):  # 0.0 .. 0.4 s ahead of each: all fit a 0.45 s budget
        q.push(i, "m", t, budget_s=0.45)
    with pytest.raises(QueueFull) as e:
        q.push(5, "m", t, budget_s=0.45)  # 0.5 s ahead
    assert e.value.fields["reason"] == "queue_budget"
    assert q.depth("m") == 5
    q.push(0, "other", t, budget_s=0.45)  # another key: its own (empty) queue
    q.push(5, "m", t, budget_s=None)  # no budget: only max_queue bounds it
    with pytest.raises(QueueFull):  # waited 0.3 s upstream: 0.3 + 0.6 > 0.45
        q.push(6, "m", t, arrived=t - 0.3, budget_s=0.45, priority=False)
    q.push(7, "m", t, arrived=t - 0.3, budget_s=0.45, priority=True)  # nothing ahead of it


def test_scheduler_drops_what_waited_past_its_budget(clock):
    drops = []

    async def run_batch(batch):
        return [p.item for p in batch.items]

    async def main():
        s = BatchScheduler(
            run_batch,
            max_batch_size=8,
            max_wait_ms=1000,
            max_queue=100,
            clock=clock,
            retry_after_s=2.0,
            on_drop=lambda p, e: drops.append((p.item, e)),
        )
        t = clock()
        late = s.submit_nowait("late", "m", arrived=t - 0.15, budget_s=0.2)
        fresh = s.submit_nowait("fresh", "m", arrived=t, budget_s=0.2)
        plain = s.submit_nowait("plain", "m")
        assert s.poll() == pytest.approx(t + 0.05)  # woken when the first budget runs out
        clock.advance(0.06)
        s.poll()
        with pytest.raises(QueueFull) as e:
            await late
        assert e.value.fields["reason"] == "queue_timeout"
        assert e.value.fields["waited_ms"] == pytest.approx(210.0)
        assert [d[0] for d in drops] == ["late"] and drops[0][1] is e.value
        assert not fresh.done() and not plain.done()
        clock.advance(1.0)  # the batch's wait runs out: both leave (fresh is past its
        s.poll()  # budget too by now: dropped first, so only plain runs)
        assert await plain == "plain"
        with pytest.raises(QueueFull):
            await fresh
        await s.close()

    run(main())


def test_scheduler_measures_the_drain_rate_per_key_while_rows_wait(clock):
    async def run_batch(batch):
        clock.advance(0.5)  # each batch takes 0.5 s
        return [p.item for p in batch.items]

    async def main():
        s = BatchScheduler(
            run_batch,
            max_batch_size=4,
            max_wait_ms=0,
            max_queue=100,
            max_in_flight=1,
            clock=clock,
        )
        lone = s.submit_nowait(0, "m")
        s.poll()
        await lone
        assert s.queue.rates["m"].rate is None  # nothing waited: says nothing of capacity
        futs = [s.submit_nowait(i, "m") for i in range(16)]  # 4 batches, one at a time
        while not all(f.done() for f in futs):
            s.poll()
            await asyncio.sleep(0)
        meter = s.queue.rates["m"]
        assert meter.samples == 3 and meter.rate == pytest.approx(8.0)  # 4 rows in 0.5 s
        assert meter.wait_s(16) == pytest.approx(2.0)
        await s.close()

    run(main())


class Gate:
    def __init__(self) -> None:
        self.calls: list[list] = []
        self.gate = asyncio.Event()

    async def __call__(self, items: list) -> list:
        self.calls.append(list(items))
        await self.gate.wait()
        return items


def test_coalescer_refuses_at_once_when_the_requests_ahead_would_take_too_long():
    rejected = []

    async def main():
        down = Gate()
        c = Coalescer(
            down,
            window_s=0.0,
            max_items=2,
            max_in_flight=1,
            budget_s=0.25,
            retry_after_s=4.0,
            on_reject=rejected.append,
        )
        c.meter.rate, c.meter.samples = 10.0, 3  # answers come back at 10/s
        # 0 and 1 leave; 2, 3, 4 wait for the slot with 0, 0.1, 0.2 s ahead of them
        out = [asyncio.ensure_future(c.submit(i, f"r{i}")) for i in range(5)]
        for _ in range(3):
            await asyncio.sleep(0)
        with pytest.raises(QueueFull) as e:
            await c.submit(5, "r5")  # 3 waiting ahead: 0.3 s > 0.25 s
        assert e.value.fields["reason"] == "queue_budget"
        assert e.value.fields["request_id"] == "r5" and e.value.fields["retry_after_s"] == 4.0
        assert rejected == ["queue_budget"]
        down.gate.set()
        assert await asyncio.gather(*out) == [0, 1, 2, 3, 4]
        assert [len(g) for g in down.calls] == [2, 2, 1]

    run(main())


def test_coalescer_drops_at_dispatch_what_waited_past_the_budget_and_skips_cancelled():
    rejected = []

    async def main():
        down = Gate()
        c = Coalescer(
            down,
            window_s=0.0,
            max_items=8,
            max_in_flight=1,
            budget_s=0.05,
            on_reject=rejected.append,
        )
        first = asyncio.ensure_future(c.submit("a"))
        await asyncio.sleep(0.01)
        waiting = asyncio.ensure_future(c.submit("b", "rb"))  # no rate yet: admitted
        gone = asyncio.ensure_future(c.submit("c"))
        await asyncio.sleep(0)
        gone.cancel()  # its caller gave up
        await asyncio.sleep(0.08)  # "b" waits past its 50 ms budget for the slot
        down.gate.set()
        assert await first == "a"
        with pytest.raises(QueueFull) as e:
            await waiting
        assert e.value.fields["reason"] == "queue_timeout" and e.value.fields["request_id"] == "rb"
        assert rejected == ["queue_timeout"]
        assert down.calls == [["a"]]  # neither the late nor the cancelled one was sent
        assert c._out_items == 0 and c.meter.rate is not None

    # on the loop's virtual clock: in real time a loaded machine that stalled 50 ms between
    # "b" and "c" joining made "b" a head past the budget, and "c" was refused at admission
    virtual_time.run(asyncio.wait_for(main(), 10))


def test_config_policy_per_model_and_triton_reports_it():
    from pipeline.protocol import triton

    cfg = PipelineConfig.model_validate(
        {
            "models": [{"name": "digits", "arch": "digits"}, {"name": "r", "arch": "resnet50"}],
            "batching": {
                "queue_policy": {"timeout_ms": 250},
                "max_queue": 64,
                "model_queue_policy": {"digits": {"timeout_ms": None}},
            },
        }
    )
    b = cfg.batching
    assert b.policy_for("r").budget_s == 0.25 and b.policy_for("digits").budget_s is None
    assert PipelineConfig().batching.policy_for("x").timeout_ms == 1000.0  # the default
    with pytest.raises(ValueError, match="unknown models"):
        PipelineConfig.model_validate({"batching": {"model_queue_policy": {"nope": {}}}})
    meta = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}], "outputs": []}
    for name, want in (("r", 250_000), ("digits", 0)):
        pol = triton.model_config(
            name, meta, "native", 64, (1, 8), 5.0, b.policy_for(name).timeout_ms, b.max_queue
        )["dynamic_batching"]["default_queue_policy"]
        assert pol == {
            "timeout_action": "REJECT",
            "default_timeout_microseconds": want,
            "allow_timeout_override": False,
            "max_queue_size": 64,
        }


def test_a_budget_no_longer_than_the_batch_wait_is_refused_at_validation():
    """Else it validates and then drops every batch that leaves by its wait (503s)."""
    with pytest.raises(ValueError, match="must exceed batching.max_wait_ms"):
        PipelineConfig.model_validate(
            {"batching": {"max_wait_ms": 50, "queue_policy": {"timeout_ms": 5}}}
        )
    with pytest.raises(ValueError, match="model_queue_policy.digits.timeout_ms"):
        PipelineConfig.model_validate(
            {
                "models": [{"name": "digits", "arch": "digits"}],
                "batching": {
                    "max_wait_ms": 20,
                    "model_queue_policy": {"digits": {"timeout_ms": 20}},
                },
            }
        )
    ok = PipelineConfig.model_validate(
        {"batching": {"max_wait_ms": 50, "queue_policy": {"timeout_ms": None}}}
    )
    assert ok.batching.policy_for("x").timeout_ms is None


def test_a_budget_no_longer_than_the_coalesce_window_is_refused_at_validation():
    """Review R3: the ingress's coalescer holds a group a window under load; a budget not
    above it validated, then dropped every such request at dispatch with 503 queue_timeout."""
    with pytest.raises(
        ValueError,
        match=r"queue_policy.timeout_ms \(5.0\) must exceed "
        r"ingress.coalesce_window_ms \(20.0\) \+ batching.max_wait_ms \(2.0\)",
    ):
        PipelineConfig.model_validate(
            {"batching": {"queue_policy": {"timeout_ms": 5}}, "ingress": {"coalesce_window_ms": 20}}
        )
    with pytest.raises(ValueError, match=r"model_queue_policy.digits.timeout_ms \(20.0\)"):
        PipelineConfig.model_validate(
            {
                "models": [{"name": "digits", "arch": "digits"}],
                "batching": {"model_queue_policy": {"digits": {"timeout_ms": 20}}},
                "ingress": {"coalesce_window_ms": 20},
            }
        )
    with pytest.raises(ValueError, match=r"must exceed ingress.coalesce_window_ms"):
        PipelineConfig.model_validate(  # above the window, not above the window and the fill
            {
                "batching": {"queue_policy": {"timeout_ms": 21}},
                "ingress": {"coalesce_window_ms": 20},
            }
        )
    ok = PipelineConfig.model_validate(
        {"batching": {"queue_policy": {"timeout_ms": 23}}, "ingress": {"coalesce_window_ms": 20}}
    )
    assert ok.batching.policy_for("x").timeout_ms == 23
    off = PipelineConfig.model_validate(
        {"batching": {"queue_policy": {"timeout_ms": None}}, "ingress": {"coalesce_window_ms": 20}}
    )
    assert off.batching.budgets() == {}
