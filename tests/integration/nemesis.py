"""A seeded nemesis for real processes: masters written to from a thread each, and an anonymous
replica following them, while faults come and go at random (kill -9, SIGSTOP, orderly stop, a cut
link, a lost store, a restart on a new address, a new master joining, a new master seeded from
another's backup, a hot backup, a master's data dir lost and restored from one of its earlier
backups, a kill -9 that leaves a torn write at the end of the WAL), with small WAL
segments and frequent checkpoints so WAL collection runs all the time. Then everything heals,
and the oracles of tests/integration/oracles.py must hold: every acknowledged write on every
node, no (origin, lsn) naming two rows, every node restarting.

The simulation (tests/sim) draws such schedules by the thousand, on the cores; this runs the
real shell around them: the asyncio drivers, LMDB, the WAL on disk, real sockets and timing.

Rules kept here:
- Only what a write's answer promises is checked: a refused or unanswered write is not recorded.
- A store is lost only once every other master holds every row its writer had acknowledged
  (the writer paused first): a store's only copy of a row may be lost with it, and so may the
  only other copy, if that holder's store goes next. An anonymous replica's store may go at any
  time, and with it its uuid. Nobody forgets the old uuid: a master that loses its store later
  lets go of it by itself once a peer holds what the master's entry for it bounds
  (docs/replication.md, "Anonymous replicas"). The operator steps in only for a master still
  fenced on an old uuid after `PATIENCE_S` (the entry knows no bound: the master died with the
  link open and then lost rows), and expels it there (DELETE /v1/cluster/{uuid});
  each such step is in the history.
- A master is restored from a backup (`replog restore`, keeping its uuid) only under the rule of a
  lost store: its rows after the backup's point must be on every other master, as they would be
  for an operator who backs up and restores by docs/operations.md. It comes back fenced, and
  takes those rows back before it writes again; the oracles hold it to that.
- A master is seeded from another's backup (`replog restore --as-new-member`) beside its original,
  which runs on: a new uuid, the original's rows to the backup's point already in its store. It
  registers through a running member, takes the rest from the cluster and is written to as any
  joiner is (it counts in `JOINS_MAX`).
- A master is lost for good (its host gone) and replaced by a new member seeded from one of its
  backups, under the rule of a lost store, as docs/operations.md tells an operator: its old uuid
  is expelled on a running member, at random before the new one starts or a few seconds after
  (until then, a fenced master waits for the old uuid). The lost master's log is still checked.
- At most `FAULTS_MAX` faults at a time, so most of the cluster is up most of the time.
- The schedule comes from the seed; the timing does not, so a failure prints what happened
  (`Nemesis.history`) and the seed.

Run longer by hand: `python -m tests.integration.nemesis --seconds 600 --seed 7`."""
from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import signal
import struct
import sys
import tempfile
import time

from node.wal import format as walfmt
from node.wal.reader import list_segments
from tests.integration.harness import ReplogProcess, mesh_nodes, restore, vclocks_converged, wait_for
from tests.integration.oracles import Acked, acked_everywhere, no_fork, replicated_spaces, restart_all
from tests.integration.writers import BinaryWriter, Writer, stop_all

# Small WAL segments and frequent checkpoints: the nodes collect their WAL every few hundred rows.
SMALL = ["--segment-bytes-max", "4096", "--checkpoint-interval-s", "0.3", "--anon-ttl-s", "1.5"]
FAULTS_MAX = 2
JOINS_MAX = 2               # masters that join during a run
REPLACES_MAX = 1            # masters lost for good and replaced from their backups during a run
KINDS = ("kill", "pause", "stop", "cut", "lose", "move", "join", "seed", "backup", "restore", "tear", "replace")
WEIGHTS = (4, 3, 2, 3, 1, 1, 1, 1, 1, 1, 1, 1)
TEARS = ("short", "unchecked", "magic")     # what a write cut by the crash left (Nemesis._tear)
BACKUP_TIMEOUT_S = 60.0
BINARY = (0, 3)             # masters written to over the binary client protocol (the others over HTTP)
_STOP_STEP_FAILED = re.compile(r"shutdown: .+ failed: ")     # node/process/node.py `stop`
PATIENCE_S = 10.0           # how long a master fenced on a replica's old uuid waits before the operator steps in


def heal_due(faults: list[tuple], heal) -> None:
    """Heal every fault whose time has come: `faults` holds (heal at, kind, whom), each taken
    out and handed to heal(kind, whom)."""
    now = time.monotonic()
    for f in [f for f in faults if f[0] <= now]:
        faults.remove(f)
        heal(f[1], f[2])


class Nemesis:
    def __init__(self, tmp, seed: int, nodes: int = 4, anon: int = 1, weights: dict[str, int] | None = None,
                 secure: bool = False, first: tuple[str, ...] = ()):
        self.rng = random.Random(seed)
        self.first = list(first)        # kinds tried before any drawn, each until it happens
        self.weights = [dict(zip(KINDS, WEIGHTS), **(weights or {}))[k] for k in KINDS]
        self.seed = seed
        self.tmp = tmp
        self.acked = Acked()
        self.node_kw = _secured(tmp) if secure else {"extra": SMALL}   # every node's flags, token, TLS
        self.masters = mesh_nodes(tmp, nodes, **self.node_kw)   # started by start_writing
        for m in self.masters[1::2]:               # half of them sync each batch (kill -9 spares both)
            m.extra += ["--wal-mode", "fsync"]
        self.replicas = [ReplogProcess(tmp, f"r{i + 1}", peers=self.masters,
                                       **dict(self.node_kw, extra=self.node_kw["extra"] + ["--anon"]))
                         for i in range(anon)]
        self.joined = 0
        self.replaced = 0
        self.retired: list[ReplogProcess] = []     # masters lost for good (replaced): down, logs kept
        self.gone: set[str] = set()               # anonymous uuids gone with their stores
        self.waiting: dict[tuple[str, str], float] = {}   # (master, old uuid) -> first seen fenced on it
        self.operator_steps = 0
        self.addresses = {n.name: n.address for n in self.nodes}
        self.cuts: set[frozenset[str]] = set()
        self.faults: list[tuple[float, str, ReplogProcess | tuple]] = []   # (heal at, kind, whom)
        self.history: list[str] = []
        self.writers: dict[str, Writer] = {}
        self.backups: dict[str, list[str]] = {}   # master -> its complete backups, oldest first
        self.tears: list[tuple[ReplogProcess, str, int]] = []   # (node, segment, where a torn write begins)
        self.t0 = time.monotonic()

    @property
    def nodes(self) -> list[ReplogProcess]:
        return self.masters + self.replicas

    def note(self, what: str) -> None:
        self.history.append(f"{time.monotonic() - self.t0:7.2f} {what}")

    # --- set-up and the end -------------------------------------------------------------------
    def start_writing(self) -> None:
        """The masters form a cluster, the replicas follow, a writer per master starts, and
        each master is backed up once (so a restore may come at any time; later backups are
        faults of their own)."""
        for n in self.masters:
            n.start(wait=False)
        for n in self.masters:
            n.wait_healthy(60)
        self.masters[0].create_space("kv")
        for r in self.replicas:
            r.start()
        for n in self.nodes:
            wait_for(lambda: "kv" in replicated_spaces(n), 30, f"the space on {n.name}")
        self.writers = {n.name: (BinaryWriter if i in BINARY else Writer)(n, self.acked)
                        for i, n in enumerate(self.masters)}
        for n in self.masters:
            self._backup_of(n)

    def run(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            heal_due(self.faults, self._heal)
            if len(self.faults) < FAULTS_MAX:
                kind = self.first[0] if self.first else self.rng.choices(KINDS, self.weights)[0]
                done = len(self.history)
                self._fault(kind)
                if self.first and any(line.split()[1] == kind for line in self.history[done:]):
                    self.first.pop(0)
            self._operator(PATIENCE_S)
            time.sleep(self.rng.uniform(0.2, 1.0))  # the time between faults: the schedule itself

    def heal_all(self) -> None:
        pending, self.faults = self.faults, []
        for _, kind, whom in pending:
            if kind != "expel":
                self._heal(kind, whom)
        for n in self.nodes:
            n.wait_healthy(60)
        for _, kind, whom in pending:               # an operator's step still to take: once a master takes it
            if kind == "expel":
                wait_for(lambda: self._expel(*whom), 60, f"a master expelling {whom[1]}")
        for n in self.nodes:                        # one that was starting may have missed a change
            n.peers = self._peers_of(n)
            wait_for(lambda: n.put("/v1/admin/peers", {"peers": n.peers})[0] == 200, 60, f"{n.name} taking its peers")
        wait_for(lambda: not self._operator(PATIENCE_S), 90, "no master fenced on a replica's old uuid")
        stop_all(self.writers.values())
        self.note(f"healed; {len(self.acked.writes)} acknowledged writes; {len(self.gone)} replica uuids gone, "
                  f"{self.operator_steps} operator steps for them")

    def check(self) -> None:
        """The oracles, after healing: converged vclocks, every acknowledged write everywhere,
        no fork, and again after every node was killed and restarted."""
        try:
            anon = {r.uuid() for r in self.replicas}     # their own components: private notes
            wait_for(lambda: vclocks_converged(self.nodes, anon), 120, "vclocks converged after healing")
            acked_everywhere(self.nodes, self.acked, 60)
            no_fork(self.nodes)
            restart_all(self.nodes)
            acked_everywhere(self.nodes, self.acked, 60)
            self.logs_clean()
            self.tears_cut()
        except AssertionError as e:
            raise AssertionError(f"{e}\nseed {self.seed}; the nodes now:\n{self.states()}\nwhat happened:\n"
                                 + "\n".join(self.history)) from None

    def logs_clean(self) -> None:
        """No node's log holds a traceback (a bug the node survived is still a bug), nor a step
        of an orderly stop that failed (each is logged in one line, without a traceback: the
        journal's WAL closed under its writing thread showed only there), nor says a peer
        skipped lsns of its own: no node here lost rows from its WAL (kill -9 keeps what was
        written), so such a line would blame a peer for this node's own doing
        (node/core/receive.py `_own_gap`)."""
        for n in self.nodes + self.retired:
            lines = n.log_text().splitlines()
            bad = [i for i, line in enumerate(lines) if "Traceback" in line or "of its own (its WAL lost rows" in line
                   or _STOP_STEP_FAILED.search(line)]
            assert not bad, f"{n.name}'s log:\n" + "\n".join(lines[max(0, bad[0] - 3):bad[0] + 25])

    def tears_cut(self) -> None:
        """Every torn write left in a WAL was cut off when its node recovered (and said so, as
        node/wal/recovery.py does: at that byte or before it, one cut may take two tears left
        while the node never got as far as recovery), unless its segment went (collected, a
        rebuilt or lost store). None was taken for corruption, or read as rows."""
        for n, path, at in self.tears:
            if not os.path.exists(path):
                continue
            cuts = [int(b) for b in re.findall(rf"cutting off a torn frame at {re.escape(path)} byte (\d+)", n.log_text())]
            assert any(b <= at for b in cuts), f"{n.name}: the torn write at {path} byte {at} was not cut off ({cuts})"

    def states(self) -> str:
        """Each node as /v1/info tells it: status, vclock, a standing fence, its upstreams."""
        out = []
        for n in self.nodes:
            try:
                i = n.info()
            except (OSError, AssertionError, ValueError) as e:
                out.append(f"{n.name}: no answer ({e})")
                continue
            ups = {u.get("address"): (u.get("status"), (u.get("error") or "")[:160]) for u in i.get("upstreams") or []}
            out.append(f"{n.name} {i.get('uuid')} {i.get('status')} ({i.get('status_reason')}) "
                       f"vclock {i.get('vclock_uuid')}\n  fence {i.get('own_rows_fence')}\n  upstreams {ups}"
                       f"\n  rejoin {i.get('rejoin')}")
        return "\n".join(out)

    # --- faults -------------------------------------------------------------------------------
    def _free(self) -> list[ReplogProcess]:
        busy = {id(w) for _, _, w in self.faults if isinstance(w, ReplogProcess)}
        return [n for n in self.nodes if id(n) not in busy]

    def _fault(self, kind: str) -> None:
        if kind == "cut":
            pairs = [frozenset((a.name, b.name)) for i, a in enumerate(self.masters) for b in self.nodes[i + 1:]]
            pairs = [p for p in pairs if p not in self.cuts and all(self._running(self._by(x)) for x in p)]
            if not pairs:
                return
            pair = self.rng.choice(pairs)
            self.cuts.add(pair)
            self._apply_peers(pair)
            self._later("cut", tuple(sorted(pair)), 1.0, 4.0)
            return
        if kind in ("join", "seed"):
            self._join(seeded=kind == "seed")
            return
        if kind == "backup":
            self._backup()
            return
        if kind == "restore":
            self._restore()
            return
        if kind == "replace":
            self._replace()
            return
        free = self._free()
        if not free:
            return
        n = self.rng.choice(free)
        if not self._running(n):
            return
        if kind == "kill":
            n.kill9()
            self._later("kill", n, 0.2, 3.0)
        elif kind == "tear":
            n.kill9()
            torn = self._tear(n)
            self.note(f"tear {n.name}: {torn}" if torn else f"kill {n.name} (no WAL to tear yet)")
            self._later("kill", n, 0.2, 3.0)
            return
        elif kind == "pause":
            n.proc.send_signal(signal.SIGSTOP)
            self._later("pause", n, 0.5, 4.0)
        elif kind == "stop":
            n.stop()
            self._later("stop", n, 0.2, 3.0)
        elif kind == "move":
            n.stop()
            n.move_to_new_port()
            self.addresses[n.name] = n.address
            self._tell_peers(n)
            self._later("move", n, 0.2, 3.0)
        elif kind == "lose":
            if not self._lose(n):
                return
            self._later("lose", n, 0.0, 0.5)
        self.note(f"{kind} {n.name}")

    def _lose(self, n: ReplogProcess) -> bool:
        """n's writer pauses; once every other master holds every row n has (n's component of
        the vclock), n is killed and its store and WAL go (its identity files stay). An
        anonymous replica's go at once."""
        if n in self.replicas:
            try:
                old = n.uuid()
            except (OSError, AssertionError, ValueError, KeyError):
                return False                        # not answering yet: its uuid is not known here
            self._wipe(n)
            self.gone.add(old)
            self.note(f"lose {n.name}'s store (and its uuid {old[:8]})")
            return True
        own = self._held_elsewhere(n, "lose")
        if own is None:
            return False
        self._wipe(n)
        self.note(f"lose {n.name}'s store (its rows to {own} are on every other master)")
        return True

    def _held_elsewhere(self, n: ReplogProcess, kind: str) -> int | None:
        """A master's writer pauses, and every other master comes to hold every row n has:
        n's lsn then, or None (n's writer going on) if a master is down or does not answer."""
        others = [o for o in self.masters if o is not n]
        if not all(self._running(o) for o in others):
            return None
        w = self.writers[n.name]
        w.pause()
        try:
            uuid = n.uuid()
            own = n.info()["vclock_uuid"].get(uuid, 0)
            wait_for(lambda: all(o.info()["vclock_uuid"].get(uuid, 0) >= own for o in others),
                     30, f"every other master holding {n.name}'s rows to {own}")
        except (OSError, AssertionError, ValueError, KeyError) as e:   # n or a holder not answering
            self.note(f"no {kind} of {n.name}: {str(e)[:120]}")
            w.go.set()
            return None
        return own

    def _backup(self) -> None:
        """A running master backs itself up (POST /v1/admin/backup) while its writer goes on.
        A backup the node refuses or could not finish (it is busy starting, say) is noted and
        not kept; one it answered 200 for must restore."""
        masters = [m for m in self.masters if self._running(m) and m.name in self.writers]
        if masters:
            self._backup_of(self.rng.choice(masters))

    def _backup_of(self, n: ReplogProcess) -> None:
        out = os.path.join(self.tmp, "backups", f"{n.name}-{len(self.backups.get(n.name, ())) + 1}")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        try:
            s, man = n.post("/v1/admin/backup", {"to": out}, timeout=BACKUP_TIMEOUT_S)
        except (OSError, ValueError) as e:
            s, man = 0, str(e)[:120]
        if s != 200:
            self.note(f"no backup of {n.name}: {s} {str(man)[:120]}")
            shutil.rmtree(out, ignore_errors=True)
            return
        self.backups.setdefault(n.name, []).append(out)
        self.note(f"backup {n.name} at {man['vclock'].get(man['uuid'], 0)} ({os.path.basename(out)})")

    @staticmethod
    def _answers(n: ReplogProcess) -> bool:
        """n serves HTTP now (a node just started may not yet)."""
        try:
            return n.get("/v1/health")[0] == 200
        except (OSError, ValueError):
            return False

    def _restore(self) -> None:
        """A free master that has a backup loses its data dir, and one of its backups is
        restored in its place (keeping its uuid), once every other master holds every row it
        has; it starts when the fault heals. With no such master, one is backed up instead."""
        free = [m for m in self._free() if m in self.masters and self._running(m) and m.name in self.writers]
        if not free:
            return
        ready = [m for m in free if self.backups.get(m.name) and self._answers(m)]
        if not ready:
            self._backup_of(self.rng.choice(free))
            return
        n = self.rng.choice(ready)
        own = self._held_elsewhere(n, "restore")
        if own is None:
            return
        backup = self.rng.choice(self.backups[n.name])
        n.kill9()
        shutil.rmtree(n.data_dir)
        restore(backup, n.data_dir)
        self.note(f"restore {n.name} from {os.path.basename(backup)} (its rows to {own} are on every other master)")
        self._later("restore", n, 0.0, 0.5)

    def _replace(self) -> None:
        """A free master with a backup is lost for good once every other master holds every row
        it has, and a new master restored from one of its backups as a new member
        (`--as-new-member`) starts in its place, on a new address. The old uuid is expelled now,
        or by the `expel` fault a few seconds after the new master started."""
        if self.replaced >= REPLACES_MAX:
            return
        free = [m for m in self._free() if m in self.masters and self._running(m) and m.name in self.writers
                and self.backups.get(m.name) and self._answers(m)]
        if not free:
            return
        n = self.rng.choice(free)
        try:
            old = n.uuid()
        except (OSError, AssertionError, ValueError, KeyError):
            return
        own = self._held_elsewhere(n, "replace")
        if own is None:
            return
        backup = self.rng.choice(self.backups[n.name])
        n.kill9()
        self.writers.pop(n.name).stop()
        self.masters.remove(n)
        self.retired.append(n)
        self.replaced += 1
        r = ReplogProcess(self.tmp, f"s{self.replaced}", peers=[self.addresses[m.name] for m in self.masters],
                          **self.node_kw)
        restore(backup, r.data_dir, "--as-new-member")
        self.note(f"replace {n.name} ({old[:8]}; its rows to {own} are on every other master) by {r.name}, "
                  f"restored from {os.path.basename(backup)} as a new member")
        expel_first = self.rng.random() < 0.5
        if expel_first:
            self._expel(old, n.name)
        self.masters.append(r)
        self.addresses[r.name] = r.address
        r.start(wait=False)
        self._tell_peers(r)
        self.writers[r.name] = Writer(r, self.acked)
        if not expel_first:
            self._later("expel", (old, n.name), 1.0, 5.0)

    def _expel(self, old: str, name: str) -> bool:
        """The operator expels a lost master's uuid on a running master (DELETE /v1/cluster/{uuid}:
        200 expelled, 202 once that master's fence lifts). False if no master took it."""
        for m in self.rng.sample(self.masters, len(self.masters)):
            if not self._running(m):
                continue
            try:
                s, body = m.delete(f"/v1/cluster/{old}")
            except (OSError, ValueError):
                continue
            if s in (200, 202):
                self.operator_steps += 1
                self.note(f"operator: {m.name} expels {name} ({old[:8]}): {s}")
                return True
        return False

    def _operator(self, patience: float) -> bool:
        """The operator's step for a replica whose disk was replaced (docs/operations.md), on a
        master whose fence has waited `patience` s for the replica's old uuid: expel it there
        (202: given up by the fence, expelled at its lift). Whether a running master's fence
        waits for an old uuid now."""
        waits = False
        now = time.monotonic()
        for m in self.masters:
            if not self._running(m):
                continue
            try:
                fence = m.info().get("own_rows_fence") or {}
            except (OSError, AssertionError, ValueError):
                continue
            olds = self.gone & set(fence.get("waiting_for") or ())
            for key in [k for k in self.waiting if k[0] == m.name and k[1] not in olds]:
                del self.waiting[key]           # it let go by itself: a later wait starts its own count
            for old in sorted(olds):
                waits = True
                since = self.waiting.setdefault((m.name, old), now)
                if now - since < patience:
                    continue
                try:
                    s, _ = m.delete(f"/v1/cluster/{old}")
                except (OSError, ValueError):
                    continue
                if s == 202:
                    del self.waiting[(m.name, old)]
                    self.operator_steps += 1
                    self.note(f"operator: {m.name}, fenced on {old[:8]} for {now - since:.0f} s, expels it")
        return waits

    def _tear(self, n: ReplogProcess) -> str | None:
        """What a write the crash cut short leaves at the end of n's newest WAL segment (n is
        down): a frame that ends before its length (`short`), one of its full length whose
        bytes never reached the disk (`unchecked`: zeros, its checksum wrong), or the first
        bytes of a frame's magic (`magic`). None of it was acknowledged; the node cuts it off as
        it starts (node/wal/recovery.py) and must lose nothing and refuse nothing."""
        segs = list_segments(os.path.join(n.data_dir, "wal"))
        if not segs:
            return None
        how = self.rng.choice(TEARS)
        if how == "short":
            tail = walfmt.FRAME_MAGIC + struct.pack("<II", 512, 0) + bytes(self.rng.getrandbits(8) for _ in range(60))
        elif how == "unchecked":
            tail = walfmt.FRAME_MAGIC + struct.pack("<II", 96, 0x5EED) + bytes(96)
        else:
            tail = walfmt.FRAME_MAGIC[:2]
        path = os.path.join(n.data_dir, "wal", segs[-1])
        with open(path, "ab") as f:
            self.tears.append((n, path, f.tell()))
            f.write(tail)
        return f"{how}, {len(tail)} bytes after {segs[-1]}"

    @staticmethod
    def _wipe(n: ReplogProcess) -> None:
        n.kill9()
        shutil.rmtree(os.path.join(n.data_dir, "store"), ignore_errors=True)
        shutil.rmtree(os.path.join(n.data_dir, "wal"), ignore_errors=True)

    def _join(self, seeded: bool = False) -> None:
        """A new master, listing every master, starts (not waited for: it may be faulted while
        it joins) and is written to; every other node lists it from now on. `seeded`: its data
        dir is first restored from a backup of another master as a new member, and it registers
        instead of joining from a snapshot."""
        sources = [m for m in self.masters if self.backups.get(m.name)]
        if self.joined >= JOINS_MAX or (seeded and not sources):
            return
        self.joined += 1
        n = ReplogProcess(self.tmp, f"j{self.joined}", peers=[self.addresses[m.name] for m in self.masters],
                          **self.node_kw)
        if seeded:
            src = self.rng.choice(sources)
            backup = self.rng.choice(self.backups[src.name])
            restore(backup, n.data_dir, "--as-new-member")
            self.note(f"seed {n.name} from {os.path.basename(backup)}, a new member beside {src.name}")
        self.masters.append(n)
        self.addresses[n.name] = n.address
        n.start(wait=False)
        self._tell_peers(n)
        self.writers[n.name] = (BinaryWriter if self.joined % 2 else Writer)(n, self.acked)
        if not seeded:
            self.note(f"join {n.name}")

    def _tell_peers(self, n: ReplogProcess) -> None:
        """Every node but n takes its peer list afresh (n's address changed, or n is new); a
        node that is down or stopped takes it when it starts, or when it goes on."""
        for o in self.nodes:
            if o is not n:
                self._push_peers(o)

    def _later(self, kind: str, whom, lo: float, hi: float) -> None:
        self.faults.append((time.monotonic() + self.rng.uniform(lo, hi), kind, whom))

    def _heal(self, kind: str, whom) -> None:
        if kind == "cut":
            self.cuts.discard(frozenset(whom))
            self._apply_peers(frozenset(whom))
            return
        if kind == "expel":
            if not self._expel(*whom):
                self._later("expel", whom, 1.0, 2.0)    # no master took it: the operator tries again
            return
        n: ReplogProcess = whom
        if kind == "pause":
            n.proc.send_signal(signal.SIGCONT)
            self._push_peers(n)                     # a cut or mend while it was stopped
        else:
            n.peers = self._peers_of(n)
            n.start(wait=False)
            if kind in ("lose", "restore") and n.name in self.writers:
                self.writers[n.name].go.set()
        self.note(f"end {kind} {n.name}")

    # --- links --------------------------------------------------------------------------------
    def _by(self, name: str) -> ReplogProcess:
        return next(n for n in self.nodes + self.retired if n.name == name)   # a cut may outlive a replaced end

    def _running(self, n: ReplogProcess) -> bool:
        return n.proc is not None and n.proc.poll() is None and \
            not any(w is n and k == "pause" for _, k, w in self.faults)

    def _linked(self, a: ReplogProcess, b: ReplogProcess) -> bool:
        return frozenset((a.name, b.name)) not in self.cuts

    def _peers_of(self, n: ReplogProcess) -> list[str]:
        """The masters n follows: every other one it is not cut from."""
        return [self.addresses[o.name] for o in self.masters if o is not n and self._linked(n, o)]

    def _push_peers(self, n: ReplogProcess) -> None:
        """n takes its peer list as the cuts and addresses now say: at once if it runs, else when
        it starts (or, paused, when it goes on)."""
        n.peers = self._peers_of(n)
        if self._running(n):
            try:
                n.set_peers(n.peers)
            except (OSError, AssertionError):
                pass                                # it went down meanwhile: it starts with n.peers

    def _apply_peers(self, pair: frozenset[str]) -> None:
        """Both ends of `pair` take their peer lists as the cuts now say (a node that is down
        takes them when it starts)."""
        for name in pair:
            self._push_peers(self._by(name))
        self.note(("cut " if pair in self.cuts else "peers back ") + "-".join(sorted(pair)))


def _secured(tmp) -> dict:
    """What every node of a secure run gets: one certificate of a throwaway CA (TLS on
    replication, HTTP and the binary port), the cluster secret and the client token."""
    from bench.throwaway_ca import ThrowawayCA       # the dev extra's `cryptography`
    d = os.path.join(str(tmp), "secure")
    tls = ThrowawayCA(d).issue("node")
    files = {}
    for name, text in (("secret", "nemesis cluster secret"), ("token", "nemesis-token")):
        files[name] = os.path.join(d, name)
        with open(files[name], "w") as f:
            f.write(text)
    return {"extra": SMALL + ["--secret-file", files["secret"], "--token-file", files["token"]],
            "token": "nemesis-token", "tls": tls}


def run(tmp, seed: int, seconds: float, nodes: int = 4, anon: int = 1, weights: dict[str, int] | None = None,
        secure: bool = False, first: tuple[str, ...] = ()) -> Nemesis:
    """The whole run: a cluster, writes under faults for `seconds`, healing, the oracles. Every
    process it started is killed at the end, whatever happened. `first`: kinds of fault tried
    before any drawn, each until it happens (a short run that must meet a rare one)."""
    nem = Nemesis(tmp, seed, nodes, anon, weights, secure, first)
    try:
        nem.start_writing()
        nem.run(seconds)
        nem.heal_all()
        nem.check()
        return nem
    finally:
        for w in nem.writers.values():
            w.done.set()
            w.go.set()
        for n in nem.nodes + nem.retired:
            n.kill9()
            n.release_port()


def _weights(text: str) -> dict[str, int]:
    out = {}
    for part in filter(None, text.split(",")):
        kind, _, w = part.partition("=")
        if kind not in KINDS or not w.isdigit():
            raise argparse.ArgumentTypeError(f"{part!r} is not kind=weight with a kind of {', '.join(KINDS)}")
        out[kind] = int(w)
    return out


def _kinds(text: str) -> tuple[str, ...]:
    out = tuple(filter(None, text.split(",")))
    bad = [k for k in out if k not in KINDS]
    if bad:
        raise argparse.ArgumentTypeError(f"{bad[0]!r} is not a kind of {', '.join(KINDS)}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--nodes", type=int, default=4, help="masters")
    p.add_argument("--anon", type=int, default=1, help="anonymous replicas")
    p.add_argument("--weights", type=_weights, default={},
                   help=f"kind=weight,... over the defaults ({', '.join(f'{k}={w}' for k, w in zip(KINDS, WEIGHTS))})")
    p.add_argument("--first", type=_kinds, default=(),
                   help="kind,... tried before any drawn, each until it happens (e.g. replace)")
    p.add_argument("--secure", action="store_true",
                   help="TLS on every link and port, a cluster secret and a client token, as off loopback")
    a = p.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="replog-nemesis-")
    nem = run(tmp, a.seed, a.seconds, a.nodes, a.anon, a.weights, a.secure, a.first)
    print("\n".join(nem.history))
    print(f"seed {a.seed}: {len(nem.acked.writes)} acknowledged writes on every node; logs in {tmp}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
