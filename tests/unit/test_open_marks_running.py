"""The mark that a node runs is on disk before the node takes a write (node/process/opening.py
`open_bootstrapped`, node/fence.py `mark_running`).

In wal_mode write the store is committed without fsync, and a start tells a power loss from an
orderly stop by that mark and the machine's boot id (node/core/lifecycle_fence.py loss_at_open).
The mark was set after the store's last sync at open: until the next checkpoint, a power loss
could take it back to the orderly stop's `running = False`, and the next start would not fence,
though the node had since acknowledged and relayed rows its WAL lost; it would write their lsns
again. (The simulation keeps its meta in memory through a power loss: an audit of its stand-ins
against production found this.) And an anonymous replica that registered, killed before its store
said it is a member, kept `anon` in its meta for good, so that no later start looked for a loss:
a start that finds itself a member repairs the mark."""
from __future__ import annotations

import shutil
from types import SimpleNamespace

from node.cluster_space.table import STATE_MEMBER, Member
from node.fence import FenceKeeper
from node.process.opening import Opening
from node.rejoin import WAL_NOT_STARTED, Rejoiner
from node.retention import Retention
from node.storage.store import Store
from tests.unit.helpers import ADDR_A, UUID_A


def _node(tmp_path) -> SimpleNamespace:
    node = SimpleNamespace(data_dir=str(tmp_path), wal_dir=str(tmp_path / "wal"), uuid=UUID_A, core=None, journal=None,
                           cfg=SimpleNamespace(wal_mode="write", segment_bytes_max=1 << 20, force_recovery=False,
                                               map_size=1 << 26, anon=False),
                           space=None, on_fatal=lambda e: None)
    node.fence, node.retention = FenceKeeper(node), Retention(node)
    return node


def _store(tmp_path) -> Store:
    store = Store(str(tmp_path / "store"), map_size=1 << 26)
    store.put_cluster_member(Member(UUID_A, 1, ADDR_A, STATE_MEMBER))
    store.set_meta(uuid=UUID_A, cluster_uuid="cluster-1", running=False)
    store.sync()
    return store


async def test_the_running_mark_is_synced_before_the_journal_starts(tmp_path, monkeypatch):
    node = _node(tmp_path)
    node.store = store = _store(tmp_path)
    said: list = []
    real_set, real_sync = store.set_meta, store.sync
    monkeypatch.setattr(store, "set_meta", lambda **kw: (said.append(("set", kw.get("running"))), real_set(**kw))[1])
    monkeypatch.setattr(store, "sync", lambda: (said.append(("sync", None)), real_sync())[1])
    Opening(node).open_bootstrapped()
    try:
        marked = said.index(("set", True))
        assert ("sync", None) in said[marked:], f"the running mark was not synced at open: {said}"
        assert store.get_meta("running") is True
        assert store.get_meta("anon") is None        # a member's store is not told it is one again
    finally:
        await node.journal.stop()
        store.close()


async def test_a_store_that_registers_this_node_as_a_member_stops_saying_it_is_anonymous(tmp_path, caplog):
    """The registration row landed (here: in the store), `anon = False` did not: the start says it."""
    node = _node(tmp_path)
    node.store = store = _store(tmp_path)
    store.set_meta(anon=True)
    Opening(node).open_bootstrapped()
    try:
        assert not node.core.anon and store.get_meta("anon") is False
        assert "no anonymous replica any more" in caplog.text
    finally:
        await node.journal.stop()
        store.close()


def _started(tmp_path) -> SimpleNamespace:
    """What Opening.open reads beyond open_bootstrapped's parts."""
    node = _node(tmp_path)
    node.space = SimpleNamespace(paths=[], sample=lambda: None)
    node.lease = None
    node.life = SimpleNamespace(after_open=lambda: None)
    return node


async def test_a_rebuilt_store_whose_wal_has_not_started_is_no_lost_wal(tmp_path):
    """A rejoin's new store is complete and swapped in (the WAL goes with the old store), and the
    process dies before the new WAL's first segment (or before the swap, which the next start
    finishes): the store has no WAL because it has not run yet, not because one was lost. It
    used to be fenced for a lost WAL, and waited for every member's word."""
    old = _store(tmp_path / "old")
    old.set_meta(running=True, wal_mode="write")
    new = Store(str(tmp_path / "store"), map_size=1 << 26)
    new.put_cluster_member(Member(UUID_A, 1, ADDR_A, STATE_MEMBER))
    Rejoiner._carry_over(old, new, {1: 0})
    old.close()
    new.close()
    node = _started(tmp_path)
    Opening(node).open(UUID_A)
    try:
        assert node.core.fence is None, node.core.fence
        assert not node.store.get_meta(WAL_NOT_STARTED)          # it has a WAL from here on
    finally:
        await node.journal.stop()
        node.store.close()
    shutil.rmtree(node.wal_dir)                                   # ... and losing that one is a loss
    node = _started(tmp_path)
    Opening(node).open(UUID_A)
    try:
        assert node.core.fence is not None
    finally:
        await node.journal.stop()
        node.store.close()


async def test_an_anonymous_replica_stays_one_and_looks_for_no_loss(tmp_path, caplog):
    """Its own rows are private notes nobody holds: a start fences nothing (here its WAL is gone),
    and its store goes on saying it is anonymous."""
    from node.cluster_space.table import STATE_ANON
    store = Store(str(tmp_path / "store"), map_size=1 << 26)
    store.put_cluster_member(Member(UUID_A, 1, ADDR_A, STATE_ANON))
    store.set_meta(uuid=UUID_A, cluster_uuid="cluster-1", running=True, wal_mode="write", anon=True)
    store.close()
    node = _started(tmp_path)
    node.cfg.anon = True
    Opening(node).open(UUID_A)
    try:
        assert node.core.anon and node.core.fence is None and not node.store.get_meta("own_fence")
        assert node.store.get_meta("anon") is True and "no anonymous replica" not in caplog.text
    finally:
        await node.journal.stop()
        node.store.close()
