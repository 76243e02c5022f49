"""Who holds a TCP port: the startup check for HAProxy mode, where Serve's HAProxy can
outlive ``ray stop`` and keep port 8000 (the next ``serve run`` cannot bind, and the orphan
answers 500 to everything).

    python -m deployments.portcheck 8000      # exit 0: free; 1: names every holder

Linux only: reads /proc/net/tcp{,6} for listening sockets on the port and /proc/*/fd for the
processes that own them (as root or as their user).
"""

from __future__ import annotations

import os
import sys


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            local, state, inode = cols[1], cols[3], cols[9]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(inode)
    return inodes


def holders(port: int) -> list[dict]:
    """Every process with a listening socket on ``port``: pid, name, command line."""
    inodes = _listening_inodes(port)
    found = []
    if not inodes:
        return found
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:[") and link[8:-1] in inodes:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
                with open(f"/proc/{pid}/comm") as f:
                    name = f.read().strip()
                found.append({"pid": int(pid), "name": name, "cmdline": cmd[:300]})
                break
    return found


def wait_free(port: int, timeout_s: float) -> list[dict]:
    """Wait up to ``timeout_s`` for ``port`` to have no listener; the holders left (empty:
    free). A Ray that was just stopped keeps its Serve proxy's port for a few seconds."""
    import time

    deadline = time.monotonic() + timeout_s
    held = holders(port)
    while held and time.monotonic() < deadline:
        time.sleep(0.25)
        held = holders(port)
    return held


def main(argv: list[str]) -> int:
    port = int(argv[1]) if len(argv) > 1 else 8000
    held = holders(port)
    if not held and not _listening_inodes(port):
        print(f"port {port} is free")
        return 0
    for h in held:
        hint = " (an orphaned HAProxy of Ray Serve?)" if "haproxy" in h["name"] else ""
        print(f"port {port} is held by pid {h['pid']} {h['name']}{hint}: {h['cmdline']}")
        print(f"  stop it: kill {h['pid']}")
    if not held:
        print(f"port {port} is held by a process this user cannot see (try as root)")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
