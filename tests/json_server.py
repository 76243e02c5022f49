"""A local HTTP server for the tests of code that polls a JSON API (Ray's dashboard, the
stream books): each GET is answered by ``answer(i, path)`` -- ``(status, body)`` for the
i-th request -- as JSON, until ``shutdown()``."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Callable
from typing import Any


def json_server(answer: Callable[[int, str], tuple[int, Any]]) -> tuple[str, list[int], Any]:
    """The server's base URL, its request count (a one-item list, read as it grows) and the
    server itself (``.shutdown()`` when done)."""
    served = [0]

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            status, doc = answer(served[0], self.path)
            served[0] += 1
            body = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{srv.server_address[1]}", served, srv
