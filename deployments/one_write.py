"""An HTTP answer in one socket write: uvicorn's HTTP/1.1 server (which Serve runs in each
ingress replica) writes a response's status line and headers when the app sends
``http.response.start`` and its body at ``http.response.body``: two ``send`` system calls,
and with ``TCP_NODELAY`` two TCP segments for HAProxy to read, for an answer of a few
hundred bytes.

``install()`` makes the headers wait for the body: from ``http.response.start`` until the
first body message, what uvicorn writes is held, and goes out with that message's bytes in
one write (the last body message of a sized answer; a streamed answer flushes the held
headers at its first chunk and streams as before). Nothing else of uvicorn's changes: its
own ``send`` still checks every message, sets the headers and the keep-alive state; only its
transport is a ``_Held`` between the two messages. A connection closed, or an app that
returns without its body, ends as uvicorn ends it (the held headers are dropped with the
connection).

Measured on the 2-core development VM (``profile_pipeline.json``, experiment
``one_write``); a bare socket there costs 28 us of sender CPU for a 180-byte answer in
two sends, 15 us in one, and the reader twice as much for two segments.

Installed in the ingress replica's process (``ingress.one_write``, default on). It patches
the class of the protocol in use -- ``httptools`` where installed (``ray[serve]`` brings
it), ``h11`` otherwise -- and refuses, logging why, where that class is not the one it was
written against (``send`` and ``transport`` as in uvicorn 0.2x-0.5x).
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)
_PATCHED = "_ferry_one_write"


class _Held:
    """A transport that keeps what is written (``parts``) and passes everything else on;
    closed while holding, it writes what it holds first (uvicorn closes a connection that
    is not kept alive inside the body's ``send``, and one whose app returned without a body)."""

    __slots__ = ("parts", "real")

    def __init__(self, real: Any) -> None:
        self.real = real
        self.parts: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.parts.append(data)

    def flush(self) -> None:
        if self.parts and not self.real.is_closing():
            self.real.write(b"".join(self.parts))
        self.parts = []

    def close(self) -> None:
        self.flush()
        self.real.close()

    def __getattr__(self, name: str) -> Any:  # is_closing, get_extra_info, ...
        return getattr(self.real, name)


def _one_write(send: Any) -> Any:
    """``send`` of a RequestResponseCycle class, with the headers held for the body."""

    async def one_write_send(self: Any, message: Any) -> None:
        held = self.transport
        if isinstance(held, _Held):  # the headers wait: this is the first body message
            try:
                await send(self, message)  # its bytes join the held headers
            finally:
                if self.transport is held:
                    self.transport = held.real
                held.flush()
            return
        if message["type"] == "http.response.start" and not self.response_started:
            self.transport = _Held(held)
            try:
                await send(self, message)
            except BaseException:
                self.transport = held  # refused by uvicorn's checks: nothing to write
                raise
            return
        await send(self, message)

    one_write_send.__wrapped__ = send  # type: ignore[attr-defined]
    return one_write_send


def _cycle_classes() -> list[Any]:
    out = []
    try:
        from uvicorn.protocols.http.httptools_impl import RequestResponseCycle as httptools_cycle

        out.append(httptools_cycle)
    except ImportError:  # no httptools: uvicorn serves with h11
        pass
    try:
        from uvicorn.protocols.http.h11_impl import RequestResponseCycle as h11_cycle

        out.append(h11_cycle)
    except ImportError:
        pass
    return out


def _fits(cls: Any) -> bool:
    """The class as this patch was written against: an async ``send(self, message)`` that
    writes through ``self.transport`` and keeps ``response_started`` and ``disconnected``."""
    import inspect

    send = getattr(cls, "send", None)
    if send is None or not inspect.iscoroutinefunction(send):
        return False
    try:
        src = inspect.getsource(send)
    except (OSError, TypeError):
        return False
    return all(
        s in src for s in ("self.transport.write", "self.response_started", "self.disconnected")
    )


def install() -> bool:
    """Patch uvicorn's response cycles in this process (once); True where every class found
    fits and is patched (or was already)."""
    classes = _cycle_classes()
    if not classes:
        logger.warning("one_write: uvicorn's HTTP protocols not found; answers use two writes")
        return False
    ok = True
    for cls in classes:
        if getattr(cls, _PATCHED, False):
            continue
        if not _fits(cls):
            logger.warning(
                "one_write: %s.%s is not the uvicorn send this was written for; its answers "
                "keep two writes",
                cls.__module__,
                cls.__qualname__,
            )
            ok = False
            continue
        cls.send = _one_write(cls.send)
        setattr(cls, _PATCHED, True)
    return ok
