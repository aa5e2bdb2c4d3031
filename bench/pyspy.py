"""Reading `py-spy record --format raw --threads` output (collapsed stacks, one line per
distinct stack with its sample count) into per-thread hot-spot tables.

Threads are grouped by role: MainThread (the node's event loop) and `asyncio` (the default
executor's threads, where Journal._persist runs). With `--idle`, samples whose leaf frame
is a wait (epoll, an idle executor worker) count as idle, not as work; with `--gil` only
the thread holding the GIL is sampled, so the shares are shares of the interpreter's time."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections import Counter, defaultdict
from typing import Any

from bench.common import print_table

REPO_MARK = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + "/"

# Leaf frames where a thread waits rather than works (py-spy --idle keeps them).
IDLE_LEAVES = ("EpollSelector.select (selectors.py)", "select (selectors.py)",
               "_worker (concurrent/futures/thread.py)", "Condition.wait (threading.py)",
               "Thread._wait_for_tstate_lock (threading.py)")


def _frame_name(frame: str) -> str:
    """`func (path/to/file.py:123)` -> `func (file.py)`, the path cut after the venv's
    site-packages, the stdlib or the repo, so all of one function's lines add up."""
    name, _, loc = frame.rpartition(" (")
    path = loc.rstrip(")").rsplit(":", 1)[0]
    for marker in ("site-packages/", "/lib/python3.", REPO_MARK):
        if marker in path:
            path = path.split(marker, 1)[1]
            if marker == "/lib/python3.":
                path = path.split("/", 1)[1] if "/" in path else path
            break
    return f"{name} ({path})"



def summarize_pyspy(raw_path: str, top: int) -> dict[str, Any]:
    """Threads grouped by role (MainThread: the event loop; asyncio: the default executor's
    threads, where Journal._persist runs); per role the samples, the idle ones, and the top
    functions by self and by inclusive samples, as % of that role's samples. Inclusive
    lists keep the project's own functions (node/) and the libraries it calls."""
    tid_name: dict[str, str] = {}
    lines: list[tuple[str, list[str], int]] = []
    with open(raw_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack:
                continue
            frames = stack.split(";")
            head = frames[0]                      # "thread (1234)" or "thread (1234): Name"
            tid, _, tname = head.partition(": ")
            if tname:
                tid_name[tid] = tname
            lines.append((tid, [_frame_name(fr) for fr in frames[1:] if fr], int(count)))
    roles: dict[str, dict[str, Any]] = defaultdict(lambda: {"samples": 0, "idle": 0, "threads": set(),
                                                             "self": Counter(), "incl": Counter()})
    for tid, names, n in lines:
        tname = tid_name.get(tid, tid)
        role = tname.rstrip("0123456789").rstrip("_") or tname
        r = roles[role]
        r["samples"] += n
        r["threads"].add(tid)
        if not names or names[-1] in IDLE_LEAVES:
            r["idle"] += n
            continue
        r["self"][names[-1]] += n
        for nm in set(names):
            r["incl"][nm] += n
    all_samples = sum(r["samples"] for r in roles.values()) or 1
    out: dict[str, Any] = {"samples": all_samples, "roles": []}
    for role, r in sorted(roles.items(), key=lambda kv: -kv[1]["samples"]):
        n = r["samples"] or 1
        busy = r["samples"] - r["idle"]
        incl = [(nm, c, 100.0 * c / n) for nm, c in r["incl"].most_common()
                if ("(node/" in nm or "(msgpack/" in nm or "(lmdb/" in nm or "(aiohttp/" in nm) and c < busy]
        out["roles"].append({
            "role": role, "threads": len(r["threads"]), "samples": r["samples"], "idle": r["idle"], "busy": busy,
            "top_self": [(nm, c, 100.0 * c / n) for nm, c in r["self"].most_common(top)],
            "top_incl": incl[:top],
        })
    return out


def child_pid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = f.read().split()
        return int(kids[0]) if kids else None
    except OSError:
        return None


def print_profile(doc: dict[str, Any]) -> None:
    mode = "GIL holder only (--gil)" if doc["gil"] else "all threads, idle included"
    print(f"profile: replog replica catching up {doc['rows']:,} rows in {doc['txn_rows']}-row txns under py-spy "
          f"({doc['rate_hz']} Hz, {mode}): {doc['seconds_under_profiler']:.1f} s, "
          f"{doc['rows_s_under_profiler']:,.0f} rows/s")
    print(f"raw stacks: {doc['raw']}")
    for r in doc["roles"]:
        n = r["samples"] or 1
        print(f"\n{r['role']} ({r['threads']} thread(s)): {r['samples']} samples "
              f"({100.0 * r['samples'] / doc['samples']:.1f}% of all), busy {100.0 * r['busy'] / n:.1f}%, "
              f"idle {100.0 * r['idle'] / n:.1f}% (% below: of this role's samples)")
        print_table(["self: function", "samples", "%"], [list(x) for x in r["top_self"]])
        print()
        print_table(["inclusive: function", "samples", "%"], [list(x) for x in r["top_incl"]])


def pyspy_path() -> str:
    """py-spy on PATH or beside this Python; exits with one line when it is not installed."""
    path = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(path):
        raise SystemExit("py-spy is not installed (pip install py-spy into the venv)")
    return path


def start_profilers(nodes: list, out_dir: str, rate_hz: int) -> list[tuple[str, subprocess.Popen, str]]:
    """`py-spy record` attached to every running node (its `name` and `pid`): raw collapsed
    stacks, per thread, idle frames kept so that waiting shows apart from work."""
    pyspy = pyspy_path()
    os.makedirs(out_dir, exist_ok=True)
    spies = []
    for n in nodes:
        raw = os.path.join(out_dir, f"{n.name}.pyspy.txt")
        p = subprocess.Popen([pyspy, "record", "--pid", str(n.pid), "--format", "raw", "--threads", "--idle",
                              "--rate", str(rate_hz), "-o", raw],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        spies.append((n.name, p, raw))
    return spies


def stop_profilers(spies: list[tuple[str, subprocess.Popen, str]], top: int) -> dict[str, Any]:
    out = {}
    for name, p, raw in spies:
        p.send_signal(signal.SIGINT)           # py-spy writes its output on SIGINT
        p.wait(60)
        out[name] = summarize_pyspy(raw, top) | {"raw": raw}
    return out


def print_profiles(profiles: dict[str, Any], rate_hz: int) -> None:
    for name, doc in profiles.items():
        print(f"profile of {name} during the load ({rate_hz} Hz, all threads, idle included): {doc['raw']}")
        for r in doc["roles"]:
            n = r["samples"] or 1
            print(f"  {r['role']} ({r['threads']} thread(s)): busy {100.0 * r['busy'] / n:.1f}% of its samples")
            print_table(["  inclusive: function", "samples", "%"], [list(x) for x in r["top_incl"]])
            print_table(["  self: function", "samples", "%"], [list(x) for x in r["top_self"]])
        print()
