"""pipeline/threads.py: Ferry's worker threads carry their names in the OS too."""

import sys
import threading

import pytest

from pipeline.threads import name_os_thread, thread_pool


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
