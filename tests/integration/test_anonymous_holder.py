"""A member's last rows held only by an anonymous replica, on real processes (session 28; the
simulation's full-mix seeds 5108 and 5782 found it): masters A, B and C, an anonymous replica R
following B. With A and C down, B takes writes that only R receives; B then loses its store and WAL
(its identity kept) and rejoins through A, which lacks them. B must not write under its own
uuid until those rows are back: once it did, its next rows took the lsns R holds, and R skipped
them as rows it had, for good. The way back that loses nothing is the one B's status names:
replicate from R. B remembers R beside its identity, so its fence waits to hear from R even
when every member has been heard; one gone for good is expelled on B (docs/replication.md,
"Anonymous replicas"). A replica whose disk was replaced holds no fence when a member holds
what it may hold."""
from __future__ import annotations

import os
import shutil
from typing import Callable

from tests.integration.harness import ReplogProcess, mesh, wait_for
from tests.integration.oracles import (Acked, acked_everywhere, lose_store_and_rejoin, no_fork, replicated_spaces,
                                      restart_all, upstream)


def masters_and_a_replica_of_b(tmp_path, procs, n: int, extra: list[str] | None = None,
                               r_extra: list[str] | None = None):
    """`n` masters (the second is B) and R, an anonymous replica following B alone, each with
    an acknowledged write everywhere. Returns (masters, r, acked)."""
    acked = Acked()
    masters = mesh(tmp_path, n, extra=extra)
    procs.extend(masters)
    b = masters[1]
    b.create_space("kv")
    r = ReplogProcess(tmp_path, "r", peers=[b], extra=["--anon"] + (r_extra or []))
    procs.append(r)
    r.start()
    wait_for(lambda: all("kv" in replicated_spaces(x) for x in masters), 30, "kv on every master")
    for x in masters:
        acked.put(x, "kv", f"early-{x.name}", x.name)
    acked_everywhere(masters + [r], acked)
    return masters, r, acked


def fence_lifted(node: ReplogProcess) -> bool:
    """Running, with no fence: a node still going active after its join shows no fence yet
    either, and answers writes with 503 joining."""
    info = node.info()
    return info["status"] == "running" and info.get("own_rows_fence") is None


def test_a_node_whose_last_rows_only_an_anonymous_replica_holds_takes_them_back_before_writing(tmp_path, procs):
    """C stays down while B rejoins, so B's fence is still up when R comes back to it: B must
    hear R, wait for its rows, and take them back from R once it replicates from it."""
    (a, b, c), r, acked = masters_and_a_replica_of_b(tmp_path, procs, 3)
    assert a.stop() == 0 and c.stop() == 0
    b_last = [acked.put(b, "kv", f"b-{i}", i)["lsn"] for i in range(20)][-1]
    acked_everywhere([b, r], acked)                     # on B and R only
    lose_store_and_rejoin(b, a)
    ru = r.uuid()

    def fenced_on_r():
        fence = b.info().get("own_rows_fence") or {}
        return fence if fence.get("target") == b_last else None
    fence = wait_for(fenced_on_r, 30, "B's fence heard that R holds its rows")
    c.start()
    wait_for(lambda: not b.info()["own_rows_fence"]["waiting_for"], 30, "B heard C")
    fence = b.info()["own_rows_fence"]
    assert fence is not None and fence["target"] == b_last, fence
    assert f"{ru} at {r.address} is an anonymous replica" in fence["message"] and "peers" in fence["message"], fence
    s, d = b.put("/v1/spaces/kv/keys/while-fenced", 1)
    assert s == 503 and d["error"]["code"] == "own_rows_unconfirmed", \
        f"B wrote under its own uuid while only R held its rows up to lsn {b_last}: {s} {d}"

    b.set_peers([a, c, r])                               # what the status says: replicate from R
    wait_for(lambda: fence_lifted(b), 60, "B's rows came back from R")
    acked_everywhere([a, b, c, r], acked, 60)
    d = b.kv_put("kv", "after", "after")
    assert d["lsn"] > b_last, f"B's next lsn {d['lsn']} reuses one of its rows up to {b_last}"
    acked.writes[("kv", "after")] = ("after", b.uuid(), d["lsn"])
    acked_everywhere([a, b, c, r], acked, 30)            # R did not skip it as a row it had
    assert ru not in a.cluster() and ru not in b.cluster(), "a master registered the anonymous replica"
    no_fork([a, b, c, r])
    restart_all([a, b, c, r])


def test_rows_the_anonymous_replica_collected_from_its_wal_come_back_in_its_snapshot(tmp_path, procs):
    """As above, but R has collected B's rows from its WAL by the time B replicates from it (with
    no row of its own, R's WAL is held by no member: node/core/holds.py `lapsing`): R tells B to
    rejoin, and B, a member, rebuilds from R's snapshot (R registers nobody: FETCH, not JOIN),
    its rows in it, before it writes again."""
    small = ["--segment-bytes-max", "4096", "--checkpoint-interval-s", "0.3"]
    (a, b, c), r, acked = masters_and_a_replica_of_b(tmp_path, procs, 3, r_extra=small)
    assert a.stop() == 0 and c.stop() == 0
    bu = b.uuid()
    b_rows = [acked.put(b, "kv", f"b-{i}", "x" * 100)["lsn"] for i in range(80)]
    acked_everywhere([b, r], acked)

    def r_collected() -> bool:
        # (R may have taken B's rows in one batch, one segment, never collected while last: a
        # row more starts the next)
        b_rows.append(acked.put(b, "kv", f"b-{len(b_rows)}", "x" * 100)["lsn"])
        return r.info()["wal"]["gc_vclock"].get(str(r.cluster()[bu]["id"]), 0) > b_rows[40]
    wait_for(r_collected, 30, "R collected B's rows from its WAL", interval=0.2)
    acked_everywhere([b, r], acked)
    lose_store_and_rejoin(b, a)
    wait_for(lambda: (b.info().get("own_rows_fence") or {}).get("target") == b_rows[-1], 30,
             "B's fence heard that R holds its rows")
    c.start()
    b.set_peers([a, c, r])                               # what the status says: replicate from R
    wait_for(lambda: fence_lifted(b), 60, "B's rows came back from R")
    assert f"rebuilding the store from {r.address}'s snapshot (an anonymous replica)" in b.log_text()
    d = b.kv_put("kv", "after", "after")
    assert d["lsn"] > b_rows[-1], f"B's next lsn {d['lsn']} reuses one of its rows up to {b_rows[-1]}"
    acked.writes[("kv", "after")] = ("after", bu, d["lsn"])
    acked_everywhere([a, b, c, r], acked, 60)
    assert r.uuid() not in b.cluster() and "anonymous" not in {m["state"] for m in b.cluster().values()}
    no_fork([a, b, c, r])
    restart_all([a, b, c, r])


def writes_once_its_rows_came_back(b: ReplogProcess, b_last: int, acked: Acked, nodes: list[ReplogProcess]) -> None:
    """B's fence lifts (its rows came back from R), its next write follows them, and every node
    has it; no (origin, lsn) names two rows anywhere."""
    wait_for(lambda: fence_lifted(b), 60, "B's rows came back from R")
    d = b.kv_put("kv", "after", "after")
    assert d["lsn"] > b_last, f"B's next lsn {d['lsn']} reuses one of its rows up to {b_last}"
    acked.writes[("kv", "after")] = ("after", b.uuid(), d["lsn"])
    acked_everywhere(nodes, acked, 60)
    no_fork(nodes)


Lost = tuple[ReplogProcess, ReplogProcess, ReplogProcess, str, Acked, int]


def lost_store_with_rows_only_on_r(tmp_path, procs, extra: list[str] | None = None,
                                   before_loss: Callable[[ReplogProcess, str], None] | None = None) -> Lost:
    """Masters A and B, R an anonymous replica of B. With A down B takes 20 writes that only R
    gets; R stops (then `before_loss(b, R's uuid)`); B loses its store and WAL (identity kept)
    and rejoins through A. Returns (a, b, r, R's uuid, acked, B's last lsn before the loss), R
    down."""
    (a, b), r, acked = masters_and_a_replica_of_b(tmp_path, procs, 2,
                                                  extra=["--checkpoint-interval-s", "0.3"] + (extra or []))
    assert a.stop() == 0
    b_last = [acked.put(b, "kv", f"b-{i}", i)["lsn"] for i in range(20)][-1]
    acked_everywhere([b, r], acked)
    ru = r.uuid()
    assert r.stop() == 0
    if before_loss is not None:
        before_loss(b, ru)
    lose_store_and_rejoin(b, a)
    return a, b, r, ru, acked, b_last


def test_a_lost_store_waits_to_hear_from_the_anonymous_replica_that_followed_it(tmp_path, procs):
    """Every member has been heard, yet B stays fenced: R followed it (B remembers that beside
    its identity) and may hold rows of B no member has. R comes back, says it holds them, and
    they come back from it once B replicates from it."""
    a, b, r, ru, acked, b_last = lost_store_with_rows_only_on_r(tmp_path, procs)
    fence = wait_for(lambda: (lambda f: f if f and f["waiting_for"] == [ru] else None)(b.info().get("own_rows_fence")),
                     30, "B heard A and waits for R alone")
    assert f"{ru} is an anonymous replica that followed this node" in fence["message"], fence
    s, d = b.put("/v1/spaces/kv/keys/while-fenced", 1)
    assert s == 503 and d["error"]["code"] == "own_rows_unconfirmed", (s, d)

    r.start()
    fence = wait_for(lambda: (lambda f: f if f and not f["waiting_for"] else None)(b.info().get("own_rows_fence")),
                     30, "B heard R")
    assert fence["target"] == b_last and f"{ru} at {r.address} is an anonymous replica" in fence["message"], fence
    b.set_peers([a, r])
    writes_once_its_rows_came_back(b, b_last, acked, [a, b, r])
    restart_all([a, b, r])


def give_up_r(a: ReplogProcess, b: ReplogProcess, ru: str, acked: Acked) -> None:
    """The operator expels R on fenced B (202, pending the fence): B's rows only R had are given
    up, B takes writes again, and R is expelled on every member."""
    s, d = b.delete(f"/v1/cluster/{ru}")
    assert s == 202 and d["state"] == "expel_pending", (s, d)
    for k in [k for k in acked.writes if k[1].startswith("b-")]:
        del acked.writes[k]
    d = wait_for(lambda: (lambda sd: sd[1] if sd[0] == 200 else None)(b.put("/v1/spaces/kv/keys/after", 1)),
                 30, "B takes writes once R is given up")
    acked.writes[("kv", "after")] = (1, b.uuid(), d["lsn"])
    acked_everywhere([a, b], acked)
    wait_for(lambda: all((n.cluster().get(ru) or {}).get("state") == "expelled" for n in (a, b)), 30,
             "R expelled on every member")


def test_an_anonymous_follower_gone_for_good_is_let_go_by_expelling_it_on_the_fenced_node(tmp_path, procs):
    """R never comes back: the operator expels it on B (202, pending the fence); B writes again,
    R's uuid is expelled everywhere, and B no longer remembers it once it checkpoints."""
    a, b, r, ru, acked, b_last = lost_store_with_rows_only_on_r(tmp_path, procs)
    wait_for(lambda: (b.info().get("own_rows_fence") or {}).get("waiting_for") == [ru], 30, "B waits for R")
    assert ru in open(os.path.join(b.data_dir, "anonymous_followers")).read()
    give_up_r(a, b, ru, acked)
    wait_for(lambda: ru not in open(os.path.join(b.data_dir, "anonymous_followers")).read(), 30,
             "B forgets R at a checkpoint")
    no_fork([a, b])
    restart_all([a, b])


def test_an_anonymous_replica_whose_rows_are_given_up_is_expelled_and_refused(tmp_path, procs):
    """R comes back and says it holds B's rows up to its last lsn; the operator expels R on B
    instead of replicating from it. B lifts its fence and writes again after its own rows (its
    members wait at a gap in B's rows, so B cannot skip past R's): R, expelled everywhere, keeps
    rows that now differ under those lsns, and every member refuses it."""
    a, b, r, ru, acked, b_last = lost_store_with_rows_only_on_r(tmp_path, procs)
    r.start()
    fence = wait_for(lambda: (lambda f: f if f and f["target"] == b_last else None)(b.info().get("own_rows_fence")),
                     30, "B heard R say it holds its rows")
    assert not fence["waiting_for"], fence
    give_up_r(a, b, ru, acked)
    r.stop()
    r.start(wait=False)
    wait_for(lambda: "expelled" in (upstream(r, b.address).get("error") or ""), 30, "R refused as expelled")
    assert r.kv_get("kv", "after")[0] == 404 and r.kv_get("kv", "b-0")[0] == 200   # its rows, none of B's new ones
    no_fork([a, b])
    restart_all([a, b])


def test_a_replica_quiet_past_its_ttl_is_remembered_while_it_may_hold_rows_no_member_has(tmp_path, procs):
    """As `lost_store_with_rows_only_on_r`, but R stays away past anon_ttl_s before B's loss, B
    checkpointing meanwhile. A, down, lacks B's last rows, so R may be their only holder: B keeps
    remembering it and its fence waits for it. (Forgotten, B's fence would lift on A's word alone
    and B's next rows would take the lsns R holds: a fork nobody would see.) Once A holds every row
    of B that R may hold, B forgets R at its next checkpoint past the TTL."""
    def kept_past_its_ttl(b: ReplogProcess, ru: str) -> None:
        wait_for(lambda: f"anonymous follower {ru} is unseen past anon_ttl_s but may hold rows of this node up to lsn"
                 in b.log_text(), 30, "B kept R past its TTL")
        assert ru in open(os.path.join(b.data_dir, "anonymous_followers")).read()
        assert "forgets anonymous follower" not in b.log_text()
    a, b, r, ru, acked, b_last = lost_store_with_rows_only_on_r(tmp_path, procs, ["--anon-ttl-s", "1"],
                                                                kept_past_its_ttl)
    fence = wait_for(lambda: (lambda f: f if f and f["waiting_for"] == [ru] else None)(b.info().get("own_rows_fence")),
                     30, "B heard A and waits for R")
    s, d = b.put("/v1/spaces/kv/keys/while-fenced", 1)
    assert s == 503 and d["error"]["code"] == "own_rows_unconfirmed", (s, d)

    r.start()
    wait_for(lambda: (lambda f: f if f and not f["waiting_for"] and f["target"] == b_last else None)(
        b.info().get("own_rows_fence")), 30, "B heard R say it holds its rows")
    b.set_peers([a, r])                                  # what the status says: replicate from R
    writes_once_its_rows_came_back(b, b_last, acked, [a, b, r])

    b.set_peers([a])
    assert r.stop() == 0                                 # A holds all of B's rows now: R may go
    wait_for(lambda: ru not in open(os.path.join(b.data_dir, "anonymous_followers")).read(), 30,
             "B forgets R at a checkpoint past its TTL")
    restart_all([a, b])


def test_a_replica_whose_disk_was_replaced_does_not_hold_a_lost_stores_fence(tmp_path, procs):
    """R takes B's rows, and so does A. R is killed and its disk replaced: it comes back under a
    new uuid. B then loses its store: its entry for R's old uuid bounds what R may hold by B's
    own lsn when R's link ended, and A says it holds that many, so B's fence lifts without
    waiting for the old uuid (it used to wait for ever, unless the operator expelled it)."""
    (a, b), r, acked = masters_and_a_replica_of_b(tmp_path, procs, 2)
    b_last = [acked.put(b, "kv", f"b-{i}", i)["lsn"] for i in range(20)][-1]
    acked_everywhere([a, b, r], acked)
    old = r.uuid()
    r.kill9()
    shutil.rmtree(r.data_dir)                            # a new disk
    os.makedirs(r.data_dir)

    def unlinked_entry() -> bool:
        s, d = b.get("/v1/admin/followers")
        return s == 200 and any(f["uuid"] == old and not f["linked"] for f in d["followers"])
    wait_for(unlinked_entry, 30, "B saw R's link end")
    b.kill9()
    shutil.rmtree(os.path.join(b.data_dir, "store"))
    shutil.rmtree(os.path.join(b.data_dir, "wal"))
    b.start(wait=False)
    wait_for(lambda: "kv" in replicated_spaces(b), 60, "B rejoined through A")
    wait_for(lambda: fence_lifted(b), 60, f"B's fence lifted without R's old uuid {old}")
    d = b.kv_put("kv", "after", "after")
    assert d["lsn"] > b_last, f"B's next lsn {d['lsn']} reuses one of its rows up to {b_last}"
    acked.writes[("kv", "after")] = ("after", b.uuid(), d["lsn"])
    r.start()                                            # the replica, under its new uuid
    assert r.uuid() != old
    acked_everywhere([a, b, r], acked, 60)
    no_fork([a, b, r])
    restart_all([a, b, r])
