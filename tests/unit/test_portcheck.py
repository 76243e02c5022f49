"""deployments/portcheck.py names the process that holds a port."""

from __future__ import annotations

import os
import socket
import sys

import pytest

from deployments import portcheck

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def test_names_this_process_while_it_listens_and_nothing_after(capsys):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    try:
        (h,) = portcheck.holders(port)
        assert h["pid"] == os.getpid() and "python" in h["name"]
        assert portcheck.main(["portcheck", str(port)]) == 1
        assert f"pid {os.getpid()}" in capsys.readouterr().out
    finally:
        s.close()
    assert portcheck.holders(port) == []
    assert portcheck.main(["portcheck", str(port)]) == 0


def test_wait_free_returns_once_the_holder_lets_go_and_names_one_that_does_not():
    import threading

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    try:
        (h,) = portcheck.wait_free(port, 0.3)  # still held when the wait ends
        assert h["pid"] == os.getpid()
    finally:
        threading.Timer(0.3, s.close).start()
    assert portcheck.wait_free(port, 10) == []  # free once the socket is closed
