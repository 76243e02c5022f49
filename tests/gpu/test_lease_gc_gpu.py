"""A batch lease that dies in the cyclic collector never touches a CUDA event that cupy's
own finalizer destroyed (tests/unit/test_lease_gc.py on the numpy backend; the fix is
``_HELD`` in pipeline/preprocess_gpu/fitter.py).

The lease's life is the GPU form's: GpuFitter.output, work on the stage's stream,
``lease.after`` its event, row views handed on, then a GPU-queue refusal whose traceback
holds the rows in a cycle; half the rounds leave the work running when the lease dies, so
its ``__del__`` hands the event to the watcher, and in a quarter the event is made before
the lease, so the lease's own query meets it. A child process counts every
``Event.done``/``synchronize`` on a cupy event whose ``__del__`` already ran (without
making the call, which is what crashed) and the test fails on a signal too.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from pipeline.device import cuda_available

pytestmark = pytest.mark.skipif(not cuda_available(), reason="needs a CUDA device")

CHILD = textwrap.dedent(
    r'''
    import gc
    import cupy
    from pipeline import device as D
    from pipeline.async_result import AsyncResult, CompletionWatcher
    from pipeline.errors import QueueFull
    from pipeline.memory import PinnedRing, make_pool
    from pipeline.preprocess_gpu import fitter as F
    from pipeline.resize_plan import Target

    _del = cupy.cuda.Event.__del__
    def tracked_del(self, *a):
        self._ferry_destroyed = True  # the handle is gone, .ptr is not
        _del(self, *a)
    cupy.cuda.Event.__del__ = tracked_del
    bad = [0]
    _done, _sync = D.Event.done, D.Event.synchronize
    def done(self):
        if self._raw is not None and getattr(self._raw, "_ferry_destroyed", False):
            bad[0] += 1
            return True
        return _done(self)
    def sync(self):
        if self._raw is not None and getattr(self._raw, "_ferry_destroyed", False):
            bad[0] += 1
            return
        _sync(self)
    D.Event.done, D.Event.synchronize = done, sync

    b = D.select_backend("cupy")
    b.activate()
    pool = make_pool(b, 1 << 30)
    watcher = CompletionWatcher("ferry-pre-done")
    stream = D.Stream("preprocess", b)
    fitter = F.GpuFitter(b, pool, PinnedRing(b, 1 << 20, 2), stream, D.Stream("h2d", b), watcher, 5.0)
    target = Target(64, 64, 3, "stretch")
    spin = cupy.RawKernel(r"""
    extern "C" __global__ void spin(long long cycles) {
        long long t0 = clock64();
        while (clock64() - t0 < cycles) { }
    }""", "spin")

    class Holder:  # the coroutine frame that holds a call's rows
        pass

    def round_(k):
        h = Holder()
        early = stream.record() if k % 4 == 2 else None  # made before the lease: the collector
        out, lease = fitter.output(target, 4)  # then finalizes it first, and the lease queries it
        with stream:
            out.fill(7)
            spin((1,), (1,), (cupy.int64(100_000_000 if k % 2 else 1_000_000),))
        lease.after = early or stream.record()
        h.rows = [out[i] for i in range(4)]
        del lease, out  # only the rows hold the lease now
        gc.collect(0)  # a young collection while the work runs
        return h.rows

    def logits(images):  # InferenceStage._logits's refusal, before the fix's traceback drop
        errors = {}
        for i, row in enumerate(images):
            try:
                if i:
                    raise QueueFull("refused", reason="queue_budget")
            except QueueFull as exc:
                errors.setdefault(i, exc)
        return errors

    for k in range(200):
        logits(round_(k))
        gc.collect(1)
    gc.collect()
    stream.synchronize()
    watcher.close()
    print("BAD", bad[0], "IN_USE", pool.bytes_in_use, "HELD", len(F._HELD))
    '''
)


def test_a_lease_in_a_gc_cycle_never_touches_a_destroyed_cuda_event():
    p = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, (p.returncode, p.stderr[-3000:])
    assert "BAD 0 IN_USE 0 HELD 0" in p.stdout, p.stdout + p.stderr[-3000:]
