"""Helpers shared by the benchmarks: a description of the machine the figures came from,
medians and percentiles, a free (or reserved) loopback port, and a plain-text table.

Benchmarks print figures; they never assert on timing. Every figure is reported with the
machine it was measured on, because a number without its machine means little."""
from __future__ import annotations

import json
import os
import platform
import socket
import statistics
import sys
import time
from importlib import metadata
from typing import Any, Iterable, Sequence

MIB = 1024 * 1024


# --- the machine -------------------------------------------------------------------------
def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def cpu_model() -> str:
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def memory_mib() -> int | None:
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    return None


def disk_of(path: str) -> dict[str, Any]:
    """The mount that holds path: device, filesystem type, and whether the kernel calls
    the block device rotational (virtual disks often say 1 whatever backs them)."""
    path = os.path.realpath(path)
    best: tuple[str, str, str] | None = None
    for line in _read("/proc/mounts").splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        dev, mnt, fstype = parts[0], parts[1].replace("\\040", " "), parts[2]
        inside = path == mnt or path.startswith(mnt.rstrip("/") + "/")
        if inside and (best is None or len(mnt) > len(best[1])):
            best = (dev, mnt, fstype)
    out: dict[str, Any] = {"path": path}
    if best is None:
        return out
    dev, mnt, fstype = best
    out.update(device=dev, mount=mnt, fstype=fstype)
    name = os.path.basename(dev)
    for cand in (name, name.rstrip("0123456789"), name.rsplit("p", 1)[0]):
        rot = _read(f"/sys/block/{cand}/queue/rotational").strip()
        if rot:
            out["rotational"] = rot == "1"
            break
    try:
        st = os.statvfs(path)
        out["free_gib"] = round(st.f_bavail * st.f_frsize / (1 << 30), 1)
    except OSError:
        pass
    return out


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "-"


def machine(data_path: str) -> dict[str, Any]:
    """nproc, CPU model, memory, Python, OS and the disk under data_path."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 0
    return {
        "nproc": usable,
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
        "memory_mib": memory_mib(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "os": f"{platform.system()} {platform.release()}",
        "disk": disk_of(data_path),
        "packages": {d: _version(d) for d in ("lmdb", "msgpack", "aiohttp", "crc32c")},
    }


def print_machine(m: dict[str, Any], out=sys.stdout) -> None:
    d = m["disk"]
    rot = {True: "rotational", False: "non-rotational"}.get(d.get("rotational"), "rotational?")
    pk = ", ".join(f"{k} {v}" for k, v in m["packages"].items())
    print(f"machine: {m['nproc']} CPUs ({m['cpu_model']}), {m['memory_mib']} MiB RAM, {m['python']}, {m['os']}", file=out)
    print(f"disk:    {d.get('path')} on {d.get('device', '?')} ({d.get('fstype', '?')}, {rot}, "
          f"{d.get('free_gib', '?')} GiB free)", file=out)
    print(f"libs:    {pk}", file=out)


# --- other load on the machine ------------------------------------------------------------
def _cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies over all CPUs since boot, from /proc/stat."""
    for line in _read("/proc/stat").splitlines():
        if line.startswith("cpu "):
            v = [int(x) for x in line.split()[1:9]]
            user, nice, system, idle, iowait, irq, softirq, steal = v
            busy = user + nice + system + irq + softirq + steal
            return busy, busy + idle + iowait
    return 0, 0


class LoadWatch:
    """How busy the whole machine was while a benchmark ran, so figures taken beside
    other work (a test suite, another benchmark) can be recognised as such."""

    def __init__(self) -> None:
        self.loadavg_start = os.getloadavg()[0]
        self._busy0, self._total0 = _cpu_jiffies()
        self._wall0 = time.monotonic()

    def stop(self, own_cpu_s: float) -> dict[str, Any]:
        """own_cpu_s: CPU seconds the benchmark's own processes used meanwhile."""
        busy1, total1 = _cpu_jiffies()
        hz = os.sysconf("SC_CLK_TCK")
        wall = time.monotonic() - self._wall0
        machine_cpu_s = (busy1 - self._busy0) / hz
        others = max(0.0, machine_cpu_s - own_cpu_s)
        return {
            "wall_s": wall,
            "machine_cpu_s": machine_cpu_s,
            "own_cpu_s": own_cpu_s,
            "others_cpus": others / wall if wall > 0 else 0.0,  # mean CPUs used by other processes
            "loadavg_start": self.loadavg_start,
            "loadavg_end": os.getloadavg()[0],
        }


def print_load(load: dict[str, Any], nproc: int, out=sys.stdout) -> None:
    print(f"load:    other processes used {load['others_cpus']:.2f} of {nproc} CPUs on average during the bench "
          f"(this bench {load['own_cpu_s']:.1f} CPU-s of {load['machine_cpu_s']:.1f} machine CPU-s); "
          f"loadavg {load['loadavg_start']:.2f} -> {load['loadavg_end']:.2f}", file=out)
    if load["others_cpus"] > OTHERS_CPUS_WARN:
        print(f"WARNING: the machine was shared with other work ({load['others_cpus']:.2f} CPUs busy elsewhere); "
              "these figures understate what it can do. Re-run on a quiet machine.", file=out)


OTHERS_CPUS_WARN = 0.25              # more than this many CPUs busy elsewhere: the figures are suspect


# --- statistics --------------------------------------------------------------------------
def median(xs: Iterable[float]) -> float:
    xs = list(xs)
    return statistics.median(xs) if xs else float("nan")


def percentile(xs: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of unsorted samples."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = max(0, min(len(s) - 1, int(round(p / 100.0 * len(s) + 0.5)) - 1))
    return s[k]


# --- networking --------------------------------------------------------------------------
_ports_given: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel had free a moment ago (the server binds it right after), never one
    this process handed out before: the kernel may offer a just-closed port again, and two
    servers told the same port would fail in ways that look like replication bugs. Another
    process may be handed it too until something binds it: PortReservation holds one."""
    for _ in range(1000):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in _ports_given:
            _ports_given.add(port)
            return port
    raise RuntimeError("no free port the kernel would give that was not given before")


def client_port_of(port: int) -> int:
    """A node's derived binary client port for HTTP port `port` (node/config.py client_address:
    port + limits.client_port_offset, or - it past 65535)."""
    from node import limits
    p = port + limits.client_port_offset
    return p if p <= 65535 else port - limits.client_port_offset


class PortReservation:
    """A loopback port held by this process until close(): a socket bound to it, not listening,
    with SO_REUSEADDR set after the bind. The kernel gives the port to no other process's
    bind(0) or connect() while it is held (free_port's answer is free only within one process:
    two pytest workers, or two test runs, may be handed the same port a moment apart), and a
    server that binds with SO_REUSEADDR, as replog's listeners do, still binds and listens on it.

    A node listens on a second port it derives from its HTTP port (its binary client port,
    `client_port_of`): that one is held too (`client_port`), else a node could take it while it
    is reserved for another node's HTTP port, which then cannot listen. `client_port=False`: a
    port held for something other than a node (a peer that never answers)."""

    def __init__(self, host: str = "127.0.0.1", *, client_port: bool = True):
        self._socks: list[socket.socket] = []
        for _ in range(1000):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))              # plain: a port no socket at all has, reserved or not
            port = s.getsockname()[1]
            if port in _ports_given:
                s.close()
                continue
            socks = [s]
            if client_port:
                c = _hold(host, client_port_of(port))
                if c is None:              # the derived port is someone else's: another draw
                    s.close()
                    continue
                socks.append(c)
            for x in socks:
                _ports_given.add(x.getsockname()[1])
                x.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.port, self._socks = port, socks
            self.client_port = client_port_of(port) if client_port else None
            return
        raise RuntimeError("no free port the kernel would give that was not given before")

    def close(self) -> None:
        for sock in getattr(self, "_socks", ()):    # none: __init__ found no port
            sock.close()

    __del__ = close


def _hold(host: str, port: int) -> socket.socket | None:
    """A plain bind to `port` (no other socket has it, reserved or not), or None."""
    if port in _ports_given:
        return None
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((host, port))
    except OSError:
        s.close()
        return None
    return s


# --- output ------------------------------------------------------------------------------
def fmt_num(x: Any) -> str:
    if isinstance(x, float):
        if x != x:
            return "-"
        if abs(x) >= 100:
            return f"{x:,.0f}"
        if abs(x) >= 10:
            return f"{x:.1f}"
        return f"{x:.2f}"
    if isinstance(x, int):
        return f"{x:,}"
    return str(x)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], out=sys.stdout) -> None:
    cells = [[fmt_num(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(headers, widths))), file=out)
    print("  ".join("-" * w for w in widths), file=out)
    for r in cells:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))), file=out)


def dump_json(doc: dict[str, Any], out=sys.stdout) -> None:
    json.dump(doc, out, indent=2, sort_keys=False)
    out.write("\n")
