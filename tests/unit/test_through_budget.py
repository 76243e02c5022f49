"""The ingress's budget covers the GPU queue behind it (issue 17 item 4): the coalescer
counts the requests it sent on and has no answer for as ahead, less the time their work
takes (``queue_budget.through_wait_s``), so an accepted request waits about one budget in
all -- not one in each queue.

The rules on a gated downstream; then a closed-loop pulse in virtual time (an event loop
whose clock jumps to its next timer: deterministic, no sleeps) through the real Coalescer
in front of the real BatchScheduler on a serial "device".
"""

from __future__ import annotations

import asyncio
import random
import selectors

import pytest

from pipeline import queue_budget
from pipeline.batching import BatchScheduler
from pipeline.coalescer import Coalescer
from pipeline.errors import QueueFull
from tests.unit import test_queue_budget as queue_gate


def test_service_meter_is_a_low_quantile_of_the_round_trip_less_the_downstream_wait():
    m = queue_budget.ServiceMeter(window=4, quantile=0.0)
    m.done(1.0, [])  # an answer that says nothing of its waits: no sample
    assert m.service_s is None
    m.done(1.0, [0.6, 0.2])  # 1 s round trip, 0.4 s of it waiting on average
    assert m.service_s == pytest.approx(0.6)
    m.done(0.5, [0.3])
    assert m.service_s == pytest.approx(0.2)  # the low end
    m.done(0.1, [0.5])  # (clocks of two processes): never below 0
    assert m.service_s == 0.0
    for _ in range(4):  # a stretched service: the window forgets the old ones
        m.done(2.0, [0.5])
    assert m.service_s == pytest.approx(1.5)
    q = queue_budget.ServiceMeter()  # the default: the 10th percentile of the last 64
    for i in range(100):
        q.done(1.0 + i / 100, [0.0])
    assert q.service_s == pytest.approx(1.42)  # of 1.36 .. 1.99


def test_rate_meter_spanning_samples_errs_low_not_high():
    """One downstream batch answers two groups at t=1: the first's requests had not waited
    (no sample), the second's had. From the previous completion the sample's time is ~0
    (4 items in 1 microsecond); spanning from the previous sample it is the whole second."""
    for span, want in ((False, 4 / 1e-6), (True, 4 / 1.0)):
        m = queue_budget.RateMeter(alpha=1.0, span_samples=span)  # the last sample alone
        m.done(4, started=-1.0, now=0.0)  # a sample
        m.done(4, started=-0.5, now=1.0, busy=False)
        m.done(4, started=-0.5, now=1.0 + 1e-6)
        assert m.rate == pytest.approx(want, rel=1e-3)


def test_through_wait_counts_what_was_sent_on_less_the_service():
    rate = queue_budget.RateMeter(rate=10.0, samples=3)
    svc = queue_budget.ServiceMeter()
    svc.done(0.3, [0.0])
    assert queue_budget.through_wait_s(2, 5, rate, None) is None  # service unknown
    assert queue_budget.through_wait_s(2, 5, rate, queue_budget.ServiceMeter()) is None
    assert queue_budget.through_wait_s(2, 5, queue_budget.RateMeter(), svc) is None
    # 2 waiting here, 5 sent on, and itself: answered 0.8 s from now, its work 0.3 s of it
    assert queue_budget.through_wait_s(2, 5, rate, svc) == pytest.approx(0.5)
    assert queue_budget.through_wait_s(0, 0, rate, svc) == 0.0  # idle: no wait
    # in admission the longer prediction counts
    queue_budget.admit(0.0, 2, rate, None, 0.55, 1.0, through_s=0.5)
    with pytest.raises(QueueFull) as e:
        queue_budget.admit(0.0, 2, rate, None, 0.45, 1.0, "r", "ingress", 0.5, 5)
    f = e.value.fields
    assert f["predicted_wait_ms"] == pytest.approx(500.0)
    assert f["queue_ahead"] == 2 and f["sent_ahead"] == 5 and f["queue"] == "ingress"


class Gate(queue_gate.Gate):
    """Answers once the gate opens, each answer saying it waited ``wait_s`` downstream."""

    def __init__(self, wait_s: float = 0.0) -> None:
        super().__init__()
        self.wait_s = wait_s

    async def __call__(self, items: list) -> list:
        return [{"item": i, "waited": self.wait_s} for i in await super().__call__(items)]


def _waited(r):
    return r.get("waited") if isinstance(r, dict) else None


def _coalescer(down, downstream_wait_s) -> Coalescer:
    """Groups of 2, 2 out, a 0.45 s budget, answers measured at 10/s."""
    c = Coalescer(
        down,
        window_s=0.0,
        max_items=2,
        max_in_flight=2,
        budget_s=0.45,
        downstream_wait_s=downstream_wait_s,
    )
    c.meter.rate, c.meter.samples = 10.0, 3
    return c


def test_coalescer_counts_the_requests_sent_on_as_ahead():
    """4 requests out downstream, none waiting here: the old rule saw an empty queue; with
    the downstream's waits known, the 4 out and their work say how long the next waits."""

    async def main(through: bool):
        down = Gate()
        c = _coalescer(down, _waited if through else None)
        c.service.samples.append(0.1)  # of a request's time downstream, 0.1 s is work
        out = [asyncio.ensure_future(c.submit(i, f"r{i}")) for i in range(4)]
        for _ in range(3):
            await asyncio.sleep(0)
        assert c._out_items == 4 and not c._group
        fifth = asyncio.ensure_future(c.submit(4))  # (4 + 0 + 1) / 10 - 0.1 = 0.4 s: fits
        await asyncio.sleep(0)
        refused = None
        try:  # 1 waiting here, 4 out: (1 + 4 + 1) / 10 - 0.1 = 0.5 s > 0.45 s
            sixth = asyncio.ensure_future(c.submit(5, "r5"))
            await asyncio.sleep(0)
            if sixth.done() and sixth.exception() is not None:
                refused = sixth.exception()
        finally:
            down.gate.set()
        done = await asyncio.gather(*out, fifth)
        assert [d["item"] for d in done] == [0, 1, 2, 3, 4]
        if refused is None:
            await sixth
        return refused, c

    refused, c = asyncio.run(main(through=True))
    assert isinstance(refused, QueueFull)
    f = refused.fields
    assert f["reason"] == "queue_budget" and f["request_id"] == "r5"
    assert f["queue_ahead"] == 1 and f["sent_ahead"] == 4
    assert f["predicted_wait_ms"] == pytest.approx(500.0)
    assert c.service.service_s is not None  # and it learnt from the answers
    refused, _ = asyncio.run(main(through=False))
    assert refused is None  # the old rule: 1 ahead here, 0.1 s, admitted


def test_coalescer_keeps_its_own_rule_until_the_service_time_is_known():
    async def main():
        down = Gate()
        c = _coalescer(down, lambda r: None)  # answers that never say how long they waited
        futs = [asyncio.ensure_future(c.submit(i)) for i in range(8)]  # 4 out, 4 here
        for _ in range(3):
            await asyncio.sleep(0)
        down.gate.set()
        assert [d["item"] for d in await asyncio.gather(*futs)] == list(range(8))
        assert c.service.service_s is None

    asyncio.run(main())


# ---------------------------------------------------------------- virtual time


class _JumpSelector(selectors.DefaultSelector):
    """No I/O happens here: a wait for I/O is the clock jumping to the next timer."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def select(self, timeout=None):
        if timeout is None:
            raise RuntimeError("nothing scheduled: the simulation would hang")
        # (and a nanosecond a turn, as a real clock moves: asyncio runs a timer up to its
        # clock's resolution early, and one due in 1e-12 s would otherwise never come)
        self.now += max(timeout, 1e-9)
        return []


class VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._jump = _JumpSelector()
        super().__init__(self._jump)

    def time(self) -> float:
        return self._jump.now


PERIOD_S, BURST_S = 60.0, 20.0  # benchmarks/overload.py's pulse on the CPU: 2 periods


def _in_burst(t: float) -> bool:
    return t % PERIOD_S >= PERIOD_S - BURST_S


def _pulse(through: bool, users: int = 8, periods: int = 2) -> dict:
    """``users`` closed-loop clients, ``2 * users`` more in the last third of each minute
    (5 ms between a client's answer and its next request, 20 ms after a refusal), through
    the ingress coalescer (1 ms window, groups of at most 16, 4 out) to a GPU queue
    (batches of 8, 5 ms wait, 2 in flight) on a serial device (a batch of n takes
    50 + 120 n ms: 6-8 img/s, ResNet-50 on 2 shared cores) with a 10 ms hop each way.
    Budget 1 s at both queues. Each accepted request's waits (here, and in the GPU queue)
    and its latency, by phase: sent in a burst, or steady (from 10 s after a burst)."""
    budget = 1.0
    loop = VirtualLoop()
    asyncio.set_event_loop(loop)
    device = asyncio.Lock()
    jitter = random.Random(17)

    async def run_batch(batch):
        start = loop.time()
        async with device:
            await asyncio.sleep((0.05 + 0.12 * len(batch)) * jitter.uniform(0.8, 1.2))
        return [start - p.enqueued for p in batch.items]

    sched = BatchScheduler(
        run_batch, 8, 5.0, 512, max_in_flight=2, clock=loop.time, dispatch_when_idle=True
    )

    async def downstream(items):
        sent = loop.time()
        await asyncio.sleep(0.01)
        futs = []
        for _ in items:
            try:
                futs.append(sched.submit_nowait(None, "m", budget_s=budget))
            except QueueFull as exc:
                futs.append(exc)
        res = await asyncio.gather(
            *(f for f in futs if not isinstance(f, BaseException)), return_exceptions=True
        )
        it = iter(res)
        res = [f if isinstance(f, BaseException) else next(it) for f in futs]
        await asyncio.sleep(0.01)
        return [
            r if isinstance(r, BaseException) else {"queue": r, "ingress": sent - t0}
            for r, t0 in zip(res, items, strict=True)
        ]

    c = Coalescer(
        downstream,
        0.001,
        16,
        max_in_flight=4,
        dispatch_when_idle=True,
        budget_s=budget,
        downstream_wait_s=(lambda r: r["queue"] if isinstance(r, dict) else None)
        if through
        else None,
        downstream_batch_wait_s=0.005,
    )
    out = {ph: {"accepted": [], "refused": {"ingress": 0, "gpu": 0}} for ph in ("steady", "burst")}
    stop = PERIOD_S * periods

    def phase(t: float) -> str | None:
        if _in_burst(t):
            return "burst"
        return "steady" if t % PERIOD_S >= 10.0 or t < PERIOD_S - BURST_S else None

    async def client(extra: bool):
        while loop.time() < stop:
            if extra and not _in_burst(loop.time()):
                await asyncio.sleep(PERIOD_S - BURST_S - loop.time() % PERIOD_S)
                continue
            await asyncio.sleep(0.005)
            t0 = loop.time()
            ph = phase(t0)
            try:
                r = await c.submit(t0)
            except QueueFull as exc:  # here, or downstream after its wait here
                if ph:
                    out[ph]["refused"][exc.fields["queue"]] += 1
                await asyncio.sleep(0.015)
                continue
            if ph:
                out[ph]["accepted"].append((r["ingress"] + r["queue"], loop.time() - t0))

    async def main():
        await asyncio.gather(*(client(i >= users) for i in range(3 * users)))
        await sched.close()

    try:
        loop.run_until_complete(main())
    finally:
        asyncio.set_event_loop(None)
        loop.close()
    for ph in out.values():
        acc = ph.pop("accepted")
        lat = sorted(a[1] for a in acc)
        ph.update(
            accepted=len(acc),
            worst_wait_s=round(max(a[0] for a in acc), 3),
            p99_s=round(lat[int(0.99 * (len(lat) - 1))], 3),
            p50_s=round(lat[len(lat) // 2], 3),
            p90_s=round(lat[int(0.9 * (len(lat) - 1))], 3),
        )
    return out


def test_pulse_in_virtual_time_the_excess_is_refused_at_the_front_door():
    """The GPU queue's own budget refuses the excess only after its hop (and, on the real
    pipeline, its decode: CPU the model needs); counting what was sent on, the ingress
    refuses nearly all of it on arrival -- with nothing refused at the steady level and the
    accepted requests quicker. The price, where refusing costs nothing (here): the pipeline
    is kept less full, so a little less is served in the bursts (316 against 360)."""
    new, old = _pulse(True), _pulse(False)
    for r in (new, old):
        assert r["steady"]["refused"] == {"ingress": 0, "gpu": 0}, r
    nb, ob = new["burst"], old["burst"]
    assert ob["refused"]["ingress"] == 0 and ob["refused"]["gpu"] > 0, old
    assert nb["refused"]["ingress"] > 100 * nb["refused"]["gpu"], new
    assert nb["refused"]["gpu"] < ob["refused"]["gpu"], (new, old)
    assert nb["p50_s"] < 0.7 * ob["p50_s"] and nb["p90_s"] < ob["p90_s"], (new, old)
    assert nb["p99_s"] <= ob["p99_s"], (new, old)
    assert nb["accepted"] >= 0.8 * ob["accepted"], (new, old)


def test_the_ingress_reads_the_gpu_queue_wait_from_an_answer():
    from deployments.ingress import _queue_wait_s
    from pipeline.stages.messages import Answer, Timings

    assert _queue_wait_s(Answer(Timings(queue=250.0))) == pytest.approx(0.25)
    assert _queue_wait_s(Answer(Timings())) is None  # it never reached the GPU queue
    assert _queue_wait_s(QueueFull("refused downstream")) is None
