"""pipeline/threads.py: Ferry's worker threads carry their names in the OS too."""

import sys
import threading

import pytest

from pipeline.threads import QueueThreads, name_os_thread, thread_pool


def _os_name() -> str:
    with open(f"/proc/self/task/{threading.get_native_id()}/comm") as f:
        return f.read().strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and prctl are Linux's")
def test_pool_threads_are_named_in_the_os():
    pool = thread_pool(2, "ferry-test")
    try:
        names = {pool.submit(_os_name).result() for _ in range(8)}
        assert names <= {"ferry-test_0", "ferry-test_1"} and names
    finally:
        pool.shutdown()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and prctl are Linux's")
def test_a_long_name_is_cut_to_what_linux_keeps():
    seen = []

    def run():
        name_os_thread("ferry-a-very-long-thread-name")
        seen.append(_os_name())

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert seen == ["ferry-a-very-lo"]


def test_queue_threads_start_at_the_first_item_and_run_each_once_in_order():
    seen: list[tuple[int, str]] = []
    done = threading.Event()

    def handle(i: int) -> None:
        seen.append((i, threading.current_thread().name))
        if i == 99:
            done.set()

    q = QueueThreads(["ferry-q"], handle)
    assert not q._threads  # nothing started before an item comes
    for i in range(100):
        q.put((i,))
    assert done.wait(10)
    q.close()
    assert [i for i, _ in seen] == list(range(100))
    assert {name for _, name in seen} == {"ferry-q"}


def test_queue_threads_finish_what_was_queued_at_close_and_refuse_after():
    seen: list[int] = []
    gate = threading.Event()

    def handle(i: int) -> None:
        gate.wait(10)
        seen.append(i)

    q = QueueThreads(["ferry-q_0", "ferry-q_1"], handle)
    for i in range(6):
        q.put((i,))
    gate.set()
    q.close()
    assert sorted(seen) == list(range(6))
    assert all(not t.is_alive() for t in q._threads)
    with pytest.raises(RuntimeError, match="closed"):
        q.put((7,))
    QueueThreads(["ferry-never"], handle).close()  # closing one never started is a no-op
