"""Snapshots into a store, and the rejoin of a node whose upstreams collected rows it needs.

An upstream that collected WAL a subscriber still needs answers `need_rejoin`. That alone
decides nothing: while another upstream streams, the rows come from it, and the refusing link
is tried again later (once this node has caught up past what was collected, it serves again).
Only when no upstream streams does this node rebuild its store from a snapshot, and only from a
donor that covers it (node.core.membership.uncovered): every replicated component this node holds
must be in the donor's vclock, or the rows this node alone has would be discarded. If no
reachable donor covers it, nothing is discarded: the node goes on serving, its refusing
upstreams show status `need_rejoin` with what it holds that they lack, and it asks again every
`rejoin_retry_s` (a donor that subscribes to this node receives those rows meanwhile; to let
it catch up, writes pause for at most `rejoin_cover_wait_s` while it does).

The rebuild never puts the live store at risk: the snapshot goes into `store.rejoin/` beside
it, is checked to cover what this node held, gets this node's local spaces, its local
component, its meta and `gc_vclock` = the snapshot's vclock (so a subscriber behind it is told
to rejoin rather than given a gap), and is marked complete; only then are the old store and
WAL replaced. A crash at any point leaves either the old store (a `store.rejoin/` without its
mark is removed at start) or a complete new one (the swap is finished at start).
The node keeps its uuid, its identity and its local rows, and needs no fence afterwards: it had
lost nothing, and the donor holds every row of its own origin that it had."""
from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from typing import TYPE_CHECKING

import aiohttp

from node import limits
from node.applier.handshake import PROBE_ERRORS, open_link, probe
from node.cluster_space.table import STATE_ANON, Member
from node.core import messages as m
from node.core import record
from node.core.membership import describe_uncovered, expel_bounds, greeting_vclock, uncovered
from node.core.validate import timestamp_ahead_error
from node.errors import PeerRefused, RemoteProtocolError
from node.identity import identity_file as idf
from node.storage.store import Store

if TYPE_CHECKING:
    from node.process.ports import RejoinHost

log = logging.getLogger("replog.rejoin")

REJOIN_DIR = "store.rejoin"
COMPLETE_META = "rejoin_complete"
# Not carried into the rebuilt store: what the snapshot decides, and what speaks in the old ids
# ("acks": the WAL holds; every member holds the new WAL whole until it acknowledges rows).
_NOT_CARRIED = ("vclock", "hlc", "gc_vclock", "own_fence", "recovery_skipped", "acks", COMPLETE_META)


async def receive_snapshot(conn, theirs: dict, store: Store, wall_us) -> tuple[dict[int, int], int]:
    """SNAPSHOT, SNAPSHOT_ROWS*, SNAPSHOT_END into `store` (checked as it comes); BYE.
    Returns the snapshot's vclock (the donor's ids) and the records received."""
    snap = await conn.expect(m.SNAPSHOT, timeout=limits.snapshot_message_timeout_s)
    vclock = m.vclock_from_wire(snap["vclock"])
    cluster = [list(r) for r in snap["cluster"]]
    store.install_snapshot({"cluster_name": theirs["cluster_name"]}, snap["spaces"], cluster, vclock)
    n = 0
    while True:
        msg = await conn.expect(m.SNAPSHOT_ROWS, m.SNAPSHOT_END, timeout=limits.snapshot_message_timeout_s)
        if msg.type == m.SNAPSHOT_END:
            break
        if msg["space"] not in snap["spaces"]:
            raise RemoteProtocolError(f"snapshot rows for unknown space {msg['space']!r}")
        wall = wall_us()
        for key, rec in msg["rows"]:     # the HLC is raised by each record's: not past the offset bound
            why = timestamp_ahead_error(rec[record.HLC], wall)
            if why is not None:
                raise RemoteProtocolError(f"snapshot record {msg['space']}/{key[:40]} refused: {why}")
        store.install_records(msg["space"], msg["rows"])
        n += len(msg["rows"])
    await conn.send(m.BYE)
    return vclock, n


def finish_interrupted(data_dir: str) -> None:
    """At start, before the store opens: complete a rejoin whose new store was finished, or
    drop one that was not (the old store is then untouched)."""
    side = os.path.join(data_dir, REJOIN_DIR)
    if not os.path.isdir(side):
        return
    try:
        s = Store(side)
        complete = bool(s.get_meta(COMPLETE_META))
        s.close()
    except Exception as e:  # noqa: BLE001 - an unreadable side store is an unfinished one
        log.warning("rejoin: %s is unreadable (%s): an unfinished rejoin; removing it", side, e)
        complete = False
    if not complete:
        log.warning("rejoin: an unfinished rejoin left %s; removing it (the store is as before)", side)
        shutil.rmtree(side)
        return
    log.warning("rejoin: finishing a rejoin that was interrupted after its new store was complete")
    _swap(data_dir)


def _swap(data_dir: str) -> None:
    shutil.rmtree(os.path.join(data_dir, "wal"), ignore_errors=True)
    shutil.rmtree(os.path.join(data_dir, "store"), ignore_errors=True)
    os.rename(os.path.join(data_dir, REJOIN_DIR), os.path.join(data_dir, "store"))
    fd = os.open(data_dir, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Rejoiner:
    def __init__(self, node: "RejoinHost"):
        self.node = node
        self.need: dict[str, str] = {}                 # upstream address -> why it told us to rejoin
        self.needed: dict[str, dict[str, int]] = {}    # upstream address -> what it collected, by uuid
        self.blocked = ""                              # why the last attempt could not rebuild
        self.attempts = 0
        self._last_try = 0.0
        self.running = False

    # --- what the appliers say ------------------------------------------------------------------
    def on_need_rejoin(self, address: str, reason: str, collected: dict[str, int]) -> None:
        self.need[address] = reason
        self.needed[address] = dict(collected)

    def on_follow(self, address: str) -> None:
        self.need.pop(address, None)
        self.needed.pop(address, None)

    def status_of(self, address: str) -> str:
        why = self.need.get(address, "")
        return f"{why}; {self.blocked}" if self.blocked and why else why

    # --- what this node has and needs ------------------------------------------------------------
    def _mine(self) -> dict[str, int]:
        """What a snapshot must cover: this node's replicated components by uuid, expelled
        members' only up to their bound, and not an anonymous replica's own (its private
        component: `_cluster` rows nobody else has or needs)."""
        core = self.node.core
        mine = core.vclock_by_uuid()
        if core.anon:
            mine.pop(core.uuid, None)
        return {u: n for u, (n, _) in uncovered(mine, {}, expel_bounds(core.table)).items()}

    def _wanted(self) -> dict[str, int]:
        """The collected rows this node still lacks: uuid -> the lsn it needs to reach."""
        have = self.node.core.vclock_by_uuid()
        out: dict[str, int] = {}
        for collected in self.needed.values():
            for u, lsn in collected.items():
                if lsn > have.get(u, 0):
                    out[u] = max(out.get(u, 0), lsn)
        return out

    def _caught_up(self) -> bool:
        """Every upstream that told this node to rejoin said what it collected, and this node
        has all of it now (from another upstream): the links serve it again."""
        return not self._wanted() and all(self.needed.get(a) for a in self.need)

    def _fed(self, wanted: dict[str, int]) -> bool:
        """A streaming upstream has what this node lacks (or some need was not said): wait for it."""
        node = self.node
        following = [a for a in node.appliers.values() if a.status == "follow"]
        if not following:
            return False
        if not wanted:
            return True          # an older relay said nothing of what it collected: give the stream time
        return any(all(a.peer_vclock.get(u, 0) >= lsn for u, lsn in wanted.items()) for a in following)

    # --- deciding -----------------------------------------------------------------------------------
    async def watch(self) -> None:
        node = self.node
        while True:
            await asyncio.sleep(limits.rejoin_watch_s)
            self.need = {a: r for a, r in self.need.items() if a in node.appliers}
            self.needed = {a: n for a, n in self.needed.items() if a in self.need}
            if not self.need or self.running or node.status != "running" or node.core is None:
                continue
            if self._caught_up():
                continue                         # caught up past what they collected: the links serve again
            if self._fed(self._wanted()):
                continue                         # the rows come from a streaming upstream
            if time.monotonic() - self._last_try < limits.rejoin_retry_s and self.attempts:
                continue
            self._last_try = time.monotonic()
            self.attempts += 1
            self.running = True
            try:
                await self.attempt()
            finally:
                self.running = False

    async def attempt(self) -> None:
        """Find a donor that covers this node and has what it lacks, and rebuild from it; or
        leave everything as it is."""
        node = self.node
        mine, wanted = self._mine(), self._wanted()
        order = list(self.need) + [a for a in node.peers if a not in self.need]
        best: dict[str, tuple[int, int]] | None = None
        for address in order:
            try:
                theirs = await probe(node, node.http_session, address, limits.handshake_timeout_s)
            except PROBE_ERRORS as e:
                log.info("rejoin: %s cannot be a donor now: %s", address, e)
                continue
            if not theirs.get("cluster_uuid") or theirs.get("status") != "running":
                continue
            if uncovered(wanted, greeting_vclock(theirs)):
                continue                         # it lacks the collected rows too: nothing to gain
            missing = uncovered(mine, greeting_vclock(theirs))
            if missing and any(r.uuid == theirs["uuid"] for r in node.relays):
                # It is receiving our rows: pause writes so that it can have all of them.
                node.status, node.status_reason = "rejoining", f"waiting for {address} to receive this node's rows"
                missing = await self._wait_covered(address, theirs)
                if missing:
                    node.status, node.status_reason = "running", ""
            if not missing:
                await self._rebuild(address)
                return
            if best is None or len(missing) < len(best):
                best = missing
        if best is not None:
            self.blocked = (f"a snapshot would discard rows no reachable peer has ({describe_uncovered(best)}): "
                            f"this node keeps its store and asks again every {limits.rejoin_retry_s:.0f} s")
        else:
            self.blocked = "no reachable peer has the collected rows this node lacks, to give a snapshot of"
        log.error("rejoin: %s", self.blocked)
        for a in node.appliers.values():
            if a.address in self.need:
                a.error = self.status_of(a.address)

    async def _wait_covered(self, address: str, theirs: dict) -> dict[str, tuple[int, int]]:
        """Writes are paused: wait (a while) until the donor has every row this node has."""
        node = self.node
        deadline = time.monotonic() + limits.rejoin_cover_wait_s
        while True:
            while node.journal.pending:
                await node.journal.changed(timeout=limits.journal_drain_wait_s)
            missing = uncovered(self._mine(), greeting_vclock(theirs))
            if not missing or time.monotonic() > deadline:
                return missing
            await asyncio.sleep(limits.rejoin_cover_poll_s)
            try:
                theirs = await probe(node, node.http_session, address, limits.handshake_timeout_s)
            except PROBE_ERRORS:
                return missing

    async def _rebuild(self, address: str) -> None:
        node, life = self.node, self.node.life
        if self._caught_up():
            # it caught up from another upstream while the attempt probed and waited for cover:
            # a snapshot would gain nothing (and empty the WAL, and take the donor's ids)
            log.info("rejoin: caught up past what was collected while looking for a donor; no rebuild")
            node.status, node.status_reason = "running", ""
            return
        reason = self.need.get(address) or "an upstream collected rows this node needs"
        log.warning("rejoin: rebuilding the store from %s's snapshot: %s", address, reason)
        node.status, node.status_reason = "rejoining", reason
        anon = node.core.anon
        prev_id = node.core.self_id
        stopping = node.set_peers([])
        for t in stopping:
            await t
        while node.journal.pending:
            await node.journal.changed(timeout=limits.journal_drain_wait_s)
        node.store.sync()
        mine = self._mine()
        side = os.path.join(node.data_dir, REJOIN_DIR)
        shutil.rmtree(side, ignore_errors=True)
        new: Store | None = None
        try:
            if anon:
                conn, theirs = await open_link(node, node.http_session, address)
                await conn.send(m.FETCH_SNAPSHOT)
            else:
                ident = idf.load_identity(node.data_dir) if life.uses_identity_files else None
                conn, answer = await node.join.apply_once(address, m.JOIN, ident.register_code if ident else None, None)
                if conn is None:
                    raise RemoteProtocolError(f"JOIN via {address}: {answer}")
                theirs = conn.greeting
            try:
                new = Store(side, sync=(node.cfg.wal_mode == "fsync"), map_size=node.cfg.map_size)
                vclock, n = await receive_snapshot(conn, theirs, new, node.wall_us)
            finally:
                await conn.close()
            if anon:
                known = new.table.get(node.uuid)      # a REGISTER that went through, its answer lost
                my_id = known.id if known is not None else \
                    prev_id if new.table.by_id(prev_id) is None else new.table.lowest_free_id()
                new.put_cluster_member(Member(node.uuid, my_id, node.cfg.address, STATE_ANON))
            elif new.table.get(node.uuid) is None:
                raise RemoteProtocolError(f"{address}'s snapshot does not register this node")
            missing = uncovered(mine, {mem.uuid: new.vclock.get(mem.id) for mem in new.table.members()})
            if missing:
                raise RemoteProtocolError(f"{address}'s snapshot does not cover this node "
                                          f"({describe_uncovered(missing)}); keeping the store")
            self._carry_over(node.store, new, vclock)
            new.set_meta(**{COMPLETE_META: True})
            new.sync()
            new.close()
            new = None
        except BaseException as e:
            if new is not None:
                new.close()
            shutil.rmtree(side, ignore_errors=True)
            node.status, node.status_reason = "running", ""
            node.set_peers(list(node.peers))
            if isinstance(e, (PeerRefused, RemoteProtocolError, ConnectionError, OSError, asyncio.TimeoutError,
                              aiohttp.ClientError)):
                self.blocked = f"rebuilding from {address} failed: {e}"
                log.error("rejoin: %s", self.blocked)
                return
            raise
        await node.reopen_after_rejoin(_swap)
        self.need.clear()
        self.blocked = ""
        log.info("rejoin: rebuilt from %s (%d records at %s); this node is id %d, vclock %s", address, n,
                 vclock, node.core.self_id, node.core.vclock)

    @staticmethod
    def _carry_over(old: Store, new: Store, snap_vclock: dict[int, int]) -> None:
        """What the snapshot does not have: this node's local spaces and their component, its
        meta (identity, signatures, registrations, holds), and where its new WAL starts."""
        local = {n: d.to_dict() for n, d in old.spaces.items() if d.local}
        vclock = dict(new.vclock.items())
        if old.vclock.get(0):
            vclock[0] = old.vclock.get(0)
        new.install_snapshot({}, local, [], vclock)
        for name in local:
            for chunk in old.records(name):
                new.install_records(name, chunk)
        meta = {k: v for k, v in old.meta_items().items() if k not in _NOT_CARRIED}
        fence = old.get_meta("own_fence")
        if fence:
            # A fence stands until every member is heard: the donor covering this node says nothing
            # of what the others hold. The ids are the donor's now: own rows coming back are history.
            meta["own_fence"] = {**fence, "rebuilt": True}
        me = new.table.get(meta.get("uuid", ""))
        own = new.vclock.get(me.id) if me is not None else 0
        meta["own_history_lsn"] = max(int(meta.get("own_history_lsn") or 0), own)
        meta["hlc"] = max(int(old.get_meta("hlc") or 0), int(new.get_meta("hlc") or 0))
        meta["gc_vclock"] = {k: v for k, v in snap_vclock.items() if k}
        cluster_uuid = meta.pop("cluster_uuid")
        new.set_meta(**meta)
        new.set_meta(cluster_uuid=cluster_uuid)     # last: a store is non-empty from here on
