"""Scripted simulation scenarios: the id-remapping cases that are easy to get wrong.

Each test drives the real NodeCore through the harness (tests/sim/harness.py) with a
fixed seed, under the checkers that run after every tick (tests/sim/checkers.py), and
then asserts the behaviour its name states: which id each node gives each member, whose
rows arrive where and exactly once, and that the cluster converges. A bug the simulation
finds is pinned as a strict xfail saying where it is and what breaks, until node/ fixes it
(none is open now).
"""
from __future__ import annotations

from node.cluster_space.table import STATE_ANON, STATE_EXPELLED
from node.core.rows import GROUP_LOCAL
from tests.sim.liveness import check_converged
from tests.sim.harness import KV, LOC, Cluster


# --- helpers ---------------------------------------------------------------------------
def form(c: Cluster, *names: str) -> None:
    """The first name bootstraps; the others join one at a time, calmly."""
    for n in names:
        if n not in c.nodes:
            c.add_node(n)
    c.bootstrap(names[0])
    c.run_until_quiet()
    for n in names[1:]:
        c.join(n)
        c.run_until_quiet()


def form_chain(c: Cluster) -> None:
    """A, B and S formed, then linked in a chain A - B - S: S follows only B, no mesh."""
    form(c, "A", "B", "S")
    c.mesh = False
    for n in "ABS":
        c.nodes[n].peers = {"A": ["B"], "B": ["A", "S"], "S": ["B"]}[n]
    c.run_until_quiet()


def id_of(c: Cluster, holder: str, member: str) -> int | None:
    return c.nodes[holder].core.table.id_of(c.nodes[member].uuid)


def ids(c: Cluster, holder: str) -> dict[str, int]:
    """holder's _cluster by member name."""
    t = c.nodes[holder].core.table
    return {n.name: t.id_of(n.uuid) for n in c.nodes.values() if t.id_of(n.uuid) is not None}


def rows_of(c: Cluster, holder: str, origin: str) -> list[int]:
    """lsns of origin's rows that holder has: from its snapshot, then its WAL, in order."""
    h, o = c.nodes[holder], c.nodes[origin]
    out = list(range(1, c.checker.tracks[holder].first.get(o.uuid, 0) + 1))
    for entry in h.wal[:h.durable]:
        for t in entry:
            if t.group != GROUP_LOCAL and h.state.table.uuid_of(t.replica_id) == o.uuid:
                out.extend(range(t.lsn, t.last_lsn + 1))
    return out


def record_origin(c: Cluster, holder: str, key: str, space: str = KV) -> str | None:
    h = c.nodes[holder]
    rec = h.state.data[space].get(key)
    if rec is None:
        return None
    u = h.state.table.uuid_of(rec[1])
    return c.by_uuid[u].name if u in c.by_uuid else u


def case_a(c: Cluster) -> None:
    """The reference's case (a): A and B in master-master; with A-B cut, C joins through A
    and D through B at once, so each master gives its joiner id 3; then the cut heals."""
    form(c, "A", "B")
    c.add_node("C")
    c.add_node("D")
    c.partition(["A", "C"], ["B", "D"])
    c.join("C", via="A")
    c.join("D", via="B")
    c.run_until(lambda: c.nodes["C"].ready and c.nodes["D"].ready and not c.nodes["C"].proc
                and not c.nodes["D"].proc, what="C and D joined")
    c.run(5)


# --- the reference's case (a) ---------------------------------------------------------
def test_case_a_concurrent_joins_get_id_3_each_and_are_remapped_after_the_cut_heals(make_cluster):
    c = make_cluster(11)
    case_a(c)
    assert id_of(c, "A", "C") == 3 and c.nodes["C"].core.self_id == 3
    assert id_of(c, "B", "D") == 3 and c.nodes["D"].core.self_id == 3
    for i in range(3):                       # rows written while the masters disagree on id 3
        c.put("C", f"c{i}")
        c.put("D", f"d{i}")
        c.run(1)
    c.heal()
    c.run_until_quiet()
    for i in range(3, 6):
        c.put("C", f"c{i}")
        c.put("D", f"d{i}")
        c.run(1)
    c.run_until_quiet()

    assert ids(c, "A") == {"A": 1, "B": 2, "C": 3, "D": 4}
    assert ids(c, "B") == {"A": 1, "B": 2, "D": 3, "C": 4}
    assert ids(c, "C") == {"A": 1, "B": 2, "C": 3, "D": 4}
    assert ids(c, "D") == {"A": 1, "B": 2, "D": 3, "C": 4}
    for origin in "CD":
        n_rows = c.nodes[origin].core.vclock_by_uuid()[c.nodes[origin].uuid]
        for holder in "ABCD":
            # every row of the origin, exactly once, in order, under the origin's uuid
            assert rows_of(c, holder, origin) == list(range(1, n_rows + 1)), (holder, origin)
            for i in range(6):
                assert record_origin(c, holder, f"{origin.lower()}{i}") == origin, (holder, origin, i)
    check_converged(c)


def test_power_off_after_case_a_restores_maps_and_converges_with_right_origins(make_cluster):
    c = make_cluster(12)
    case_a(c)
    c.heal()
    c.run_until_quiet()
    before = {n: ids(c, n) for n in "ABCD"}
    c.sync_p = 0.3
    for i in range(4):
        for n in "ABCD":
            c.put(n, f"{n.lower()}{i}")
        c.run(1)
    for n in "ABCD":                        # submitted, not written: lost by the power-off
        c.put(n, f"{n.lower()}-lost")
    for n in "ABCD":
        c.crash(n)
    assert c.stats["lost_entries"] >= 4
    for n in "ABCD":
        c.restart(n)
        assert ids(c, n) == before[n], n    # `_cluster` and its ids come back from the WAL
        assert not c.nodes[n].core.peers    # maps are rebuilt from greetings, not guessed
    c.sync_p = 0.8
    for i in range(4, 8):
        for n in "ABCD":
            c.put(n, f"{n.lower()}{i}")
        c.run(1)
    c.settle()
    check_converged(c)
    for holder in "ABCD":
        for origin in "ABCD":
            for i in range(8):
                rec = record_origin(c, holder, f"{origin.lower()}{i}")
                # a key lost in the power-off may be missing, but never mis-attributed
                assert rec in (origin, None), (holder, origin, i, rec)
            assert record_origin(c, holder, f"{origin.lower()}7") == origin


# --- joins ------------------------------------------------------------------------------
def test_two_joins_under_write_load_receive_every_row(make_cluster):
    c = make_cluster(13)
    form(c, "A", "B", "C")
    c.add_node("D")
    c.add_node("E")
    during = 0
    for tick in range(60):
        for n in "ABCDE":
            if c.put(n, f"k{c.rng.randrange(4)}") and tick >= 5 and c.nodes["D"].proc:
                during += 1
        if tick == 5:
            c.join("D", via="B")
            c.join("E", via="C")
        c.tick()
    assert not c.nodes["D"].proc and not c.nodes["E"].proc
    assert during > 0
    c.settle()
    check_converged(c)
    for joiner in "DE":
        snap = c.checker.tracks[joiner].first
        for origin in "ABC":
            # part of each origin's history came in the snapshot, the rest streamed after
            assert snap.get(c.nodes[origin].uuid, 0) < len(rows_of(c, joiner, origin)), (joiner, origin)


def test_chain_topology_relays_rows_and_ids_hop_by_hop(make_cluster):
    """C-A-B-D, each subscribing only to its neighbours, with C and D both id 3 at their
    donors: C's rows reach D through two relays that know C by different ids."""
    c = make_cluster(14)
    c.mesh = False
    for n in "ABCD":
        c.add_node(n)
    c.bootstrap("A")
    c.join("B", via="A")
    c.nodes["A"].peers, c.nodes["B"].peers = ["B"], ["A"]
    c.run_until(lambda: c.nodes["B"].ready and not c.nodes["B"].proc, what="B joined")
    c.run_until_quiet()
    c.partition(["A", "C"], ["B", "D"])
    c.join("C", via="A")
    c.join("D", via="B")
    c.run_until(lambda: all(c.nodes[n].ready and not c.nodes[n].proc for n in "CD"), what="C, D joined")
    c.nodes["C"].peers, c.nodes["A"].peers = ["A"], ["C", "B"]
    c.nodes["B"].peers, c.nodes["D"].peers = ["A", "D"], ["B"]
    c.heal()
    c.run_until_quiet()
    for i in range(4):
        c.put("C", f"c{i}")
        c.put("D", f"d{i}")
        c.run(2)
    c.run_until_quiet()
    check_converged(c)
    assert (id_of(c, "A", "C"), id_of(c, "B", "C"), id_of(c, "D", "C")) == (3, 4, 4)
    assert (id_of(c, "B", "D"), id_of(c, "A", "D"), id_of(c, "C", "D")) == (3, 4, 4)
    n_c = c.nodes["C"].core.vclock_by_uuid()[c.nodes["C"].uuid]
    n_d = c.nodes["D"].core.vclock_by_uuid()[c.nodes["D"].uuid]
    assert rows_of(c, "D", "C") == list(range(1, n_c + 1))
    assert rows_of(c, "C", "D") == list(range(1, n_d + 1))
    assert c.nodes["D"].core.peers[c.nodes["B"].uuid].map.to_local[4] == id_of(c, "D", "C")
    for i in range(4):
        assert record_origin(c, "D", f"c{i}") == "C" and record_origin(c, "C", f"d{i}") == "D"


def test_a_direct_peer_never_heard_of_is_registered_from_its_greeting(make_cluster):
    """With A-B cut, J joins through A; B first meets J when it subscribes to J: B registers
    J from J's greeting (own `_cluster` row first) and takes J's rows straight away."""
    c = make_cluster(22)
    form(c, "A", "B")
    c.add_node("J")
    c.cut("A", "B")
    c.join("J", via="A")
    c.run_until(lambda: c.nodes["J"].ready and not c.nodes["J"].proc, what="J joined")
    for i in range(3):
        c.put("J", f"j{i}")
        c.run(1)
    ju = c.nodes["J"].uuid
    c.run_until(lambda: c.nodes["B"].core.vclock_by_uuid().get(ju, 0) >= 3, what="B has J's rows")
    assert id_of(c, "B", "J") == 3 and c.stats["remote_protocol_errors"] == 0
    assert record_origin(c, "B", "j2") == "J"
    c.heal()
    c.run_until_quiet()
    check_converged(c)


# --- expel --------------------------------------------------------------------------------
def test_expelled_member_rows_are_refused_everywhere_and_its_id_is_never_reused(make_cluster):
    c = make_cluster(15)
    form(c, "A", "B", "C")
    for i in range(3):
        c.put("C", f"c{i}")
        c.run(1)
    c.run_until_quiet()
    cu = c.nodes["C"].uuid
    c_id = {n: id_of(c, n, "C") for n in "AB"}
    c.partition(["A", "B"], ["C"])           # C cannot hear of its expel yet
    c.expel("C", via="A")
    c.run_until(lambda: all(c.nodes[n].state.table.get(cu).state == STATE_EXPELLED for n in "AB"),
                what="A and B know C is expelled")
    frozen = {n: c.nodes[n].core.vclock_by_uuid()[cu] for n in "AB"}
    for i in range(3, 6):
        assert c.put("C", f"c{i}")           # C, not knowing, still writes: rows past its bound
        c.run(1)
    c.heal()
    c.run_until_quiet()
    assert c.nodes["C"].core.vclock_by_uuid()[cu] > max(frozen.values())
    for n in "AB":
        assert c.nodes[n].core.vclock_by_uuid()[cu] == frozen[n], n
        assert c.nodes[n].core.peers[cu].stats.expelled > 0, n   # they arrived and were refused
        assert record_origin(c, n, "c5") is None
    assert c.nodes["C"].appliers["A"].refused == "expelled"       # relays refuse C's SUBSCRIBE
    assert c.put("C", "c6") is None and c.stats["refused_expelled_writes"] == 1   # C knows it now

    c.add_node("E")
    c.join("E", via="B")
    c.run_until(lambda: c.nodes["E"].ready and not c.nodes["E"].proc, what="E joined")
    c.run_until_quiet()
    for n in "ABE":
        t = c.nodes[n].core.table
        assert t.get(cu).state == STATE_EXPELLED and t.id_of(cu) == (c_id.get(n) or t.id_of(cu))
        assert id_of(c, n, "E") != t.id_of(cu), n
    assert id_of(c, "A", "E") == 4 and id_of(c, "B", "E") == 4
    check_converged(c)


# --- `_cluster` rows through a third node ----------------------------------------------------
def test_cluster_row_relayed_by_a_third_node_teaches_only_its_origin_ids(make_cluster):
    """S subscribes only to B. A's `_cluster` row "C = 4" reaches S through B, where 4 is D:
    S records what A said, maps B's ids from B's own rows, and attributes rows correctly."""
    c = make_cluster(16)
    form_chain(c)
    c.add_node("C")
    c.add_node("D")
    c.partition(["A", "C"], ["B", "D", "S"])
    c.join("C", via="A")
    c.join("D", via="B")
    c.run_until(lambda: all(c.nodes[n].ready and not c.nodes[n].proc for n in "CD"), what="C, D joined")
    c.nodes["C"].peers = ["A", "B", "D"]
    c.nodes["D"].peers = ["A", "B", "C"]
    c.nodes["A"].peers += ["C", "D"]
    c.nodes["B"].peers += ["C", "D"]
    c.run_until(lambda: id_of(c, "S", "D") is not None, what="S learns D")
    assert id_of(c, "S", "D") == 4                  # learned from B while A was cut off
    c.heal()
    c.run_until_quiet()
    for i in range(3):
        c.put("C", f"c{i}")
        c.put("D", f"d{i}")
        c.run(1)
    c.run_until_quiet()
    check_converged(c)
    assert (id_of(c, "A", "C"), id_of(c, "A", "D")) == (4, 5)
    assert (id_of(c, "B", "D"), id_of(c, "B", "C")) == (4, 5)
    s = c.nodes["S"].core
    assert s.knowledge[(c.nodes["A"].uuid, c.nodes["C"].uuid)] == 4    # what A said, kept as A's
    b_map = s.peers[c.nodes["B"].uuid].map.to_local
    assert b_map[4] == id_of(c, "S", "D") and b_map[5] == id_of(c, "S", "C")
    for i in range(3):
        assert record_origin(c, "S", f"c{i}") == "C" and record_origin(c, "S", f"d{i}") == "D"


# --- anonymous replicas ------------------------------------------------------------------------
def anon_with_clash(c: Cluster) -> int:
    """A, B masters; R fetches a snapshot through A and takes id 3 for itself; then C joins
    and the masters give C id 3 too. Returns how many local rows R wrote."""
    form(c, "A", "B")
    c.add_node("R", anon=True)
    c.fetch_anon("R", via="A")
    c.run_until(lambda: c.nodes["R"].ready and not c.nodes["R"].proc, what="R fetched")
    c.run_until_quiet()
    for i in range(3):
        assert c.txn("R", [("put", LOC, f"l{i}")])
        c.run(1)
    c.run_until_quiet()
    local_rows = c.nodes["R"].core.vclock.get(0)
    c.add_node("C")
    c.join("C", via="A")
    c.run_until(lambda: c.nodes["C"].ready and not c.nodes["C"].proc, what="C joined")
    for i in range(3):
        c.put("C", f"c{i}")
        c.run(1)
    c.run_until_quiet()
    return local_rows


def test_anonymous_replica_keeps_its_local_id_apart_from_a_new_member_with_that_id(make_cluster):
    c = make_cluster(17)
    local_rows = anon_with_clash(c)
    r = c.nodes["R"]
    assert r.core.anon and r.core.self_id == 3
    assert id_of(c, "A", "C") == 3 and id_of(c, "B", "C") == 3
    assert id_of(c, "R", "C") == 4                             # remapped around R's own id
    assert r.core.peers[c.nodes["A"].uuid].map.to_local[3] == 4
    assert id_of(c, "A", "R") is None and id_of(c, "B", "R") is None   # masters never list R
    assert r.core.table.get(r.uuid).state == STATE_ANON
    assert r.core.vclock.get(0) == local_rows and sorted(r.state.data[LOC]) == ["l0", "l1", "l2"]
    assert c.put("R", "nope") is None                          # replicated writes are refused
    for i in range(3):
        assert record_origin(c, "R", f"c{i}") == "C"
    check_converged(c)


def test_anonymous_replica_registers_and_keeps_its_rows(make_cluster):
    c = make_cluster(18)
    local_rows = anon_with_clash(c)
    c.register_anon("R", via="B")
    c.run_until(lambda: not c.nodes["R"].proc, what="R registered")
    c.run_until_quiet()
    r = c.nodes["R"]
    assert not r.core.anon and r.core.self_id == 3
    assert id_of(c, "A", "R") == 4 and id_of(c, "B", "R") == 4   # the masters' ids for R
    for i in range(3):
        assert c.put("R", f"r{i}")
        c.run(1)
    c.run_until_quiet()
    check_converged(c)
    assert r.core.vclock.get(0) == local_rows and sorted(r.state.data[LOC]) == ["l0", "l1", "l2"]
    for n in "ABC":
        for i in range(3):
            assert record_origin(c, n, f"r{i}") == "R", (n, i)


# --- bugs the simulation found: each scenario pins the fix (open ones are xfail strict) ---------
def test_a_txn_that_writes_one_key_twice_keeps_its_last_op(make_cluster):
    c = make_cluster(19)
    form(c, "A", "B")
    c.txn("A", [("put", KV, "k", {"by": c.nodes["A"].uuid, "v": 1}),
                ("put", KV, "k", {"by": c.nodes["A"].uuid, "v": 2})])
    c.txn("A", [("delete", KV, "gone"), ("put", KV, "gone", {"by": c.nodes["A"].uuid, "v": 3})])
    c.run_until_quiet()
    check_converged(c)
    for n in "AB":
        assert c.nodes[n].state.data[KV]["k"][0]["v"] == 2, n
        assert c.nodes[n].state.data[KV]["gone"][4] is False, n


def test_a_joiner_orders_its_writes_after_the_records_of_its_snapshot(make_cluster):
    c = make_cluster(20)
    form(c, "A", "B")
    c.nodes["A"].skew_us = 40_000          # A's clock runs 40 ms ahead of C's
    c.put("A", "k")
    c.run_until_quiet()
    c.add_node("C").skew_us = -40_000
    c.join("C", via="A")
    c.run_until(lambda: c.nodes["C"].ready and not c.nodes["C"].proc, what="C joined")
    assert record_origin(c, "C", "k") == "A"  # C has seen A's value
    c.put("C", "k")                           # checker 9 fails here while the bug stands
    c.run_until_quiet()
    for n in "ABC":
        assert record_origin(c, n, "k") == "C", n


def test_expel_leaves_every_member_with_the_same_rows_of_the_expelled(make_cluster):
    """X writes k while B is cut off; A applies it; B, still cut off, expels X. After
    the heal A keeps X's value of k and B refuses it for ever."""
    c = make_cluster(23)
    form(c, "A", "B", "X")
    c.partition(["A", "X"], ["B"])
    c.put("X", "k")
    xu = c.nodes["X"].uuid
    c.run_until(lambda: record_origin(c, "A", "k") == "X", what="A has X's write")
    c.expel("X", via="B")
    c.run(5)
    c.heal()
    c.run_until_quiet()
    assert record_origin(c, "A", "k") == record_origin(c, "B", "k")
    assert c.nodes["A"].core.vclock_by_uuid().get(xu) == c.nodes["B"].core.vclock_by_uuid().get(xu)


def test_an_expel_made_by_a_member_later_expelled_reaches_every_member(make_cluster):
    """E expels B while cut off with H, which joins through E (its snapshot lists B as
    expelled); C then expels E. E's `_cluster` row expelling B is refused by A and C for
    ever, so A and C keep B as a member and apply its rows while H refuses them."""
    c = make_cluster(24)
    form(c, "A", "B", "C", "E")
    c.add_node("H")
    c.partition(["E", "H"], ["A", "B", "C"])
    c.expel("B", via="E")
    c.join("H", via="E")
    c.run_until(lambda: c.nodes["H"].ready and not c.nodes["H"].proc, what="H joined")
    c.expel("E", via="C")
    c.run(5)
    c.heal()
    c.run_until_quiet()
    bu = c.nodes["B"].uuid
    assert {n: c.nodes[n].core.table.get(bu).state for n in "ACH"} == {n: STATE_EXPELLED for n in "ACH"}


def test_no_link_drops_when_a_cluster_row_first_arrives_through_a_third_node(make_cluster):
    c = make_cluster(21)
    form(c, "A", "B", "D")
    c.run_until_quiet()
    c.slow[("D", "A")] = 12                # D <- A is slow; D <- B is fast
    c.add_node("X")
    c.join("X", via="B")
    c.run_until(lambda: c.nodes["X"].ready and not c.nodes["X"].proc, what="X joined")
    c.run_until_quiet()
    for i in range(3):
        c.put("X", f"x{i}")
        c.run(1)
    c.run_until_quiet()
    check_converged(c)
    assert c.stats["remote_protocol_errors"] == 0


def test_an_applier_that_drops_a_link_mid_message_loses_no_claimed_rows(make_cluster):
    """Plain txns of one ROWS message are claimed and held to share one frame; a malformed
    txn later in the same message drops the link. The claimed ones must still be written:
    otherwise the node skips them as duplicates for ever and applies later rows across a gap."""
    c = make_cluster(25)
    c.delay_max, c.relay_batch_max = 0, 0    # deterministic: no delays, relays send all they have
    c.write_p = c.sync_p = 1.0
    form(c, "A", "B", "D")
    c.run_until_quiet()
    c.slow[("D", "A")] = c.slow[("D", "B")] = 5
    for i in range(3):
        c.put("A", f"a{i}")                  # several plain txns, queued for one message to D
    c.garble_next_rows.add(("D", "A"))
    c.run_until(lambda: c.stats["remote_protocol_errors"] > 0, what="D <- A drops on the malformed txn")
    c.slow.clear()
    c.put("A", "after")                      # checker 4 fails if a claimed row was never written
    c.run_until_quiet()
    check_converged(c)
