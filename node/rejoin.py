"""Snapshots into a store, and the rejoin of a node whose upstreams collected rows it needs.

An upstream that collected WAL a subscriber still needs answers `need_rejoin`. What follows is
decided by the rejoin machine (node/core/lifecycle_rejoin.py): while another upstream streams,
the rows come from it; only when none does, this node rebuilds its store from a snapshot, and
only from a donor that covers it (every replicated component this node holds is in the donor's
vclock). If no reachable donor covers it, nothing is discarded: the node goes on serving, its
refusing upstreams show status `need_rejoin` with what it holds that they lack, and it asks
again every `rejoin_retry_s` (a donor that subscribes to this node receives those rows
meanwhile; to let it catch up, writes pause for at most `rejoin_cover_wait_s`). Only the
operator may let rows go, and only an expelled member's (`allow_discard`, POST
/v1/admin/rejoin). `Rejoiner` here is the machine's driver: it probes donors over the network,
fetches the snapshot and swaps stores.

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

from node import limits
from node.applier.handshake import PROBE_ERRORS, open_link, probe
from node.cluster_space.table import STATE_ANON, STATE_MEMBER, Member
from node.core import messages as m
from node.core import record
from node.core.lifecycle_rejoin import RejoinMachine, RejoinState, anon_rejoin_id, link_takes, member_snapshot
from node.core.lifecycle_rejoin_events import NoRebuild, ProbeDonor, Probed, RebuildFailed, Rebuilt, Status
from node.core.membership import expel_bounds, greeting_expel_bounds, greeting_vclock
from node.core.validate import timestamp_ahead_error
from node.errors import ClientError, RemoteProtocolError
from node.identity import identity_file as idf
from node.process.ports import ENDING
from node.storage.store import Store

if TYPE_CHECKING:
    from node.process.ports import RejoinHost

log = logging.getLogger("replog.rejoin")

REJOIN_DIR = "store.rejoin"
COMPLETE_META = "rejoin_complete"
# a rebuilt store whose WAL has not started: it has none because it has not run yet, not because
# one was lost (a start after a crash around the swap is no LOSS_NO_WAL); cleared once it opens
WAL_NOT_STARTED = "wal_not_started"
# Not carried into the rebuilt store: what the snapshot decides, and what speaks in the old ids
# ("acks": the WAL holds; every member holds the new WAL whole until it acknowledges rows).
_NOT_CARRIED = ("vclock", "hlc", "gc_vclock", "own_fence", "recovery_skipped", "acks", COMPLETE_META)


async def receive_snapshot(conn, theirs: dict, store: Store, wall_us,
                           member_of_anon: bool = False) -> tuple[dict[int, int], int]:
    """SNAPSHOT, SNAPSHOT_ROWS*, SNAPSHOT_END into `store` (checked as it comes); BYE.
    Returns the snapshot's vclock (the donor's ids) and the records received.
    `member_of_anon`: a member's from an anonymous donor, whose anonymous entries it does not
    keep (node.core.lifecycle_rejoin.member_snapshot)."""
    snap = await conn.expect(m.SNAPSHOT, timeout=limits.snapshot_message_timeout_s)
    vclock = m.vclock_from_wire(snap["vclock"])
    cluster = [list(r) for r in snap["cluster"]]
    if member_of_anon:
        cluster, vclock = member_snapshot(cluster, vclock)
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
    """The driver of the rejoin machine (node.core.lifecycle_rejoin): it reads the node for the
    machine, probes donors, pauses writes and rebuilds the store when the machine says so."""

    def __init__(self, node: "RejoinHost"):
        self.node = node
        self.machine = RejoinMachine(self)
        self._blocked_since: float | None = None   # when attempts began to find no donor (None: they do not)
        self._said: tuple[int, float] | None = None   # the last such line: (level, when)
        self._resume: tuple[str, str] | None = None   # the catch-up an attempt paused: shown again after it

    need = property(lambda self: self.machine.need)            # upstream address -> why it said rejoin
    blocked = property(lambda self: self.machine.blocked)      # why the last attempt could not rebuild
    attempts = property(lambda self: self.machine.attempts)
    discard = property(lambda self: self.machine.discard)      # expelled members whose rows may go (allow_discard)
    running = property(lambda self: self.machine.running)
    # a snapshot is on its way to replace the store: nothing is written under our own id
    # (node.core.lifecycle_fence may_lift)
    rebuilding = property(lambda self: self.machine.state is RejoinState.REBUILDING)

    # --- what the appliers say ------------------------------------------------------------------
    def on_need_rejoin(self, address: str, reason: str, collected: dict[str, int]) -> None:
        self.machine.note_need(address, reason, collected)

    def on_follow(self, address: str) -> None:
        self.machine.note_follow(address)

    def on_duplicate(self, address: str) -> None:
        self.machine.note_duplicate(address)

    def allow_discard(self, uuids: list[str]) -> dict:
        """POST /v1/admin/rejoin {"discard": [uuid, ...]}: the next rebuild may lose rows of
        these members that no donor has. Only expelled members' (a member writes on, and its next
        row needs the ones before it), and only on a node told to rejoin."""
        node = self.node
        core = node.core
        if core is None or node.status not in ("running", "rejoining"):
            raise ClientError(503, "not_ready", f"node is {node.status}")
        for u in uuids:
            if not core.table.expelled(u):
                raise ClientError(409, "not_expelled", f"{u} is not an expelled member here: only an expelled "
                                  "member's rows may be let go (a member's next row needs the ones before it)")
        if not self.machine.need:
            raise ClientError(409, "not_told_to_rejoin", "no upstream tells this node to rejoin: nothing "
                              "keeps it from following, and nothing needs discarding")
        log.warning("rejoin: the operator lets a rebuild discard rows of expelled members %s that no donor has",
                    sorted(uuids))
        self.machine.allow_discard(uuids)
        return {"discard": sorted(self.machine.discard), "needed_by": sorted(self.machine.need),
                "blocked": self.machine.blocked}

    def status_of(self, address: str) -> str:
        return self.machine.status_of(address)

    def going_without(self) -> dict[str, int]:
        return self.machine.going_without()

    # --- what the machine reads (RejoinContext) --------------------------------------------------
    def core(self):
        return self.node.core

    def may_rejoin(self) -> bool:
        # also while catching up at start (node/lifecycle.py catch_up): the member it catches up
        # with may have collected the rows it lacks, and the catch-up would wait for them for good
        return self.node.status in ("running", "catching_up") and self.node.core is not None

    def upstreams(self) -> dict[str, tuple[bool, dict[str, int]]]:
        # following: subscribed, on a link that is still up (after a BYE the status stays "follow"
        # through the short wait before the next link: node/applier/outcome.py)
        return {addr: (a.status == "follow" and a.conn is not None, a.peer_vclock)
                for addr, a in self.node.appliers.items()}

    def peers(self) -> list[str]:
        return list(self.node.peers)

    def journal_pending(self) -> int:
        return self.node.journal.pending

    # --- acting on it -----------------------------------------------------------------------------
    async def watch(self) -> None:
        node, machine = self.node, self.machine
        while True:
            if machine.state is RejoinState.COVER_WAIT and node.journal.pending:
                await node.journal.changed(timeout=limits.journal_drain_wait_s)
            else:
                await asyncio.sleep(limits.rejoin_cover_poll_s if machine.running else limits.rejoin_watch_s)
            machine.tick(time.monotonic())
            if not machine.need:                 # nothing to rejoin for (any more): a later need starts afresh
                self._blocked_since = self._said = None
            try:
                await self._act()
            except BaseException:
                machine.abort()                  # the attempt is over; the watch starts again (supervised)
                self._show_ready()
                raise

    async def _act(self) -> None:
        """Act on the machine's Ready until it has nothing more: each answer is stepped in."""
        machine = self.machine
        while rd := machine.ready():
            for note in rd.apply:
                self._show(note)
            for e in rd.effects:
                if type(e) is ProbeDonor:
                    machine.step(await self._probe(e.address), time.monotonic())
                else:
                    await self._rebuild(e.address, e.reason, e.donor_anon, e.discarding)
            machine.advance(rd)

    def _show_ready(self) -> None:
        rd = self.machine.ready()
        assert not rd.effects, rd
        for note in rd.apply:
            self._show(note)
        self.machine.advance(rd)

    def _show(self, note) -> None:
        node = self.node
        if type(note) is Status:
            if node.status in ENDING:
                # The node stops: a rebuild its stop ended (its link closed, its task cancelled)
                # does not show it running again, nor bring its links back (Peering.set_peers).
                return
            if node.status == "catching_up":
                self._resume = (node.status, node.status_reason)
            if note.status == "running" and self._resume is not None:
                (node.status, node.status_reason), self._resume = self._resume, None   # not active yet
            else:
                node.status, node.status_reason = note.status, note.reason
        elif type(note) is NoRebuild:
            log.info("rejoin: caught up past what was collected while looking for a donor; no rebuild")
        elif not note.on_links:         # a rebuild that failed: tried again, maybe from another donor
            log.warning("rejoin: %s; the store is kept and the rejoin is tried again", note.why)
        else:                           # no donor: shown on the links until one can give a snapshot
            self._say_blocked(note.why, time.monotonic())
            for a in node.appliers.values():
                if a.address in self.need:
                    a.error = self.status_of(a.address)

    def _say_blocked(self, why: str, now: float) -> None:
        """An attempt found no donor. Right after a start, or a restore as a new member, that is
        often only for a moment: the peers have not yet received this node's newest rows, or
        have not yet subscribed to it. So a WARNING until attempts have found none for
        `rejoin_blocked_error_s`, then an ERROR (the operator may have to act: docs/replication.md);
        at each level a line at most once per `link_retry_log_interval_s`, not once per attempt
        (`why` names lsns, which move on while the node writes). /v1/info and the links show the
        newest `why` all along."""
        if self._blocked_since is None:
            self._blocked_since = now
        level = logging.ERROR if now - self._blocked_since >= limits.rejoin_blocked_error_s else logging.WARNING
        if self._said is not None and self._said[0] == level and now - self._said[1] < limits.link_retry_log_interval_s:
            return
        self._said = (level, now)
        log.log(level, "rejoin: %s", why)

    async def _probe(self, address: str) -> Probed:
        node = self.node
        try:
            theirs = await probe(node, node.http_session, address, limits.handshake_timeout_s)
        except PROBE_ERRORS as e:
            log.info("rejoin: %s cannot be a donor now: %s", address, e)
            return Probed(address, None)
        serving = bool(theirs.get("cluster_uuid")) and theirs.get("status") == "running"
        # its link from us, not an older one being replaced (node/applier/stream.py Relay.run)
        receiving, without = link_takes(next((r.machine for r in node.relays
                                              if r.uuid == theirs.get("uuid") and not r.conn.closed), None))
        return Probed(address, greeting_vclock(theirs), serving, receiving, greeting_expel_bounds(theirs),
                      theirs.get("anon") is True, str(theirs.get("uuid") or ""), without)

    async def _rebuild(self, address: str, reason: str, donor_anon: bool = False, discarding: tuple = ()) -> None:
        """Links down, the journal drained, the donor's snapshot into a side store that must
        cover this node, then the swap; the machine hears how it ended. An anonymous replica
        rebuilds by FETCH_SNAPSHOT, and so does a member from an anonymous donor (`donor_anon`:
        it registers nobody; its snapshot must have this member). `discarding`: rows of expelled
        members that the donor lacks and the operator let go (allow_discard)."""
        node, life = self.node, self.node.life
        log.warning("rejoin: rebuilding the store from %s's snapshot%s: %s", address,
                    " (an anonymous replica)" if donor_anon else "", reason)
        if discarding:
            log.warning("rejoin: discarding rows that the operator let go (POST /v1/admin/rejoin): %s",
                        ", ".join(f"expelled member {u} from lsn {got + 1} to {have}" for u, have, got in discarding))
        anon = node.core.anon
        prev_id = node.core.self_id
        stopping = node.set_peers([])
        for t in stopping:
            await t
        while node.journal.pending:
            await node.journal.changed(timeout=limits.journal_drain_wait_s)
        node.store.sync()
        mine = self.machine.mine()
        side = os.path.join(node.data_dir, REJOIN_DIR)
        shutil.rmtree(side, ignore_errors=True)
        new: Store | None = None
        try:
            if anon or donor_anon:
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
                vclock, n = await receive_snapshot(conn, theirs, new, node.wall_us,
                                                   member_of_anon=donor_anon and not anon)
            finally:
                await conn.close()
            if anon:
                my_id = anon_rejoin_id(new.table, node.uuid, prev_id)
                new.put_cluster_member(Member(node.uuid, my_id, node.cfg.address, STATE_ANON))
            elif new.table.get(node.uuid) is None or new.table.get(node.uuid).state != STATE_MEMBER:
                raise RemoteProtocolError(f"{address}'s snapshot does not register this node")
            why = self.machine.snapshot_uncovered(mine, {mem.uuid: new.vclock.get(mem.id) for mem in new.table.members()},
                                                  expel_bounds(new.table))
            if why is not None:
                raise RemoteProtocolError(f"{address}'s snapshot {why}; keeping the store")
            self._carry_over(node.store, new, vclock)
            new.set_meta(**{COMPLETE_META: True})
            new.sync()
            new.close()
            new = None
        except BaseException as e:
            if new is not None:
                new.close()
            shutil.rmtree(side, ignore_errors=True)
            known = isinstance(e, PROBE_ERRORS)     # the donor's or the network's doing
            self.machine.step(RebuildFailed(address, str(e) if known else None), time.monotonic())
            self._show_ready()                 # running again, and why, before the links come back
            node.set_peers(list(node.peers))
            if known:
                return
            raise
        await node.reopen_after_rejoin(_swap)
        self.machine.step(Rebuilt(address), time.monotonic())
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
        meta[WAL_NOT_STARTED] = True
        cluster_uuid = meta.pop("cluster_uuid")
        new.set_meta(**meta)
        new.set_meta(cluster_uuid=cluster_uuid)     # last: a store is non-empty from here on
