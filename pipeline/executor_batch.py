"""What one batch holds between ``GpuExecutor.prepare`` and the end of its commit: the
prepared batch (bucket, plan, arena reservation, pinned staging slot, and the route chosen
for it: stream, bound graph, views), the check of the rows a caller hands over, and the
copy of them into a staging buffer."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from .device import Backend, is_device_array
from .engines.base import EnginePlan
from .errors import InvalidInput
from .memory import PinnedSlot, Reservation


class PreparedBatch:
    """What ``prepare`` reserved for one batch. Committing hands it over; else release it."""

    __slots__ = (
        "model",
        "n",
        "bucket",
        "plan",
        "reservation",
        "slot",
        "naive",
        "_lock",
        "_released",
        "committed",
        "faults",
        "route",
        "given",
    )

    def __init__(
        self,
        model: str,
        n: int,
        bucket: int,
        plan: EnginePlan,
        reservation: Reservation | None,
        slot: PinnedSlot | None,
        naive: bool,
    ) -> None:
        self.model = model
        self.n = n
        self.bucket = bucket
        self.plan = plan
        self.reservation = reservation
        self.slot = slot
        self.naive = naive
        self._lock = threading.Lock()
        self._released = False
        self.committed = False
        self.faults: frozenset[str] = frozenset()  # injected faults that hit it (faults.py)
        self.route: Any = None  # where it runs, chosen at prepare (executor_commit.Route)
        self.given: np.ndarray | None = None  # the view ``staging`` handed out (commit: no copy)

    def release(self) -> None:
        """Give back the staging slot and the reservation; safe to call more than once."""
        with self._lock:
            if self._released:
                return
            self._released = True
        if self.reservation is not None:
            self.reservation.release()
        if self.slot is not None:
            self.slot.release()

    @property
    def released(self) -> bool:
        return self._released

    def staging(self) -> np.ndarray | None:
        """The pinned slot's input rows ``[n, *item]``: a producer may write the batch here
        and commit this very array, which then skips the host copy into pinned memory
        (None in naive mode, which has no slot)."""
        if self.slot is None:
            return None
        if self.route is not None:  # the slot's view, made once per slot and arena
            self.given = self.route.stage_in[: self.n]
            return self.given
        spec = self.plan.input_spec
        return self.slot.view(0, spec.shape, spec.dtype)[: self.n]

    def __enter__(self) -> PreparedBatch:
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.committed:
            self.release()


def check_input(p: PreparedBatch, x: Any, backend: Backend) -> np.ndarray | list[np.ndarray]:
    """An array [n, *item], or a list of n arrays [*item] (copied row by row into the
    staging slot, which saves stacking them first); ``InvalidInput`` for anything else."""
    spec = p.plan.input_spec
    item = tuple(spec.shape[1:])
    if isinstance(x, list | tuple):
        if len(x) != p.n:
            raise InvalidInput("batch has the wrong number of rows", rows=len(x), expected=p.n)
        if (p.naive or not backend.is_cuda) and any(is_device_array(r) for r in x):
            x = [r.get() if is_device_array(r) else r for r in x]  # the baseline and the CPU
        for r in x:  # on the GPU, device rows (GPU preprocessing) may sit beside host rows
            if (
                not (is_device_array(r) or isinstance(r, np.ndarray))
                or tuple(r.shape) != item
                or r.dtype != spec.np_dtype
            ):
                raise InvalidInput(
                    "a row does not match the model's input",
                    shape=getattr(r, "shape", None),
                    dtype=str(getattr(r, "dtype", type(r).__name__)),
                    expected=item,
                    expected_dtype=spec.dtype,
                )
        return list(x)
    if not isinstance(x, np.ndarray):
        raise InvalidInput("a batch must be a numpy array or a list of rows", got=type(x).__name__)
    want = (p.n, *item)
    if tuple(x.shape) != want:
        raise InvalidInput(
            "batch shape does not match the prepared batch", shape=tuple(x.shape), expected=want
        )
    if x.dtype != spec.np_dtype:
        raise InvalidInput(
            "batch dtype does not match the model's input",
            dtype=x.dtype.name,
            expected=spec.dtype,
        )
    return x


def stage(dst: np.ndarray, x: np.ndarray | list[np.ndarray], n: int, given: Any = None) -> None:
    """Copy ``n`` host rows into ``dst`` (a bucket's worth) and zero the padding after
    them; device rows in a list are skipped (the commit copies them on the device).
    ``given``: the view of ``dst`` the batch's ``staging`` handed out, if any."""
    if (given is not None and x is given) or (
        isinstance(x, np.ndarray) and _address(x) == _address(dst)
    ):
        pass  # written into the slot by the caller (``PreparedBatch.staging``): no copy
    elif isinstance(x, list):
        for i, r in enumerate(x):
            if isinstance(r, np.ndarray):  # device rows are copied on the device
                dst[i] = r
    else:
        dst[:n] = x
    if n < len(dst):
        dst[n:] = 0


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]  # (cheaper than ``a.ctypes.data``)


def row_runs(rows: list[tuple[int, int]], row_bytes: int) -> list[tuple[int, int, int]]:
    """Runs of rows that sit next to each other both in the batch and in device memory, as
    (the first row's index in the batch, its address, rows): one device-to-device copy a
    run instead of a copy kernel a row. A decode round's fit hands its rows over as views
    of one batch, so the rows of a round that land together in a GPU batch are one run.
    ``rows``: (index in the batch, address), in batch order."""
    runs: list[list[int]] = []
    for i, ptr in rows:
        last = runs[-1] if runs else None
        if last is not None and last[0] + last[2] == i and last[1] + last[2] * row_bytes == ptr:
            last[2] += 1
        else:
            runs.append([i, ptr, 1])
    return [(i, ptr, k) for i, ptr, k in runs]
