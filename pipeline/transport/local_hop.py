"""The local hop: an ingress's coalesced groups to an inference replica on the same node over
a Unix socket, instead of a Serve call.

A Serve call costs both ends a Ray task -- the handle's routing, the call's serialisation
through the core worker, the replica's request bookkeeping -- about a millisecond of CPU per
coalesced group on an H200 host. Between two processes of one node the same group goes as one
length-prefixed pickle over a Unix socket: one write, one read, and a pickle of the items
(their bytes copied once). ``split`` and ``gpu_preprocess`` use it where an inference replica
of the application runs on the ingress's node (``transport.local_hop``), and fall back to the
Serve call where none does or its connection is lost mid-call -- a group is never lost:
whatever its socket did not answer is sent again by Serve.

* ``HopServer`` (in the inference replica): listens on ``<hop_dir>/<replica>.sock``, runs
  each call it is sent as a task of the replica's event loop, answers in the order calls
  finish.
* ``HopClient`` (in the ingress): finds the sockets in ``hop_dir`` (a listing at most once a
  second), keeps one connection to each, and sends each call to the one with the fewest
  items in flight.

No Ray here: the directory is named by the caller (``hop_dir``: the node and the
application make it).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import logging
import os
import pickle
import struct
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

logger = logging.getLogger(__name__)

HEADER = struct.Struct("<Q")
"""A message: its pickle's length, then the pickle (protocol 5)."""
MAX_MESSAGE = 8 << 30
"""A length past this is a broken stream, not a message (a group is at most
``max_coalesce`` bodies of ``max_body_bytes``)."""
RESCAN_S = 1.0
"""How often a client lists the directory for replicas that came or went."""

Handler = Callable[[str, tuple], Awaitable[Any]]


def hop_dir(node_id: str, app: str) -> str:
    """The directory of an application's sockets on one node (short enough for a socket
    path: a Unix socket's path holds at most 107 bytes)."""
    key = hashlib.sha1(f"{node_id}\0{app}".encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"ferry-hop-{key}")


class HopLost(Exception):
    """The socket closed before this call was answered: send it another way."""


class _Framed(asyncio.Protocol):
    """Length-prefixed pickles both ways; each whole message is handed to ``on_message``."""

    def __init__(self) -> None:
        self.transport: Any = None
        self.buf = bytearray()

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if not self.buf:  # the common case: whole messages in one read, parsed in place
            end = self._parse(data)
            if end < len(data):
                self.buf += memoryview(data)[end:]
            return
        self.buf += data
        end = self._parse(self.buf)
        del self.buf[:end]

    def _parse(self, data: Any) -> int:
        """Every whole message in ``data``; the offset after the last one."""
        pos, size = 0, len(data)
        while size - pos >= HEADER.size:
            (n,) = HEADER.unpack_from(data, pos)
            if n > MAX_MESSAGE:
                logger.error("local hop: a message of %d bytes; closing the connection", n)
                self.transport.close()
                return size
            if size - pos - HEADER.size < n:
                break
            start = pos + HEADER.size
            with memoryview(data) as view:
                msg = pickle.loads(view[start : start + n])
            pos = start + n
            self.on_message(msg)
        return pos

    def send(self, msg: Any) -> None:
        data = pickle.dumps(msg, protocol=5)
        self.transport.writelines((HEADER.pack(len(data)), data))

    def on_message(self, msg: Any) -> None:
        raise NotImplementedError


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it pickles, else a RuntimeError with its text (the caller must hear of it)."""
    try:
        pickle.dumps(exc, protocol=5)
        return exc.with_traceback(None)
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


class _ServerSide(_Framed):
    def __init__(self, handler: Handler) -> None:
        super().__init__()
        self.handler = handler
        self.tasks: set[asyncio.Task] = set()

    def on_message(self, msg: Any) -> None:
        call_id, method, args = msg
        task = asyncio.ensure_future(self._run(call_id, method, args))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run(self, call_id: int, method: str, args: tuple) -> None:
        try:
            reply: tuple = (call_id, True, await self.handler(method, args))
        except Exception as exc:
            reply = (call_id, False, _portable(exc))
        if self.transport is None or self.transport.is_closing():
            return
        try:
            self.send(reply)
        except Exception as exc:  # an answer that does not pickle: the caller hears why
            self.send((call_id, False, _portable(exc)))

    def connection_lost(self, exc: BaseException | None) -> None:
        self.transport = None  # the calls still running finish; their answers have nowhere to go


class HopServer:
    """Serves ``handler(method, args)`` on ``<directory>/<name>.sock`` in the running loop."""

    def __init__(self, directory: str, name: str, handler: Handler) -> None:
        self.path = os.path.join(directory, f"{name}.sock")
        self.handler = handler
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> HopServer:
        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)  # a replica of the same name that died before unlinking
        loop = asyncio.get_running_loop()
        self.server = await loop.create_unix_server(lambda: _ServerSide(self.handler), self.path)
        return self

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


class _ClientSide(_Framed):
    def __init__(self, path: str, on_lost: Callable[[_ClientSide], None]) -> None:
        super().__init__()
        self.path = path
        self.on_lost = on_lost
        self.calls: dict[int, tuple[asyncio.Future, int]] = {}
        self.load = 0  # items in flight
        self.ids = itertools.count()

    def call(self, method: str, args: tuple, weight: int) -> asyncio.Future:
        call_id = next(self.ids)
        self.send((call_id, method, args))  # (first: arguments that do not pickle leave no trace)
        fut = asyncio.get_running_loop().create_future()
        self.calls[call_id] = (fut, weight)
        self.load += weight
        return fut

    def on_message(self, msg: Any) -> None:
        call_id, ok, value = msg
        entry = self.calls.pop(call_id, None)
        if entry is None:
            return
        fut, weight = entry
        self.load -= weight
        if not fut.done():
            (fut.set_result if ok else fut.set_exception)(value)

    def connection_lost(self, exc: BaseException | None) -> None:
        calls, self.calls, self.load = self.calls, {}, 0
        for fut, _ in calls.values():
            if not fut.done():
                fut.set_exception(HopLost(self.path))
        self.on_lost(self)


class HopClient:
    """Sends calls to the inference replicas whose sockets are in ``directory``."""

    def __init__(self, directory: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.directory = directory
        self.clock = clock
        self.conns: dict[str, _ClientSide] = {}
        self._scanned = float("-inf")
        self._scan: asyncio.Task | None = None

    async def call(self, method: str, args: tuple, weight: int = 1) -> Any:
        """The call's answer from the least loaded replica; ``HopLost`` where there is none,
        or where its connection closed before it answered (whether it ran is not known)."""
        if self.clock() - self._scanned >= RESCAN_S:
            if self._scan is None or self._scan.done():
                self._scan = asyncio.ensure_future(self._rescan())
            if not self.conns:
                await asyncio.shield(self._scan)  # (the first call waits for the first listing)
        if not self.conns:
            raise HopLost("no inference replica on this node")
        conn = min(self.conns.values(), key=lambda c: c.load)
        return await conn.call(method, args, weight)

    async def _rescan(self) -> None:
        self._scanned = self.clock()
        try:
            names = [n for n in os.listdir(self.directory) if n.endswith(".sock")]
        except FileNotFoundError:
            names = []
        loop = asyncio.get_running_loop()
        for name in names:
            path = os.path.join(self.directory, name)
            if path in self.conns:
                continue
            try:
                _, proto = await loop.create_unix_connection(
                    lambda p=path: _ClientSide(p, self._lost), path
                )
            except ConnectionRefusedError:  # a socket file whose replica is gone
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                continue
            except OSError as exc:
                logger.debug("local hop: %s: %s", path, exc)
                continue
            self.conns[path] = proto

    def _lost(self, conn: _ClientSide) -> None:
        if self.conns.get(conn.path) is conn:
            del self.conns[conn.path]

    def close(self) -> None:
        for conn in list(self.conns.values()):
            if conn.transport is not None:
                conn.transport.close()
        self.conns.clear()
