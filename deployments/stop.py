"""Stop Ferry without dropping the requests in flight: ``python -m deployments.stop``.

``serve shutdown`` (and ``serve.shutdown()``, which it calls through the dashboard) kills
Serve's HTTP proxies as it begins: in Ray 2.60 the controller's first shutdown step calls
each proxy's ``shutdown`` -- which does nothing -- and then ``ray.kill``s it
(``ray/serve/_private/proxy_state.py``, ``ActorProxyWrapper.kill``), in the same step as it
starts stopping the replicas. The replicas drain (``graceful_shutdown_timeout_s``), but a
request in flight has lost the connection its answer would go back on. Deleting the
applications first drains their replicas while the proxies still carry the answers; Serve
is then shut down with nothing in flight. And as ``serve.delete`` stops all of an
application's deployments together, a request still between them would find no replica
downstream: so each application's ingress is drained first (``deployments/drain.py``) --
new requests get 503 with ``Retry-After`` and readiness turns false until it holds none.

    python -m deployments.stop                 # every application, then Serve
    python -m deployments.stop --app ferry --keep-serve
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

import ray
from ray import serve

from .drain import drain_app, forget

logger = logging.getLogger(__name__)


def stop(
    apps: list[str] | None = None, keep_serve: bool = False, drain_timeout_s: float = 60.0
) -> list[str]:
    """Drain ``apps`` (None: every application; ``deployments.drain``: the ingress refuses
    new work until it holds none, at most ``drain_timeout_s``), delete each (waiting until
    its replicas are gone), then shut Serve down unless ``keep_serve``. Returns the apps
    deleted. Needs a connected Ray (``ray.init``)."""


    names = list(serve.status().applications) if apps is None else apps
    for name in names:
        # the ingress refuses new work (503 + Retry-After) until it holds nothing: then no
        # request is left between the app's deployments when they all stop together
        try:
            if not drain_app(name, drain_timeout_s):
                logger.warning("%s: still in flight after %.0f s; deleting", name, drain_timeout_s)
            serve.delete(name)  # blocking: the proxies keep answering meanwhile
        finally:
            forget(name)  # (a stop that failed leaves no flag behind)
    if not keep_serve:
        serve.shutdown()
    return names


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--address", default="auto", help="the Ray cluster (ray.init's address)")
    ap.add_argument("--app", action="append", help="only this application (repeatable)")
    ap.add_argument("--keep-serve", action="store_true", help="delete the apps, keep Serve")
    ap.add_argument(
        "--drain-timeout-s", type=float, default=60.0, help="the longest wait for a drain"
    )
    a = ap.parse_args(argv)

    ray.init(address=a.address, log_to_driver=False)
    t0 = time.monotonic()
    names = stop(a.app, a.keep_serve, a.drain_timeout_s)
    print(
        f"deleted {', '.join(names) or 'no application'}"
        f"{'' if a.keep_serve else '; Serve shut down'} in {time.monotonic() - t0:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
