"""benchmarks/common.py: the node's busy cores, as bench_e2e records them per level."""

import os
import time

from benchmarks.common import busy_cores_since


def test_busy_cores_counts_a_spinning_thread():
    mark, cores = busy_cores_since()
    assert cores == 0.0
    end = time.monotonic() + 0.4
    while time.monotonic() < end:  # this process keeps one core busy
        pass
    _, cores = busy_cores_since(mark)
    assert 0.6 <= cores <= (os.cpu_count() or 1) + 0.1
