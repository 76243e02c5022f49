"""Stop Ferry without dropping the requests in flight: ``python -m deployments.stop``.

``serve shutdown`` (and ``serve.shutdown()``, which it calls through the dashboard) kills
Serve's HTTP proxies as it begins: in Ray 2.60 the controller's first shutdown step calls
each proxy's ``shutdown`` -- which does nothing -- and then ``ray.kill``s it
(``ray/serve/_private/proxy_state.py``, ``ActorProxyWrapper.kill``), in the same step as it
starts stopping the replicas. The replicas drain (``graceful_shutdown_timeout_s``), but a
request in flight has lost the connection its answer would go back on. Deleting the
applications first drains their replicas while the proxies still carry the answers; Serve
is then shut down with nothing in flight.

    python -m deployments.stop                 # every application, then Serve
    python -m deployments.stop --app ferry --keep-serve
"""

from __future__ import annotations

import argparse
import sys
import time


def stop(apps: list[str] | None = None, keep_serve: bool = False) -> list[str]:
    """Delete ``apps`` (None: every application; each call waits until its replicas have
    drained and gone), then shut Serve down unless ``keep_serve``. Returns the apps
    deleted. Needs a connected Ray (``ray.init``)."""
    from ray import serve

    names = list(serve.status().applications) if apps is None else apps
    for name in names:
        serve.delete(name)  # blocking: the proxies keep answering meanwhile
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
    a = ap.parse_args(argv)
    import ray

    ray.init(address=a.address, log_to_driver=False)
    t0 = time.monotonic()
    names = stop(a.app, a.keep_serve)
    print(
        f"deleted {', '.join(names) or 'no application'}"
        f"{'' if a.keep_serve else '; Serve shut down'} in {time.monotonic() - t0:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
