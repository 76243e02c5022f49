"""The machine's busy CPU cores over a span: what a load level cost the whole node."""

from __future__ import annotations

import os
import time
from typing import Any


def busy_cores_since(start: Any | None = None) -> tuple[Any, float]:
    """The machine's busy CPU cores (all processes: load generator, proxy, replicas) since
    ``start`` (``None`` starts the clock): ``(mark, cores)``. Tells whether a level was held
    back by the node's cores rather than by one process."""
    import psutil

    t = psutil.cpu_times()._asdict()
    for k in ("guest", "guest_nice"):  # already counted in user and nice
        t.pop(k, None)
    mark = (time.monotonic(), t["idle"] + t.get("iowait", 0.0), sum(t.values()))
    if start is None:
        return mark, 0.0
    wall = mark[0] - start[0]
    idle = mark[1] - start[1]
    total = mark[2] - start[2]
    return mark, round((total - idle) / max(wall, 1e-9), 2)


def run_cpu_s(run_id: str) -> float:
    """CPU seconds (user + system, with their reaped children's) so far of every process of
    the run ``run_id`` (``loadtest.procs``): a ``serve run``'s Ray, Serve, HAProxy and
    replicas, and nothing of the load generator, which runs outside it."""
    from loadtest import procs

    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in procs.marked(run_id):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone since it was listed
        total += sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
    return total / tick


def _label(pid: int, cmd: str) -> str:
    """A process's kind, the same for every replica of one deployment and for its whole life:
    Ray titles its workers ``ray::ServeReplica:app:Deployment.method`` after the task they
    run (``ray::IDLE`` before any), so the method is cut off; other processes are named by
    their program (``raylet``, ``gcs_server``, ``haproxy``, ``python``)."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            comm = f.read().strip()
    except OSError:
        comm = ""
    first = cmd.split(" ", 1)[0] if cmd else comm
    if first.startswith("ray::"):
        return first.split(".", 1)[0]
    return os.path.basename(first) or comm


def thread_cpu_s(run_id: str) -> dict[tuple[str, str], float]:
    """CPU seconds so far of every thread of the run's processes, summed by (process kind,
    thread name): where a server's cores go -- ``("ray::ServeReplica:ferry:Ingress",
    "ferry-submit")``. Threads that ended since are not counted (take the difference of two
    readings over a span in which the thread set is steady)."""
    return _by_thread(run_id, process_threads_cpu_s)


def thread_switches(run_id: str) -> dict[tuple[str, str], float]:
    """Context switches so far (voluntary and not) of every thread of the run's processes,
    summed by (process kind, thread name), as ``thread_cpu_s``: each is a thread put to
    sleep and woken again, so their count an image is the hand-offs a request costs."""
    return _by_thread(run_id, process_threads_switches)


def _by_thread(run_id: str, read: Any) -> dict[tuple[str, str], float]:
    from loadtest import procs

    out: dict[tuple[str, str], float] = {}
    for pid, cmd in procs.marked(run_id).items():
        label = _label(pid, cmd)
        for name, v in read(pid, cmd).items():
            out[(label, name)] = out.get((label, name), 0.0) + v
    return out


def _threads(pid: int, cmd: str) -> list[tuple[str, str, str]]:
    """``(name, tid, the rest of its stat line)`` of each thread of one process (``cmd``: its
    command line, whose program names its unnamed threads). A thread started without a name
    of its own (a native library's, or Python's) carries the process title it was started
    under, as the main thread does: the main thread is "main", the others "unnamed"
    (nvImageCodec's workers, Ray's)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    program = os.path.basename(cmd.split(" ", 1)[0]) if cmd else ""
    out = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                head, rest = f.read().rsplit(")", 1)
        except OSError:
            continue
        name = head.split("(", 1)[1]
        if name.startswith("ray::") or name == program:
            name = "main" if tid == str(pid) else "unnamed"
        out.append((name, tid, rest))
    return out


def process_threads_cpu_s(pid: int, cmd: str = "") -> dict[str, float]:
    """CPU seconds so far of the threads of one process, summed by thread name
    (``_threads``' names)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for name, _, rest in _threads(pid, cmd):
        fields = rest.split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def process_threads_switches(pid: int, cmd: str = "") -> dict[str, float]:
    """Context switches so far of the threads of one process, summed by thread name."""
    out: dict[str, float] = {}
    for name, tid, _ in _threads(pid, cmd):
        n = 0
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    key, _, value = line.partition(":")
                    if key.endswith("ctxt_switches"):  # voluntary_ and nonvoluntary_
                        n += int(value)
        except (OSError, ValueError):
            continue
        out[name] = out.get(name, 0.0) + n
    return out


def busiest(
    before: dict[tuple[str, str], float],
    after: dict[tuple[str, str], float],
    wall_s: float,
    top: int = 12,
    unit: str = "cores",
) -> list[dict[str, Any]]:
    """The ``top`` (process kind, thread name) pairs by what grew between two readings of
    ``thread_cpu_s`` (cores used) or ``thread_switches`` (``unit="switches_per_s"``),
    greatest first: ``[{"process", "thread", unit}]``, a second over ``wall_s``."""
    used = {k: after[k] - before.get(k, 0.0) for k in after}
    ranked = sorted(used.items(), key=lambda kv: -kv[1])[:top]
    return [
        {"process": p, "thread": t, unit: round(s / max(wall_s, 1e-9), 3)}
        for (p, t), s in ranked
        if s > 0
    ]


def machine_counters() -> dict[str, float]:
    """The machine's cumulative counters, where Linux has them (else ``{}``): its CPU seconds
    by kind over all cores (``/proc/stat``: user, system, irq, softirq, steal), context
    switches, interrupts, the interrupts of NVIDIA's devices (``/proc/interrupts``) and TCP's
    connections and segments (``/proc/net/snmp``).
    Two readings over a span (``counter_rates``) tell how the machine spent it beyond what
    one process did: the kernel's share, interrupts an image, switches an image."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    try:
        with open("/proc/stat") as f:
            for line in f:
                key, _, rest = line.partition(" ")
                if key == "cpu":
                    v = [int(x) for x in rest.split()]
                    for i, name in ((0, "user"), (2, "system"), (5, "irq"), (6, "softirq")):
                        out[name + "_s"] = v[i] / tick
                    out["steal_s"] = v[7] / tick if len(v) > 7 else 0.0
                elif key in ("ctxt", "intr"):
                    out[key] = float(rest.split()[0])
    except (OSError, ValueError, IndexError):
        return {}
    try:
        with open("/proc/interrupts") as f:
            n = 0
            for line in f:
                if "nvidia" in line:
                    n += sum(int(x) for x in line.split()[1:] if x.isdigit())
            out["nvidia_intr"] = float(n)
    except OSError:
        pass
    out.update(_tcp_counters())
    return out


_TCP = {
    "ActiveOpens": "tcp_opens",
    "PassiveOpens": "tcp_accepts",
    "InSegs": "tcp_in_segs",
    "OutSegs": "tcp_out_segs",
    "RetransSegs": "tcp_retrans",
}


def _tcp_counters() -> dict[str, float]:
    """The machine's TCP counters (``/proc/net/snmp``): connections opened and accepted,
    segments in and out, retransmitted. An image's segments and connections tell whether a
    slower level sends its answers in more pieces or over new connections (the load
    generator's and HAProxy's CPU a request grow then, though neither runs Ferry's code)."""
    try:
        with open("/proc/net/snmp") as f:
            rows = [line.split() for line in f if line.startswith("Tcp:")]
        names, values = rows[0][1:], rows[1][1:]
        return {_TCP[k]: float(v) for k, v in zip(names, values, strict=True) if k in _TCP}
    except (OSError, IndexError, ValueError):
        return {}


def counter_rates(before: dict[str, float], after: dict[str, float], wall_s: float) -> dict:
    """Per second between two ``machine_counters`` readings: CPU seconds as cores
    (``system_cores``, ...), counts as a rate (``ctxt_per_s``, ...)."""
    out: dict[str, float] = {}
    for k, v in after.items():
        if k not in before:
            continue
        d = (v - before[k]) / max(wall_s, 1e-9)
        name = k[:-2] + "_cores" if k.endswith("_s") else k + "_per_s"
        out[name] = round(d, 3 if k.endswith("_s") else 0)
    return out


class ServerSpan:
    """What the processes of the run ``run_id`` (a ``serve run``: its Ray, Serve, HAProxy and
    replicas; a load generator outside it is not counted) and the machine spent from this
    object's making to ``end()``: ``wall_s``, ``cores`` (the run's CPU seconds over the
    span), ``busy`` (the machine's busy cores, ``busy_cores_since``), ``threads`` (the
    run's busiest, ``busiest``), ``switches`` (its threads that switched most a second) and
    ``machine`` (``counter_rates`` over the span: the kernel's cores, context switches,
    interrupts and TCP's connections and segments a second). The server's cost of one load level, for every benchmark
    that reports one."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self._mark, _ = busy_cores_since()
        self._cpu0, self._threads0 = run_cpu_s(run_id), thread_cpu_s(run_id)
        self._switches0 = thread_switches(run_id)
        self._counters0 = machine_counters()
        self._t0 = time.monotonic()
        self.wall_s = self.cores = self.busy = 0.0  # (set by ``end``)
        self.threads: list[dict[str, Any]] = []
        self.machine: dict[str, float] = {}
        self.switches: list[dict[str, Any]] = []

    def end(self, top: int = 12) -> ServerSpan:
        self.wall_s = max(time.monotonic() - self._t0, 1e-9)
        self.cores = (run_cpu_s(self.run_id) - self._cpu0) / self.wall_s
        self.threads = busiest(self._threads0, thread_cpu_s(self.run_id), self.wall_s, top)
        switches = thread_switches(self.run_id)
        self.switches = busiest(self._switches0, switches, self.wall_s, top, "switches_per_s")
        _, self.busy = busy_cores_since(self._mark)
        self.machine = counter_rates(self._counters0, machine_counters(), self.wall_s)
        return self
