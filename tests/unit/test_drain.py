"""deployments/drain.py: an ingress replica's drain, with a dict for Ray's key-value store."""

from __future__ import annotations

import asyncio

import pytest

from deployments.drain import LIVE_S, Drain, Report, drained, flag_key, report_prefix
from pipeline.errors import Unavailable


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _drain(store: dict, clock: Clock) -> Drain:
    return Drain("app", "r1", (store.get, store.__setitem__), retry_after_s=2.0, clock=clock)


def _report(store: dict) -> Report:
    return Report.decode(store[report_prefix("app") + b"r1"])


def test_work_is_counted_and_refused_once_the_flag_is_up():
    store, clock = {}, Clock()
    d = _drain(store, clock)
    with d.work("a"):
        assert d.in_flight == 1
        d.poll()  # no flag: it keeps working, and says so
        assert _report(store) == Report(False, 1, 1000.0)
        clock.t += 1
        store[flag_key("app")] = b"1090.000"  # raised, expiring at 1090
        d.poll()
        assert d.draining and _report(store) == Report(True, 1, 1001.0)
        with pytest.raises(Unavailable) as e, d.work("b"):  # new work: 503, retry elsewhere
            pass
        assert e.value.reason == "draining" and e.value.retry_after_s == 2.0
        assert e.value.http_status == 503
    assert d.in_flight == 0  # the request it held finished; the refused one was never counted
    d.poll()
    assert _report(store) == Report(True, 0, 1001.0)


def test_an_expired_flag_is_a_stop_that_died():
    store, clock = {flag_key("app"): b"999.000"}, Clock()
    d = _drain(store, clock)  # the app deployed again after a stop that left its flag
    d.poll()
    assert not d.draining
    with d.work():
        pass


def test_run_reports_from_the_event_loop_until_cancelled():
    """Cancelled once its first report is in the store -- not after a real 50 ms, which a
    loaded machine's thread pool (the store's calls run in threads) could outlast."""
    store, clock = {flag_key("app"): b"2000.000"}, Clock()

    async def main():
        loop = asyncio.get_running_loop()
        reported = asyncio.Event()

        def put(key: bytes, value: bytes) -> None:  # in the pool's thread
            store[key] = value
            loop.call_soon_threadsafe(reported.set)

        d = Drain("app", "r1", (store.get, put), retry_after_s=2.0, clock=clock)
        d.start()
        task = d._task
        d.start()  # once
        assert task is not None and d._task is task
        await asyncio.wait_for(reported.wait(), 10)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled()
        return d

    d = asyncio.run(main())
    assert d.draining and _report(store) == Report(True, 0, 1000.0)


def test_drained_waits_for_every_live_replica_and_ignores_gone_ones():
    now = 100.0
    holding = [Report(True, 0, now), Report(True, 3, now)]
    assert not drained(holding, now)
    unseen = [Report(True, 0, now), Report(False, 0, now - 0.1)]  # one has not read the flag
    assert not drained(unseen, now)
    gone = [Report(True, 0, now), Report(False, 4, now - LIVE_S - 1)]  # reports no more: dead
    assert drained(gone, now)
    assert drained([], now)  # no Ferry ingress reports at all
