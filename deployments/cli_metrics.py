"""``ferry metrics-url [--address ADDR]``: where Prometheus scrapes Ferry's metrics.

Ferry's metrics (``ray_ferry_*``) are on Ray's metrics endpoint, one per node: each node's
``metrics_export_port`` -- a random free port unless pinned with ``ray start
--metrics-export-port``, so under ``serve run`` it changes with every start. This asks the
running cluster's node table (``ray.nodes()``: ``NodeManagerAddress`` and
``MetricsExportPort``) and prints ``http://HOST:PORT/metrics`` for every live node, one a
line (a Prometheus scrape target each). Exit status 1 when no cluster answers.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import ray


def metrics_urls(nodes: list[dict[str, Any]]) -> list[str]:
    """The metrics URL of every live node of a Ray node table (``ray.nodes()``)."""
    out = []
    for n in nodes:
        host, port = n.get("NodeManagerAddress"), n.get("MetricsExportPort")
        if not n.get("Alive", True) or not host or not port:
            continue
        host = f"[{host}]" if ":" in host else host  # an IPv6 address
        out.append(f"http://{host}:{int(port)}/metrics")
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="ferry metrics-url",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--address", default="auto", help="the Ray cluster (ray.init's address; default: auto)"
    )
    ap.add_argument("--json", action="store_true", help="a JSON list of the URLs")
    args = ap.parse_args(argv)

    try:
        ray.init(address=args.address, log_to_driver=False, logging_level="ERROR")
    except (ConnectionError, RuntimeError, ValueError) as exc:
        print(
            f"error: no running Ray cluster at {args.address!r} ({exc}); start one with "
            "`serve run` or `ray start --head`",
            file=sys.stderr,
        )
        return 1
    try:
        urls = metrics_urls(ray.nodes())
    finally:
        ray.shutdown()
    print(json.dumps(urls) if args.json else "\n".join(urls))
    return 0 if urls else 1
