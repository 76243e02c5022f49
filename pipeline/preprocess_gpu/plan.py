"""Staging plans: where a fit's host bytes go, worked out before anything is reserved.

A fit uploads the host images it has (decoded on CPU threads) and the launch's geometry
table. Both are laid out in one linear range of bytes: the device side is one pool
reservation of that size, the host side the same range striped over pinned slots of the
ring (bytes ``[k * slot_bytes, (k + 1) * slot_bytes)`` are slot ``k``), so an image may
straddle slots and still lands contiguous on the device. Each slot goes up in one copy.

A batch whose staging is more than the ring holds is fitted in parts (``split_parts``),
each prepared -- its slots taken -- only after the part before it was committed, so a
part waits for the ring (backpressure through the reservation) instead of the host
waiting for the device. An image that alone needs more than the ring is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import ResourceExhausted
from ..ops.base import align


@dataclass(frozen=True)
class StagingPlan:
    """The linear layout of one fit's uploads: ``offsets[i]`` of host image ``i`` (``-1``
    for an image already on the device), the geometry table at ``table_offset``."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    table_offset: int
    table_bytes: int
    slot_bytes: int

    @property
    def nbytes(self) -> int:
        """The whole range: the device reservation's size."""
        return self.table_offset + self.table_bytes

    @property
    def slots(self) -> int:
        """Pinned slots the range is striped over."""
        return -(-self.nbytes // self.slot_bytes)

    def used(self, slot: int) -> int:
        """Bytes of slot ``slot`` the range covers (the size of its copy)."""
        return max(0, min(self.slot_bytes, self.nbytes - slot * self.slot_bytes))

    def pieces(self, offset: int, nbytes: int) -> list[tuple[int, int, int, int]]:
        """How ``nbytes`` at linear ``offset`` fall on the slots: (slot, offset in the
        slot, offset in the source, bytes)."""
        out, done = [], 0
        while done < nbytes:
            at = offset + done
            k, o = divmod(at, self.slot_bytes)
            n = min(nbytes - done, self.slot_bytes - o)
            out.append((k, o, done, n))
            done += n
        return out


def plan_staging(
    host_bytes: Sequence[int | None], table_bytes: int, slot_bytes: int
) -> StagingPlan:
    """Lay out ``host_bytes`` (``None``: on the device already) then the table, each at a
    256-byte boundary."""
    if slot_bytes < 1:
        raise ValueError(f"slot_bytes must be positive, got {slot_bytes}")
    offsets, sizes, at = [], [], 0
    for n in host_bytes:
        if n is None:
            offsets.append(-1)
            sizes.append(0)
            continue
        offsets.append(at)
        sizes.append(int(n))
        at = align(at + int(n))
    return StagingPlan(tuple(offsets), tuple(sizes), at, align(table_bytes), slot_bytes)


def split_parts(
    host_bytes: Sequence[int | None],
    table_bytes: Callable[[int], int],
    slot_bytes: int,
    slots: int,
) -> tuple[list[list[int]], dict[int, ResourceExhausted]]:
    """Consecutive runs of image indices whose staging (``table_bytes(n)`` for a run of n)
    fits the ring of ``slots`` x ``slot_bytes``, and the images refused because even alone
    they do not."""
    capacity = slots * slot_bytes
    parts: list[list[int]] = []
    refused: dict[int, ResourceExhausted] = {}
    run: list[int] = []
    run_bytes = 0
    for i, n in enumerate(host_bytes):
        need = 0 if n is None else align(int(n))
        if need + align(table_bytes(1)) > capacity:
            refused[i] = ResourceExhausted(
                "decoded image larger than the GPU stage's pinned staging ring",
                image_bytes=need,
                staging_bytes=capacity,
                slots=slots,
                slot_bytes=slot_bytes,
            )
            continue
        if run and run_bytes + need + align(table_bytes(len(run) + 1)) > capacity:
            parts.append(run)
            run, run_bytes = [], 0
        run.append(i)
        run_bytes += need
    if run:
        parts.append(run)
    return parts, refused


def runs_within(sizes: Sequence[int], budget: int) -> list[list[int]]:
    """Consecutive runs of the indices of ``sizes`` whose sizes sum to at most ``budget``
    (a round's decoded images, a run per decoder call); a size past ``budget`` alone is a
    run of its own. Every index is in exactly one run, in order."""
    runs: list[list[int]] = []
    run: list[int] = []
    total = 0
    for i, n in enumerate(sizes):
        if run and total + n > budget:
            runs.append(run)
            run, total = [], 0
        run.append(i)
        total += n
    if run:
        runs.append(run)
    return runs
