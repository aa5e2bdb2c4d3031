"""What became of each mutant, and the report: the statuses, the equivalent-mutant list
(equivalent.txt), an earlier run's kills (--again), the score per module and the lists of
survivors, untested lines, errors and kills by deadline (tools/mutate/README.md).

Rules kept here: a mutant killed only by its deadline counts as killed but is listed apart;
an equivalent mutant is left out of the score, never counted killed."""
from __future__ import annotations

import json
import signal
from dataclasses import dataclass, field
from pathlib import Path

from tools.mutate.operators import Mutant

KILLED = "killed"
SURVIVED = "survived"
UNCOVERED = "no test runs it"
EQUIVALENT = "equivalent"
TIMEOUT = "timeout"           # the `how` of a mutant killed by its deadline (counted killed, listed apart)
ERROR = "error"


@dataclass
class Outcome:
    mutant: Mutant
    status: str = ""
    how: str = ""
    tests: list[str] = field(default_factory=list)
    seconds: float = 0.0


# --- the equivalent-mutant list -----------------------------------------------------------
def load_equivalents(path: Path) -> dict[tuple[str, str, str], dict[int, str]]:
    """Lines `path:line: label  | snippet  # reason` -> {key: {line: reason}}."""
    out: dict[tuple[str, str, str], dict[int, str]] = {}
    if not path.exists():
        return out
    for raw in path.read_text().splitlines():
        if not raw.strip() or raw.startswith("#"):
            continue
        head, _, reason = raw.rpartition("  # ")   # the line itself may carry a comment
        where, _, snippet = head.partition("  | ")
        file_line, _, label = where.partition(": ")
        file, _, line = file_line.rpartition(":")
        out.setdefault((file, snippet.strip(), label.strip()), {})[int(line)] = reason.strip()
    return out


def equivalent_reason(m: Mutant, equivalents: dict, same_key: int) -> str | None:
    """The key (file, mutation, text) names the mutant wherever its line moves; when the file
    has several mutants with that key (`same_key`), only the listed lines are meant."""
    listed = equivalents.get(m.key)
    if not listed:
        return None
    if m.line in listed:
        return listed[m.line]
    return next(iter(listed.values())) if same_key == 1 else None


# --- a mutant's fate from its run's exit status ------------------------------------------------
def judge(status) -> tuple[str, str]:
    """(status, how) of a mutant from its child's exit status, or "timeout" (the parent's kill)."""
    if status == 0:
        return SURVIVED, ""
    if status == 1:
        return KILLED, "a test failed"
    if status in ("timeout", -signal.SIGALRM):     # the parent's kill, or the child's own alarm
        return KILLED, TIMEOUT
    if status == 2:
        return KILLED, "the module no longer imports or collects"
    return ERROR, f"exit status {status}"


# --- report -----------------------------------------------------------------------------------
def _score(os_: list[Outcome]) -> tuple[int, int, float]:
    counted = [o for o in os_ if o.status != EQUIVALENT]
    killed = sum(1 for o in counted if o.status == KILLED)
    return killed, len(counted), (100.0 * killed / len(counted)) if counted else 100.0


def _timed_out(o: Outcome) -> bool:
    return o.status == KILLED and o.how.startswith(TIMEOUT)


def report(outcomes: list[Outcome], groups: dict[str, list[str]], elapsed: float) -> str:
    lines = []
    by_file: dict[str, list[Outcome]] = {}
    for o in outcomes:
        by_file.setdefault(o.mutant.path, []).append(o)
    lines.append(f"{'module':44} {'killed':>7} {'of':>5} {'score':>7} {'surv.':>6} {'no test':>8} {'equiv.':>7}"
                 f" {'timeout':>8}")
    for group, files in groups.items():
        for path in files:
            os_ = by_file.get(path, [])
            k, n, s = _score(os_)
            lines.append(f"{path:44} {k:7d} {n:5d} {s:6.1f}% {sum(o.status == SURVIVED for o in os_):6d} "
                         f"{sum(o.status == UNCOVERED for o in os_):8d} {sum(o.status == EQUIVALENT for o in os_):7d}"
                         f" {sum(_timed_out(o) for o in os_):8d}")
        if len(files) > 1:
            k, n, s = _score([o for p in files for o in by_file.get(p, [])])
            lines.append(f"{'= group ' + group:44} {k:7d} {n:5d} {s:6.1f}%")
    errors = [o for o in outcomes if o.status == ERROR]
    for title, status in (("survivors", SURVIVED), ("no test runs these lines", UNCOVERED), ("errors", ERROR)):
        bad = sorted((o for o in outcomes if o.status == status), key=lambda o: (o.mutant.path, o.mutant.line))
        if bad:
            lines.append(f"\n{title} ({len(bad)}):")
            lines += [o.mutant.describe() + (f"   [{o.how}]" if status == ERROR else "") for o in bad]
    late = sorted((o for o in outcomes if _timed_out(o)), key=lambda o: (o.mutant.path, o.mutant.line))
    if late:
        # killed, but only by the clock: a loop that never ends, or a test made much slower
        lines.append(f"\nkilled by their deadline, counted killed ({len(late)}):")
        for o in late:
            when = "earlier run" if o.how.endswith("(earlier run)") else f"{o.seconds:.0f} s"
            lines.append(f"{o.mutant.describe()}   [{when}]")
    lines.append(f"\n{len(outcomes)} mutants in {elapsed:.0f} s; {len(errors)} errors")
    return "\n".join(lines)


def earlier_kills(path: Path) -> dict[tuple, str]:
    """The killed mutants of an earlier run's --json, keyed as main() numbers them."""
    out, nth = {}, {}
    for r in json.loads(path.read_text()):
        where = (r["path"], r["line"], r["label"], r["snippet"])
        nth[where] = nth.get(where, 0) + 1
        if r["status"] == KILLED:
            out[(*where, nth[where])] = r["how"] + " (earlier run)"
    return out
