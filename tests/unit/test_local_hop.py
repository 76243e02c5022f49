"""The local hop (``pipeline/transport/local_hop.py``, ``deployments/ingress_route.LocalHop``)
over real Unix sockets in a temporary directory: calls and their answers, errors that cross,
the least loaded replica chosen, a replica gone mid-call or before it, messages split
across reads and packed into one, and the ingress's fallback to its Serve call."""

from __future__ import annotations

import asyncio
import os
import pickle
import socket

import pytest

from deployments.ingress_route import LocalHop
from pipeline.errors import QueueFull
from pipeline.transport import local_hop
from pipeline.transport.local_hop import HEADER, HopClient, HopLost, HopServer, _Framed


@pytest.fixture
def hop_dir(tmp_path):
    d = tmp_path / "hop"  # (pytest's tmp_path is short enough for a socket path here)
    return str(d)


def _echo(tag: str, log: list | None = None):
    async def handle(method: str, args: tuple):
        if log is not None:
            log.append((tag, method, args))
        if method == "fail":
            raise QueueFull("queue is full", retry_after_s=1.5, model=args[0])
        if method == "unpicklable":
            raise RuntimeError(lambda: None)  # (a lambda does not pickle)
        if method == "unpicklable_answer":
            return lambda: None
        return (tag, method, args)

    return handle


async def test_a_call_and_its_answer_cross_the_socket(hop_dir):
    server = await HopServer(hop_dir, "inf-a", _echo("a")).start()
    client = HopClient(hop_dir)
    try:
        big = os.urandom(3 << 20)  # a group of large JPEGs arrives over many reads
        assert await client.call("encoded", ("m", [big], [1])) == (
            "a",
            "encoded",
            ("m", [big], [1]),
        )
        answers = await asyncio.gather(*(client.call("encoded", (i,)) for i in range(50)))
        assert [a[2] for a in answers] == [(i,) for i in range(50)]
    finally:
        client.close()
        server.close()
    assert not os.path.exists(server.path)  # the replica takes its socket file with it


async def test_errors_cross_as_the_callee_raised_them(hop_dir):
    server = await HopServer(hop_dir, "inf-a", _echo("a")).start()
    client = HopClient(hop_dir)
    try:
        with pytest.raises(QueueFull) as err:
            await client.call("fail", ("resnet50",))
        assert err.value.fields["model"] == "resnet50"
        assert err.value.retry_after_s == 1.5
        with pytest.raises(RuntimeError, match="RuntimeError"):  # its text, not a hang
            await client.call("unpicklable", ())
        with pytest.raises(Exception, match="pickle"):  # arguments that cannot cross ...
            await client.call("ok", (lambda: None,))
        assert all(c.load == 0 and not c.calls for c in client.conns.values())
        with pytest.raises(Exception, match="pickle"):  # ... nor an answer
            await asyncio.wait_for(client.call("unpicklable_answer", ()), 5)
        assert await client.call("ok", ()) == ("a", "ok", ())  # the connection lives on
    finally:
        client.close()
        server.close()


async def test_each_call_goes_to_the_replica_with_the_fewest_items_in_flight(hop_dir):
    log: list = []
    servers = [await HopServer(hop_dir, n, _echo(n, log)).start() for n in ("a", "b")]
    client = HopClient(hop_dir)
    try:
        await client.call("x", (0,))  # (the first call lists the directory)
        assert len(client.conns) == 2
        log.clear()
        # two calls at once: the first one's items count against its replica at once
        await asyncio.gather(*(client.call("x", (i,), weight=4) for i in range(2)))
        assert sorted(t for t, _, _ in log) == ["a", "b"]
        assert all(c.load == 0 for c in client.conns.values())  # answered: no load left
        busy, idle = sorted(client.conns.values(), key=lambda c: c.path)
        busy.load = 100  # (as if 100 items were in flight there)
        log.clear()
        await asyncio.gather(*(client.call("x", (i,)) for i in range(5)))
        assert {t for t, _, _ in log} == {os.path.basename(idle.path)[: -len(".sock")]}
    finally:
        client.close()
        for s in servers:
            s.close()


async def test_a_replica_gone_mid_call_fails_the_call_with_hop_lost(hop_dir):
    started = asyncio.Event()

    async def slow(method, args):
        started.set()
        await asyncio.sleep(30)

    server = await HopServer(hop_dir, "inf-a", slow).start()
    client = HopClient(hop_dir)
    call = asyncio.ensure_future(client.call("encoded", ()))
    await asyncio.wait_for(started.wait(), 5)
    conn = next(iter(client.conns.values()))
    server.close()
    conn.transport.close()  # (what the replica's death does to the client's end)
    with pytest.raises(HopLost):
        await asyncio.wait_for(call, 5)
    assert client.conns == {} and conn.load == 0
    with pytest.raises(HopLost, match="no inference replica"):
        await client.call("encoded", ())  # nothing left on this node
    client.close()


async def test_a_stale_socket_file_is_removed_and_a_new_replica_found(hop_dir):
    os.makedirs(hop_dir)
    stale = os.path.join(hop_dir, "dead.sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(stale)
    s.close()  # bound, never listening: what a killed replica leaves
    now = [0.0]
    client = HopClient(hop_dir, clock=lambda: now[0])
    with pytest.raises(HopLost):
        await client.call("x", ())
    assert not os.path.exists(stale)
    server = await HopServer(hop_dir, "inf-b", _echo("b")).start()
    with pytest.raises(HopLost):  # the directory is listed at most once a RESCAN_S
        await client.call("x", ())
    now[0] += local_hop.RESCAN_S
    assert (await client.call("x", ()))[0] == "b"
    client.close()
    server.close()


def test_messages_split_across_reads_or_packed_in_one_are_each_delivered():
    got: list = []

    class Sink(_Framed):
        def on_message(self, msg):
            got.append(msg)

    msgs = [b"x" * 10, {"a": 1}, list(range(1000)), b""]
    wire = b"".join(HEADER.pack(len(p)) + p for p in (pickle.dumps(m, 5) for m in msgs))
    for cut in (1, 3, 8, 9, 17, 64, len(wire)):  # byte by byte up to all at once
        got.clear()
        sink = Sink()
        for i in range(0, len(wire), cut):
            sink.data_received(wire[i : i + cut])
        assert got == msgs and not sink.buf, cut


class _Handle:
    """A Serve method handle as ServeHop calls it: ``.remote(...)`` awaited."""

    def __init__(self, log):
        self.log = log

    def remote(self, *args):
        async def answer():
            self.log.append(args)
            return ["serve"] * len(args[1])

        return answer()


class _Inference:
    def __init__(self, log):
        self.encoded = _Handle(log)
        self.answers = _Handle(log)


async def test_the_ingress_falls_back_to_its_serve_call_where_no_socket_answers(hop_dir):
    serve_calls: list = []
    way = LocalHop(_Inference(serve_calls), HopClient(hop_dir))
    assert await way.classify("m", ["i1", "i2"], [None, None], [None, None]) == ["serve"] * 2
    assert len(serve_calls) == 1  # no replica on this node: Serve's call

    async def answer(method, args):
        return [f"socket:{method}"] * len(args[1])

    server = await HopServer(hop_dir, "inf-a", answer).start()
    way.client._scanned = float("-inf")  # (as a second later)
    assert await way.classify("m", ["i1"], [None], [None]) == ["socket:encoded"]
    assert len(serve_calls) == 1  # the socket answered; Serve was not called
    server.close()
    way.client.close()


def test_the_hop_is_local_in_split_and_gpu_preprocess_unless_off_or_autoscaled():
    from deployments import local_hop as app_hop
    from pipeline.config import PipelineConfig

    def cfg(placement, **over):
        base = {"models": [{"name": "digits", "arch": "digits"}], "placement": placement}
        return PipelineConfig.model_validate({**base, **over})

    assert app_hop.enabled(cfg("split"))
    assert not app_hop.enabled(cfg("split", transport={"local_hop": False}))
    scaled = {"num_replicas": None, "autoscaling_config": {"min_replicas": 1, "max_replicas": 2}}
    assert not app_hop.enabled(cfg("split", inference_deployment=scaled))
    assert not app_hop.enabled(cfg("four_stage")) and not app_hop.enabled(cfg("one_process"))
    assert app_hop.directory() is None  # outside a Serve replica: Serve's calls only


SLOW_SERVER = """
import asyncio, sys
from pipeline.transport.local_hop import HopServer

async def handle(method, args):
    await asyncio.sleep(60)

async def main():
    await HopServer(sys.argv[1], "inf-slow", handle).start()
    print("listening", flush=True)
    await asyncio.sleep(120)

asyncio.run(main())
"""


async def test_a_replica_process_killed_under_calls_loses_none_of_them(hop_dir, tmp_path):
    """A real process, killed (SIGKILL) with calls in flight: each call hears HopLost -- the
    ingress sends it again as a Serve call -- and its socket file, left behind, is removed by
    the next listing."""
    import subprocess
    import sys

    script = tmp_path / "slow_server.py"
    script.write_text(SLOW_SERVER)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.Popen(
        [sys.executable, str(script), hop_dir],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": root},
    )
    try:
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30)
        assert line.strip() == b"listening"
        now = [0.0]
        client = HopClient(hop_dir, clock=lambda: now[0])
        calls = [asyncio.ensure_future(client.call("encoded", (i,))) for i in range(3)]
        for _ in range(200):  # (the first call lists the directory and connects)
            if client.conns:
                break
            await asyncio.sleep(0.05)
        assert len(client.conns) == 1 and not any(c.done() for c in calls)
        proc.kill()
        results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 10)
        assert all(isinstance(r, HopLost) for r in results), results
        await asyncio.to_thread(proc.wait, 10)  # (gone: its listening socket closed too)
        sock = os.path.join(hop_dir, "inf-slow.sock")
        assert os.path.exists(sock)  # SIGKILL: the replica could not unlink it
        now[0] += local_hop.RESCAN_S
        with pytest.raises(HopLost, match="no inference replica"):
            await client.call("encoded", ())
        assert not os.path.exists(sock)
        client.close()
    finally:
        proc.kill()
        proc.wait(10)
