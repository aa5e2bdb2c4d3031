"""The own-rows fence of a node (the rule is node.core.membership's): after a loss, this node
writes nothing under its own id until every member has said how many of its rows it holds and
those rows are back. This module decides when a loss happened, keeps the fence across restarts
(`_meta` "own_fence") and lifts it; the decisions are node/core/lifecycle_fence.py's (the
peers' greetings reach the fence there, through node/process/peering.py).

A loss, for this rule (docs/replication.md, "Membership never loses or forks a write"):
- the store was rebuilt from a snapshot under an identity that may have written before (a
  member re-joining with its identity file kept and its store lost; a lease slot's uuid that
  the cluster knows; a snapshot that already holds rows of this node's own origin);
- the store was restored from a backup (whatever wrote the backup set the fence in it);
- the machine restarted (its boot id changed) while this node ran with wal_mode = write and did
  not stop in order: rows written to the WAL but not yet on disk may be gone here and may have
  been sent to peers before;
- the WAL directory is gone while the store holds data (unless the store last ran with
  wal_mode none, which keeps no WAL and relays nothing).
While the fence stands, client writes to replicated spaces answer 503 `own_rows_unconfirmed`
(local spaces take writes: their rows never leave this node), appliers subscribe for this
node's own rows only, and `_cluster` changes that would need a row of ours wait."""
from __future__ import annotations

import asyncio
import logging
import os

from node import limits
from node.core.anon_followers import Follower, Followers, Forgotten
from node.core.lifecycle_fence import give_up, lift, loss_at_open, may_lift, take_up_fence
from node.wal.writer import fsync_dir

log = logging.getLogger("replog.fence")

FENCE_META = "own_fence"
REGISTERED_FILE = "registered_members"   # beside the identity file: members this node registered
FOLLOWERS_FILE = "anonymous_followers"   # beside it: anonymous replicas that follow this node
FORGOTTEN_FILE = "forgotten_followers"   # and those the operator had it forget (refused if they come back)
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
BOOT_ID_ENV = "REPLOG_BOOT_ID_FILE"     # tests stand a machine restart in with another file


def boot_id() -> str:
    try:
        with open(os.environ.get(BOOT_ID_ENV) or BOOT_ID_PATH) as f:
            return f.read().strip()
    except OSError:
        return ""


class FenceKeeper:
    def __init__(self, node):
        self.node = node

    @property
    def fenced(self) -> bool:
        core = self.node.core
        return core is not None and core.fence is not None

    # --- start ----------------------------------------------------------------------------------
    def loss_at_open(self, wal_present: bool) -> str | None:
        """Before recovery, on a store with data: a loss this start must fence against."""
        node, store = self.node, self.node.store
        return loss_at_open(fenced=bool(store.get_meta(FENCE_META)), wal_mode=node.cfg.wal_mode,
                            wal_present=wal_present, was_running=bool(store.get_meta("running")),
                            boot_before=store.get_meta("boot_id") or "", boot_now=boot_id(),
                            wal_mode_before=store.get_meta("wal_mode") or "")

    def mark_running(self, running: bool) -> None:
        """`running` in the store while the node runs (an orderly stop clears it), with the boot id
        and the wal_mode it runs with."""
        self.node.store.set_meta(running=running, boot_id=boot_id(), wal_mode=self.node.cfg.wal_mode)

    def set(self, reason: str, rebuilt: bool) -> None:
        """Fence now (persisted first, so a crash keeps it). `rebuilt`: the store was rebuilt from
        a donor's snapshot (OwnRowsFence.rebuilt: this node's earlier own `_cluster` rows are
        history from now on)."""
        store = self.node.store
        store.set_meta(**{FENCE_META: {"reason": reason, "rebuilt": rebuilt}})
        store.sync()
        if rebuilt:
            store.own_history_lsn = limits.lsn_max
        log.warning("fence: %s; this node writes under its own id again once every member has said how many of "
                    "its rows it holds and they are back", reason)

    def restore(self) -> None:
        """The core was just built: take up a fence the store holds, with the members this node
        registered itself and the anonymous replicas that followed it (they may hold its rows
        though the donor never heard of them) and those the operator gave up on
        (node.core.lifecycle_fence.take_up_fence)."""
        node = self.node
        if node.core is None:
            return
        if take_up_fence(node.core, node.store.get_meta(FENCE_META), registered_members(node.data_dir),
                         node.retention.followers):
            node.store.own_history_lsn = limits.lsn_max

    def give_up(self, uuid: str) -> None:
        """The operator expels a member while this node is fenced: the fence stops waiting for it
        now, and the expel row (a row under our own id) is written once the fence is lifted."""
        store = self.node.store
        meta = dict(store.get_meta(FENCE_META) or {})
        meta["given_up"] = give_up(self.node.core.fence, meta.get("given_up"), uuid)
        store.set_meta(**{FENCE_META: meta})
        store.sync()
        log.warning("fence: the operator expels %s; this node stops waiting for it and writes the expel once its "
                    "fence is lifted", uuid)

    # --- running ------------------------------------------------------------------------------
    def try_lift(self) -> bool:
        """Lift the fence if the core says it may; whether it is gone. A lease holder lifts it
        only once it has recorded in its slot that it serves (node/identity/lease_startup.py
        mark_serving): the lift writes a `_cluster` transaction under the member's id, and a
        row written before that record made a dir that served earlier look current (its next
        holder took the slot over, or served it as it was, and forked those lsns)."""
        node = self.node
        core = node.core
        if core is None or core.fence is None:
            return True
        if node.journal is None or not may_lift(core, node.rejoiner.rebuilding):
            return False
        if node.lease is not None and not node.lease.served_recorded:
            return False
        self._lift()
        return True

    async def watch(self) -> None:
        while True:
            self.try_lift()
            await asyncio.sleep(limits.fence_poll_s)

    def _lift(self) -> None:
        node, store = self.node, self.node.store
        lifted = lift(node.core, node.wall_us(), (store.get_meta(FENCE_META) or {}).get("given_up"))
        store.set_meta(**{FENCE_META: None}, own_history_lsn=lifted.own_history_lsn)
        store.own_history_lsn = lifted.own_history_lsn
        store.sync()
        if lifted.restate is not None:       # claimed: queued before anything else can await
            node.journal.submit_nowait([lifted.restate], want_future=False)
        log.info("fence: every member was heard and this node's own rows are back (up to lsn %d): it writes "
                 "under its own id again", lifted.target)
        node.after_fence(lifted.given_up)

    def info(self) -> dict | None:
        core = self.node.core
        if core is None or core.fence is None:
            return None
        own = core.vclock.get(core.self_id)
        return {"reason": core.fence.reason, "waiting_for": core.fence.waiting_for(core.table, core.uuid),
                # members heard before they knew of an expel the fence relies on -> those expels
                "unaware": core.fence.unaware(core.table, core.uuid),
                "own_lsn": own, "target": core.fence.target(), "message": core.fence.explain(core.table, core.uuid, own)}


def wal_present(wal_dir: str) -> bool:
    return os.path.isdir(wal_dir) and any(n.endswith(".wal") for n in os.listdir(wal_dir))


def remember_registration(data_dir: str, uuid: str) -> None:
    """A member registered through this node: noted beside the identity (outside the store), so
    that a store lost later still knows this member may hold its rows. Durable before the
    registration is answered."""
    path = os.path.join(data_dir, REGISTERED_FILE)
    if uuid in registered_members(data_dir):
        return
    _append_synced(path, uuid + "\n")


def _append_synced(path: str, line: str, sync: bool = True) -> None:
    """Append `line` to a file beside the identity, on disk when this returns (`sync`; the
    directory too when this made the file, or its name could be lost with the power)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        made = False
    except FileNotFoundError:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        made = True
    try:
        os.write(fd, line.encode())
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    if sync and made:
        fsync_dir(os.path.dirname(path) or ".")


def registered_members(data_dir: str) -> set[str]:
    try:
        with open(os.path.join(data_dir, REGISTERED_FILE)) as f:
            return {line.strip() for line in f if line.strip()}
    except OSError:
        return set()


def anonymous_followers(data_dir: str) -> Followers:
    """The anonymous replicas this node remembers as its followers (node.core.anon_followers
    Follower); a later line of a uuid supersedes an earlier one. Each entry is written as two
    lines (`_follower_lines`): `uuid address seen`, all a release before this one reads (it skips
    the other, and so still remembers every follower after a downgrade), then `uuid address seen
    reach linked` (reach "-": unknown). A line of three fields alone knows no reach: the old
    release wrote it, or the second line was torn. A damaged line is skipped (the one before it
    stands)."""
    out: Followers = {}
    for line in _lines(data_dir, FOLLOWERS_FILE):
        entry = _follower(line.split())
        if entry is not None:
            out[entry[0]] = entry[1]
    return out


def _follower(parts: list[str]) -> tuple[str, Follower] | None:
    if len(parts) not in (3, 5):
        return None
    try:
        seen = float(parts[2])
        reach = None if len(parts) == 3 or parts[3] == "-" else int(parts[3])
    except ValueError:
        return None
    if reach is not None and not 0 <= reach <= limits.lsn_max or len(parts) == 5 and parts[4] not in ("0", "1"):
        return None
    return parts[0], Follower(parts[1], seen, reach, len(parts) == 5 and parts[4] == "1")


def _follower_lines(uuid: str, f: Follower) -> str:
    reach = "-" if f.reach is None else str(f.reach)
    first = f"{uuid} {f.address or '-'} {f.seen:.3f}"
    return f"{first}\n{first} {reach} {int(f.linked)}\n"


def append_follower(data_dir: str, uuid: str, entry: Follower, sync: bool = True) -> None:
    """An anonymous follower's entry. Synced when a link opens (node.core.anon_followers
    follower_seen), before its FETCH or SUBSCRIBE is answered: it may come to hold rows of ours
    no member has, and a store lost later must still wait for it. Not when its last link ends
    (follower_unlinked): lost, the linked entry stands."""
    _append_synced(os.path.join(data_dir, FOLLOWERS_FILE), _follower_lines(uuid, entry), sync)


def write_followers(data_dir: str, followers: Followers) -> None:
    """Rewrite the followers file, one line per follower (atomically: a crash keeps the old file
    or the new)."""
    _rewrite(data_dir, FOLLOWERS_FILE, [_follower_lines(u, f) for u, f in followers.items()])


def forgotten_followers(data_dir: str) -> Forgotten:
    """The anonymous replicas the operator had this node forget: uuid -> when (s)."""
    return {p[0]: t for p, t in _timed_lines(data_dir, FORGOTTEN_FILE, 2)}


def _timed_lines(data_dir: str, name: str, fields: int):
    """(the fields, the last one as a time) of every well-formed line of a file beside the
    identity (none if it is missing); a torn or damaged line is skipped."""
    for line in _lines(data_dir, name):
        parts = line.split()
        if len(parts) == fields:
            try:
                yield parts, float(parts[-1])
            except ValueError:
                continue


def _lines(data_dir: str, name: str) -> list[str]:
    """The lines of a file beside the identity (none if it is missing)."""
    try:
        with open(os.path.join(data_dir, name)) as f:
            return f.read().splitlines()
    except OSError:
        return []


def write_forgotten(data_dir: str, forgotten: Forgotten) -> None:
    """Rewrite the forgotten followers' file (atomically), before the followers file drops them:
    a crash between the two leaves a follower both remembered and refused, never neither."""
    _rewrite(data_dir, FORGOTTEN_FILE, [f"{u} {t:.3f}\n" for u, t in forgotten.items()])


def _rewrite(data_dir: str, name: str, lines: list[str]) -> None:
    path = os.path.join(data_dir, name)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.writelines(lines)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(data_dir)
