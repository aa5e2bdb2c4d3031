"""A seeded nemesis for lease identity (docs/operations.md, "Stateless containers"): more
containers than slots, each written to from a thread, while faults come and go at random:
kill -9, an orderly stop (SIGTERM: the hand-over, then the release), a short pause, a pause
past the lease (a zombie: a standby takes its slot, and it must stop serving when it goes on),
a cut link, and a loop stalled past the lease as a write begins. Every container that ends is
started again as a platform would, at random on its old disk (a persistent volume) or on an
empty one (ephemeral storage). Then everything heals, and the oracles must hold.

The membership nemesis (tests/integration/nemesis.py) keeps identity on disk; this one runs
what a container platform does to lease nodes, the paths where a slot changes hands.

What is checked, and what a run may lose:
- No (origin, lsn) names two rows on any serving slot's WAL or store (the stale dirs a node
  moves aside are kept for inspection, never served, and not read here).
- Every acknowledged write is on every serving node after healing, and again after every
  container was killed and started at once, **except** a write its container may have been the
  only one to hold when its disk was lost: a disk is lost when the container comes back empty,
  on another slot, or finds its slot dir stale (another node held the slot meanwhile), and a
  write counts as held only there when, at the fault that ended its container, no other serving
  container held its origin's rows up to its lsn (`LossyEvent`). docs/operations.md says such
  rows go with the container's disk. A write whose container came back on its own dir, or that
  a peer held, must survive.
- No traceback in any log; a container ends by itself only after its lease was lost (exit 1).
- The schedule comes from the seed; the timing does not, so a failure prints the history.

Run longer by hand: `python -m tests.integration.lease_nemesis --seconds 300 --seed 7`."""
from __future__ import annotations

import argparse
import collections
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import time

from tests.integration.harness import ReplogProcess, vclocks_converged, wait_for
from tests.integration.nemesis import SMALL, heal_due
from tests.integration.oracles import Acked, missing_acked, no_fork, replicated_spaces
from tests.integration.writers import Writer, stop_all

SLOTS = 3
CONTAINERS = 4              # one warm standby
DURATION_S = 2.0            # the lease: a killed holder's slot is free again within it
KINDS = ("kill", "stop", "pause", "zombie", "cut")
WEIGHTS = (3, 3, 2, 2, 2)
FAULTS_MAX = 2
FRESH_P = 0.5               # a container starts again on an empty disk (ephemeral storage)
STALL_P = 0.2               # ... with its first write stalling its loop past the lease
STALL_S = (2.5, 4.0)
_SERVING = re.compile(r"lease: serving as member (\S+) of slot (\d+) at version (\d+)")
_STOP_STEP_FAILED = re.compile(r"shutdown: .+ failed: ")


class LeaseAcked(Acked):
    """Acknowledged writes, each with its origin as the answer named it (a container's member
    changes with its slot) and when it was answered."""

    def __init__(self) -> None:
        super().__init__()
        self.at: dict[tuple[str, str], float] = {}

    def put(self, node: ReplogProcess, space: str, key: str, value) -> dict:
        """A PUT (tests/integration/writers.py Writer's); recorded with the origin it names."""
        status, answer = node.put(f"/v1/spaces/{space}/keys/{key}", value, timeout=5)
        assert status == 200, (status, answer)
        self.writes[(space, key)] = (value, answer["origin"], answer["lsn"])
        self.at[(space, key)] = time.monotonic()
        return answer


class LossyEvent:
    """A fault that ended (or may end) incarnation `start` of a container: at `at`, the most of
    each origin's rows any other serving container held (`bounds`, by uuid)."""

    def __init__(self, container: str, start: int, at: float, bounds: dict[str, int], what: str):
        self.container, self.start, self.at, self.bounds, self.what = container, start, at, bounds, what


class Incarnation:
    """One start of a container, as its log section tells it: the slot it served, if any."""

    def __init__(self, text: str, wiped: bool):
        m = _SERVING.search(text)
        self.slot = int(m.group(2)) if m else None
        self.stale = "is stale:" in text
        self.wiped = wiped


class S3Store:
    """moto's S3 server in this process (a real endpoint that enforces If-None-Match and
    If-Match), a bucket on it, and the environment that points a node's boto3 there."""

    def __init__(self):
        from moto.server import ThreadedMotoServer
        import boto3
        self.env = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_SESSION_TOKEN": "test",
                    "AWS_DEFAULT_REGION": "us-east-1"}
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.env["REPLOG_S3_ENDPOINT"] = f"http://{host}:{port}"
        boto3.client("s3", endpoint_url=self.env["REPLOG_S3_ENDPOINT"], region_name="us-east-1",
                     aws_access_key_id="test", aws_secret_access_key="test").create_bucket(Bucket="replog-leases")
        self.url = "s3://replog-leases/nemesis"

    def stop(self) -> None:
        self.server.stop()


class LeaseNemesis:
    def __init__(self, tmp, seed: int, weights: dict[str, int] | None = None, first: tuple[str, ...] = (),
                 s3: bool = False):
        self.rng = random.Random(seed)
        self.seed, self.tmp = seed, tmp
        self.first = list(first)
        self.weights = [dict(zip(KINDS, WEIGHTS), **(weights or {}))[k] for k in KINDS]
        self.s3 = S3Store() if s3 else None
        self.store = self.s3.url if self.s3 else f"file://{tmp}/leases"
        self.base_env = dict(self.s3.env) if self.s3 else {}
        flags = ["--identity", "lease", "--lease-store", self.store, "--cluster-size", str(SLOTS),
                 "--lease-duration-s", str(DURATION_S)] + SMALL
        self.containers = [ReplogProcess(tmp, f"c{i + 1}", extra=flags) for i in range(CONTAINERS)]
        for i, c in enumerate(self.containers):
            c.env = dict(self.base_env)
            c.peers = [o.address for o in self.containers if o is not c]
            if i % 2:
                c.extra += ["--wal-mode", "fsync"]
        self.all_peers = {c.name: list(c.peers) for c in self.containers}
        self.acked = LeaseAcked()
        self.writers: dict[str, Writer] = {}
        self.faults: list[tuple[float, str, ReplogProcess]] = []
        self.cut: set[str] = set()
        self.paused: set[str] = set()
        self.events: list[LossyEvent] = []
        self.wiped: dict[str, set[int]] = {c.name: set() for c in self.containers}   # starts on an empty disk
        self.holds: dict[str, dict | None] = {}        # container -> its vclock just before its last fault
        self.stalls_armed: dict[str, int] = {}          # container -> start with a stall armed
        self.stalls_seen: set[tuple[str, int]] = set()
        self.exempt: dict[str, str] = {}             # write lost with a container's disk -> the fault
        self.history: list[str] = []
        self.t0 = time.monotonic()

    def note(self, what: str) -> None:
        self.history.append(f"{time.monotonic() - self.t0:7.2f} {what}")

    def _by(self, name: str) -> ReplogProcess:
        return next(c for c in self.containers if c.name == name)

    # --- set-up and the end ---------------------------------------------------------------------
    def start_writing(self) -> None:
        """The first SLOTS containers form the cluster, listing only one another (a fresh
        cluster forms once every listed peer has answered, and a standby does not answer until
        it holds a slot); then every container lists every other one, and the standby starts."""
        founders = self.containers[:SLOTS]
        for c in founders:
            c.peers = [o.address for o in founders if o is not c]
            c.start(wait=False)
        wait_for(lambda: len(self.serving()) == SLOTS, 90, f"{SLOTS} containers serving")
        self._apply_peers()
        for c in self.containers[SLOTS:]:
            c.start(wait=False)
        first = self.serving()[0]
        first.create_space("kv")
        for c in self.serving():
            wait_for(lambda: "kv" in replicated_spaces(c), 30, f"the space on {c.name}")
        self.writers = {c.name: Writer(c, self.acked) for c in self.containers}
        self.note(f"serving: {', '.join(c.name for c in self.serving())}")

    def run(self, seconds: float) -> None:
        """Faults for `seconds`, and on while a kind of `first` has not happened yet (a fault
        begins only while every slot is served, which takes longer on a loaded machine), up to
        three times as long."""
        began = time.monotonic()
        end, last = began + seconds, began + 3 * seconds
        while time.monotonic() < end or (self.first and time.monotonic() < last):
            heal_due(self.faults, self._heal)
            self._supervise()
            if len(self.faults) < FAULTS_MAX:
                kind = self.first[0] if self.first else self.rng.choices(KINDS, self.weights)[0]
                if self._fault(kind) and self.first and self.first[0] == kind:
                    self.first.pop(0)
            time.sleep(self.rng.uniform(0.2, 1.0))  # the time between faults: the schedule itself

    def heal_all(self) -> None:
        pending, self.faults = self.faults, []
        for _, kind, c in pending:
            self._heal(kind, c)
        self.cut.clear()
        self._apply_peers()
        def healed() -> bool:
            self._supervise()
            return len(self.serving()) == SLOTS
        wait_for(healed, 120, f"{SLOTS} containers serving after healing")
        for c in self.serving():
            wait_for(lambda: c.put("/v1/admin/peers", {"peers": c.peers})[0] == 200, 60, f"{c.name} taking its peers")
        stop_all(self.writers.values())
        self.note(f"healed; {len(self.acked.writes)} acknowledged writes; serving "
                  f"{', '.join(c.name for c in self.serving())}")

    def check(self) -> None:
        serving = self.serving()
        wait_for(lambda: vclocks_converged(serving), 120, "vclocks converged after healing")
        lost = self.acked_or_lost(serving)
        no_fork(serving, self.slot_dir)
        for c in self.containers:
            c.kill9()
        self.note("every container killed and started at once")
        for c in self.containers:
            c.start(wait=False)
        wait_for(lambda: len(self.serving()) == SLOTS, 120, f"{SLOTS} containers serving after the restart")
        serving = self.serving()
        wait_for(lambda: vclocks_converged(serving), 120, "vclocks converged after the restart")
        again = self.acked_or_lost(serving, lost)
        assert again <= lost, f"lost in the restart: {sorted(again - lost)[:5]}"
        no_fork(serving, self.slot_dir)
        self.logs_clean()

    def states(self) -> str:
        out = []
        for c in self.containers:
            if c.proc is None or c.proc.poll() is not None:
                out.append(f"{c.name}#{c.starts}: exited {c.proc.returncode if c.proc else None}")
                continue
            try:
                i = c.info()
                out.append(f"{c.name}#{c.starts} {i.get('status')} ({i.get('status_reason')}) lease "
                           f"{ {k: i['lease'].get(k) for k in ('slot', 'version', 'state')} } vclock {i.get('vclock_uuid')}")
            except (OSError, AssertionError, ValueError, KeyError) as e:
                out.append(f"{c.name}#{c.starts}: no answer ({str(e)[:100]})")
        return "\n".join(out)

    def serving(self) -> list[ReplogProcess]:
        """Containers whose process runs, not paused, that answer health 200 as a lease holder."""
        out = []
        for c in self.containers:
            if c.proc is None or c.proc.poll() is not None or c.name in self.paused:
                continue
            try:
                if c.get("/v1/health", timeout=2)[0] == 200:
                    out.append(c)
            except (OSError, ValueError):
                pass
        return out

    def slot_dir(self, c: ReplogProcess) -> str:
        return os.path.join(c.data_dir, f"slot-{c.info()['lease']['slot']}")

    # --- the oracle of loss -----------------------------------------------------------------------
    def incarnations(self, c: ReplogProcess) -> dict[int, Incarnation]:
        sections = re.split(r"\n===== start #(\d+): ", "\n" + c.log_text())
        return {int(n): Incarnation(text, int(n) in self.wiped[c.name])
                for n, text in zip(sections[1::2], sections[2::2])}

    def disk_lost(self, c: ReplogProcess, start: int, lives: dict[int, Incarnation]) -> bool:
        """Whether what incarnation `start` of `c` held was lost: the next start came back empty,
        on another slot or none, or found the slot dir stale."""
        was, after = lives.get(start), lives.get(start + 1)
        if was is None or was.slot is None or after is None:
            return False
        return after.wiped or after.slot != was.slot or after.stale

    def acked_or_lost(self, serving: list[ReplogProcess], lost: set[str] | None = None) -> set[str]:
        """Every acknowledged write on every serving node but those a lost disk explains (or,
        `lost` given, but those); the keys missing somewhere."""
        lives = {c.name: self.incarnations(c) for c in self.containers}
        lost_events = [e for e in self.events if self.disk_lost(self._by(e.container), e.start, lives[e.container])]
        missing, keys = [], set()
        for line in missing_acked(serving, self.acked):
            name, rest = line.split(": ", 1)
            if " is " not in rest or not rest.startswith("kv/"):
                missing.append(line)                # the node did not answer the read
                continue
            key = rest.split(" is ", 1)[0].split("/", 1)[1]
            keys.add(key)
            if lost is not None:
                if key not in lost:
                    missing.append(line)
                continue
            _, origin, lsn = self.acked.writes[("kv", key)]
            at = self.acked.at[("kv", key)]
            why = next((e for e in lost_events if e.at >= at and e.bounds.get(origin, 0) < lsn), None)
            if why is None:
                missing.append(line)
            else:
                self.exempt[key] = why.what
        assert not missing, f"{len(missing)} acknowledged writes missing, e.g. {missing[:5]}"
        by = collections.Counter(self.exempt[k] for k in keys if k in self.exempt)
        self.note(f"every acknowledged write on every serving node, but {len(keys)} lost with their "
                  f"container's disk: {', '.join(f'{n} at {what}' for what, n in by.most_common())}")
        return keys

    def logs_clean(self) -> None:
        for c in self.containers:
            lines = c.log_text().splitlines()
            bad = [i for i, line in enumerate(lines) if "Traceback" in line or _STOP_STEP_FAILED.search(line)]
            assert not bad, f"{c.name}'s log:\n" + "\n".join(lines[max(0, bad[0] - 3):bad[0] + 25])

    # --- faults ---------------------------------------------------------------------------------
    def _busy(self) -> set[str]:
        return {c.name for _, _, c in self.faults}

    def _held(self, but: ReplogProcess | None = None) -> dict[str, int]:
        """The most of each origin's rows (by uuid) a running container other than `but` holds."""
        bounds: dict[str, int] = {}
        for o in self.containers:
            if o is but or o.name in self.paused or o.proc is None or o.proc.poll() is not None:
                continue
            try:
                status, info = o.get("/v1/info", timeout=2)
            except (OSError, ValueError):
                continue
            if status == 200 and info.get("status") == "running":
                for uuid, lsn in info.get("vclock_uuid", {}).items():
                    bounds[uuid] = max(bounds.get(uuid, 0), lsn)
        return bounds

    def _event(self, c: ReplogProcess, what: str) -> None:
        """A fault that may end c's incarnation: what every other running container holds now."""
        self.events.append(LossyEvent(c.name, c.starts, time.monotonic(), self._held(c), f"{what} {c.name}#{c.starts}"))

    def _own(self, c: ReplogProcess) -> None:
        """What c holds just before a fault (its disk may go only once the others hold it all)."""
        try:
            status, info = c.get("/v1/info", timeout=2)
        except (OSError, ValueError):
            status, info = None, {}
        self.holds[c.name] = info.get("vclock_uuid") if status == 200 else None

    def _fault(self, kind: str) -> bool:
        """A fault begins only while every slot is served: the cluster's rows are then on at
        least one running member, whatever the faults under way do to the others."""
        serving = self.serving()
        free = [c for c in serving if c.name not in self._busy()]
        if len(serving) < SLOTS or not free:
            return False
        c = self.rng.choice(free)
        self._own(c)
        if kind == "kill":
            c.kill9()
            self._event(c, "kill")
            self._later("restart", c, 0.2, 4.0)
        elif kind == "stop":
            code = c.stop(30)
            assert code == 0, f"{c.name} stopped with {code}:\n{c.log_tail()}"
            self._event(c, "stop")
            self._later("restart", c, 0.2, 4.0)
        elif kind in ("pause", "zombie"):
            c.proc.send_signal(signal.SIGSTOP)
            self.paused.add(c.name)
            self._event(c, kind)
            lo, hi = (0.2, 0.6) if kind == "pause" else (DURATION_S * 1.3, DURATION_S * 2.5)
            self._later("resume", c, lo, hi)
        elif kind == "cut":
            self.cut.add(c.name)
            self._apply_peers()
            self._later("uncut", c, 1.0, 4.0)
        self.note(f"{kind} {c.name}#{c.starts}")
        return True

    def _later(self, heal: str, c: ReplogProcess, lo: float, hi: float) -> None:
        self.faults.append((time.monotonic() + self.rng.uniform(lo, hi), heal, c))

    def _heal(self, heal: str, c: ReplogProcess) -> None:
        if heal == "restart":
            self._restart(c)
        elif heal == "resume":
            c.proc.send_signal(signal.SIGCONT)
            self.paused.discard(c.name)
            self.note(f"resume {c.name}#{c.starts}")
        elif heal == "uncut":
            self.cut.discard(c.name)
            self._apply_peers()
            self.note(f"uncut {c.name}")

    def _restart(self, c: ReplogProcess) -> None:
        """Started again as a platform would: on its old disk, or on an empty one; at times with
        its first write stalling the loop past the lease."""
        if c.proc is not None and c.proc.poll() is None:
            return
        w = self.writers.get(c.name)
        if w is not None:
            w.pause()                               # no write in flight while the process changes
        fresh = self.rng.random() < FRESH_P and self._held_elsewhere(c)
        if fresh:
            shutil.rmtree(c.data_dir, ignore_errors=True)
            self.wiped[c.name].add(c.starts + 1)
        c.env = dict(self.base_env)
        stalls = self.rng.random() < STALL_P
        if stalls:
            c.env["REPLOG_FAULT_POINT"] = f"stall_write:1:{self.rng.uniform(*STALL_S):.1f}"
            self.stalls_armed[c.name] = c.starts + 1
        c.start(wait=False)
        if w is not None:
            w.go.set()
        self.note(f"start {c.name}#{c.starts}{' on an empty disk' if fresh else ''}"
                  f"{' (its first write stalls)' if stalls else ''}")

    def _held_elsewhere(self, c: ReplogProcess) -> bool:
        """Whether the running containers hold every row c held before its last fault: only
        then does it come back on an empty disk (a platform's ephemeral storage). Otherwise a
        disk lost would take acknowledged rows nobody else has, and the writes of every
        container restarted empty after it with them: the oracle would hold nothing."""
        mine = self.holds.get(c.name)
        if not mine:
            return False
        others = self._held(c)
        return all(others.get(u, 0) >= lsn for u, lsn in mine.items())

    def _supervise(self) -> None:
        """Containers that ended by themselves (a lease lost: exit 1) start again; a stalled loop
        is an event as it begins."""
        busy = self._busy()
        for c in self.containers:
            if c.name in busy or c.proc is None:
                continue
            armed = self.stalls_armed.get(c.name)
            if armed == c.starts and (c.name, armed) not in self.stalls_seen and \
                    "fault point stall_write" in c.log_text().rsplit("===== start #", 1)[-1]:
                self.stalls_seen.add((c.name, armed))
                self._event(c, "stall")
                self.note(f"stall {c.name}#{c.starts}")
            code = c.proc.poll()
            if code is None:
                continue
            section = c.log_text().rsplit("===== start #", 1)[-1]
            assert code == 1 and "lost" in section, f"{c.name}#{c.starts} exited with {code}:\n{c.log_tail()}"
            self._event(c, "ended")
            self.note(f"{c.name}#{c.starts} ended: lease lost")
            self._restart(c)

    def _apply_peers(self) -> None:
        """Each container's peers are the others not cut from it (a cut container lists none)."""
        for c in self.containers:
            c.peers = [] if c.name in self.cut else \
                [a for a in self.all_peers[c.name] if not any(self._by(x).address == a for x in self.cut)]
            if c.proc is None or c.proc.poll() is not None or c.name in self.paused:
                continue
            try:
                c.put("/v1/admin/peers", {"peers": c.peers}, timeout=2)
            except (OSError, ValueError):
                pass                                 # not serving yet: it starts with these peers


def run(tmp, seed: int, seconds: float, weights: dict[str, int] | None = None,
        first: tuple[str, ...] = (), s3: bool = False) -> LeaseNemesis:
    """The whole run; every process it started is killed at the end, whatever happened. `s3`:
    the lease store is moto's S3 server instead of a file:// directory."""
    nem = LeaseNemesis(tmp, seed, weights, first, s3)
    try:
        nem.start_writing()
        nem.run(seconds)
        nem.heal_all()
        nem.check()
        return nem
    except AssertionError as e:
        raise AssertionError(f"{e}\nseed {seed}; the containers now:\n{nem.states()}\nwhat happened:\n"
                             + "\n".join(nem.history)) from None
    finally:
        for w in nem.writers.values():
            w.done.set()
            w.go.set()
        for c in nem.containers:
            if c.name in nem.paused:
                c.proc.send_signal(signal.SIGCONT)
            c.kill9()
            c.release_port()
        if nem.s3 is not None:
            nem.s3.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--s3", action="store_true", help="the lease store on moto's S3 server, not a file:// dir")
    a = p.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="replog-lease-nemesis-")
    nem = run(tmp, a.seed, a.seconds, s3=a.s3)
    print("\n".join(nem.history))
    print(f"seed {a.seed}: {len(nem.acked.writes)} acknowledged writes, {len(nem.exempt)} lost with their "
          f"container's disk; logs in {tmp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
