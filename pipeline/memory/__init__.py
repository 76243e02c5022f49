"""Where memory is reserved: the device pool (``pool``) and pinned host staging (``pinned``)."""

from .pinned import PinnedRing, PinnedSlot
from .pool import (
    ALIGN,
    CupyPool,
    DevicePool,
    HostArena,
    PoolStats,
    Reservation,
    make_pool,
    round_up,
)

__all__ = [
    "ALIGN",
    "CupyPool",
    "DevicePool",
    "HostArena",
    "PinnedRing",
    "PinnedSlot",
    "PoolStats",
    "Reservation",
    "make_pool",
    "round_up",
]
