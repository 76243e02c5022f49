"""Tests' threads started together: ``all_at_once(n, work)`` runs ``work(k)`` for each k in
``range(n)`` on a thread of its own, all released by one barrier, joins them, and raises
the first error any of them raised (a thread still running past ``timeout`` fails too)."""

from __future__ import annotations

import threading
from collections.abc import Callable


def all_at_once(n: int, work: Callable[[int], None], timeout: float = 60.0) -> None:
    start = threading.Barrier(n)
    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            start.wait()
            work(k)
        except BaseException as exc:  # pragma: no cover - raised below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    if errors:
        raise errors[0]
    assert not any(t.is_alive() for t in threads), f"a thread ran past {timeout} s"
