"""Membership paths never lose or fork acknowledged writes (issue 16), on real processes:
rejoin (need_rejoin with rows only this node has), a store rebuilt from its identity file,
WAL collection around a member that is down or has just joined. Each test ends with the
oracles of tests/integration/oracles.py: no_fork, acked_everywhere, restart_all."""
from __future__ import annotations

import os
import re
import shutil

from node.wal.reader import list_segments, read_header
from tests.integration.harness import ReplogProcess, mesh, mesh_nodes, wait_for
from tests.integration.oracles import (Acked, acked_everywhere, downstreams_of, log_since_last_start,
                                       lose_store_and_rejoin, no_fork, replicated_spaces, restart_all, upstream)


# Small WAL segments and frequent checkpoints: a few hundred writes make a node collect its WAL.
SMALL = ["--segment-bytes-max", "4096", "--checkpoint-interval-s", "0.3", "--anon-ttl-s", "1.5"]


def started(procs: list, tmp_path, name: str, **kw) -> ReplogProcess:
    """A node started (healthy) and registered for the kill at the end."""
    p = ReplogProcess(tmp_path, name, **kw)
    procs.append(p)
    return p.start()


# --- D1: a rejoin never wipes rows that no other member has --------------------------------------

def fill(node: ReplogProcess, acked: Acked, prefix: str, n: int, space: str = "kv") -> None:
    """n acknowledged writes of ~100 bytes each (a 4 KiB segment holds ~25)."""
    for i in range(n):
        acked.put(node, space, f"{prefix}{i}", prefix + "x" * 100)


def gc_past(node: ReplogProcess, component: str, lsn: int) -> bool:
    """The node's oldest kept WAL segment starts past `lsn` of its component `component` (its ids)."""
    return node.info()["wal"]["gc_vclock"].get(component, 0) > lsn


def keeps_its_rows_until_the_upstream_has_them(d: ReplogProcess, a: ReplogProcess, mine: list[int],
                                               a_peers: list[ReplogProcess], acked: Acked,
                                               nodes: list[ReplogProcess]) -> None:
    """D, holding rows `mine` (its own lsns) that A lacks, was just linked to A, which collected
    rows D needs. D is told need_rejoin and keeps its rows (serving them) until A pulls them
    (A's peers become `a_peers`); then D rejoins from A on its own, with every row, and its next
    write follows its own last lsn."""
    du = wait_for(lambda: d.uuid(), 30, f"{d.name} answering")

    def refused_naming_own_rows() -> bool:
        up = upstream(d, a.address)
        return up.get("status") == "need_rejoin" and du in up.get("error", "")
    try:        # (on a node that wipes its store at need_rejoin, wait for the wipe to be done)
        wait_for(lambda: refused_naming_own_rows() or "node: rejoined" in d.log_text(), 30,
                 f"{d.name} told need_rejoin by {a.name}, its upstream naming the rows {a.name} lacks")
    except AssertionError as e:
        raise AssertionError(f"{e}: upstream {upstream(d, a.address)}") from None
    for i, lsn in enumerate(mine):
        got = d.get(f"/v1/spaces/kv/keys/{d.name}-own-{i}")
        assert got[0] == 200 and got[1]["lsn"] == lsn, \
            f"{d.name} lost its row {d.name}-own-{i} (held by no other member) on need_rejoin: {got}"
    assert refused_naming_own_rows(), upstream(d, a.address)
    assert d.kv_get("kv", "from-a")[0] == 200, f"{d.name} still serves reads"

    a.set_peers(a_peers)                                  # A takes D's rows; then D may rejoin from A
    wait_for(lambda: upstream(d, a.address).get("status") == "follow", 60, f"{d.name} rejoined from A and follows it")
    assert "rejoin" in d.log_text()
    acked_everywhere(nodes, acked)
    nxt = acked.put(d, "kv", f"{d.name}-after", 1)["lsn"]
    assert nxt == mine[-1] + 1, f"{d.name}'s next write is lsn {nxt}; its own rows went to {mine[-1]}"
    acked_everywhere(nodes, acked)
    no_fork(nodes)
    restart_all(nodes)


def test_a_member_cut_off_in_a_chain_is_held_by_the_node_it_never_followed_and_loses_nothing(tmp_path, procs):
    """A - B - D, A and D never linked. D takes 10 writes while cut off; A writes enough to
    collect its WAL many times over. On ecff09e A collected past D's position (D never
    subscribed to A), and D linked to A was told to rejoin and wiped its 10 rows. Every
    registered member holds every node's WAL now (docs/replication.md, "WAL holds"): A keeps the
    rows D needs, D linked to A catches up by subscription, and its 10 rows stay its own."""
    acked = Acked()
    a = started(procs, tmp_path, "a", extra=SMALL)
    a.create_space("kv")
    b = started(procs, tmp_path, "b", peers=[a])
    d = started(procs, tmp_path, "d", peers=[b])
    a.set_peers([b])
    b.set_peers([a, d])
    du = d.uuid()
    acked.put(a, "kv", "from-a", 1)
    acked.put(d, "kv", "from-d", 1)
    acked_everywhere([a, b, d], acked)

    d.set_peers([])                                       # D cut off: no link to or from it
    b.set_peers([a])
    wait_for(lambda: not downstreams_of(b, du) and not downstreams_of(d, b.uuid()), 10, "D cut off")
    mine = [acked.put(d, "kv", f"d-own-{i}", i)["lsn"] for i in range(10)]
    d_has_of_a = d.info()["vclock_uuid"][a.uuid()]
    fill(a, acked, "a-", 300)
    wait_for(lambda: a.info()["wal"]["segments"] > 10, 30, "A wrote many segments")
    hold([a], {a.uuid(): d_has_of_a, du: 0}, "D")        # A holds its WAL for D (bounded negative check)

    d.set_peers([a])
    wait_for(lambda: upstream(d, a.address).get("status") == "follow", 30, "D follows A")
    a.set_peers([b, d])
    acked_everywhere([a, b, d], acked)
    assert "rejoin" not in d.log_text()
    assert [d.kv_get("kv", f"d-own-{i}")[1]["lsn"] for i in range(10)] == mine
    assert acked.put(d, "kv", "d-after", 1)["lsn"] == mine[-1] + 1
    no_fork([a, b, d])
    restart_all([a, b, d])


def test_node_restored_from_a_backup_keeps_rows_only_it_has_when_told_to_rejoin(tmp_path, procs):
    """D follows A (A does not follow D) and takes 10 writes only it has; its data dir is backed
    up; D then acknowledges many more of A's rows, so A collects its WAL past the backup. D
    restored from the backup is told need_rejoin by A: it keeps its 10 rows until A has them."""
    acked = Acked()
    a = started(procs, tmp_path, "a", extra=SMALL)
    a.create_space("kv")
    d = started(procs, tmp_path, "d", peers=[a])
    acked.put(a, "kv", "from-a", 1)
    acked_everywhere([d], acked)
    mine = [acked.put(d, "kv", f"d-own-{i}", i)["lsn"] for i in range(10)]
    assert d.stop() == 0
    backup = str(tmp_path / "d-backup")
    shutil.copytree(d.data_dir, backup)
    d.start()
    d_had_of_a = d.info()["vclock_uuid"][a.uuid()]
    fill(a, acked, "a-", 300)
    acked_everywhere([d], acked)                          # D has (and acknowledges) them: A may collect
    wait_for(lambda: gc_past(a, "1", d_had_of_a + 50), 30, "A collected its WAL past the backup's position")
    assert d.stop() == 0
    shutil.rmtree(d.data_dir)
    shutil.copytree(backup, d.data_dir)
    d.start(wait=False)
    keeps_its_rows_until_the_upstream_has_them(d, a, mine, [d], acked, [a, d])


def test_anonymous_replica_rejoining_after_its_ttl_keeps_its_local_space_rows(tmp_path, procs):
    acked = Acked()
    a = started(procs, tmp_path, "a", extra=SMALL)
    a.create_space("kv")
    r = started(procs, tmp_path, "r", peers=[a], extra=["--anon"])
    ru = r.uuid()
    acked.put(a, "kv", "first", 1)
    acked_everywhere([a, r], acked)
    r.create_space("loc", local=True)
    local = {f"l{i}": r.kv_put("loc", f"l{i}", i)["lsn"] for i in range(10)}
    wait_for(lambda: ru in {x["uuid"] for x in a.info()["downstreams"]}, 10, "replica subscribed")
    r_has = r.info()["vclock_uuid"][a.uuid()]
    r.set_peers([])                                       # gone longer than anon_ttl_s (1.5 s)
    wait_for(lambda: not downstreams_of(a, ru), 10, "replica disconnected")
    fill(a, acked, "a-", 300)
    wait_for(lambda: gc_past(a, "1", r_has + 50), 30, "A collected its WAL past the replica's position")
    r.set_peers([a])
    acked_everywhere([a, r], acked, 60)
    assert "rejoin" in r.log_text(), "the replica was told to rejoin"
    for k, lsn in local.items():
        got = r.kv_get("loc", k)
        assert got[0] == 200 and got[1]["lsn"] == lsn, f"the replica lost its local row {k} in the rejoin: {got}"
    no_fork([a, r])
    restart_all([a, r])


# --- D2: a node rebuilt from its identity file never reuses its own lsns --------------------------

def rebuilt_from_identity(tmp_path, procs) -> tuple[ReplogProcess, ReplogProcess, ReplogProcess, Acked, int]:
    """Masters A, B, C. A stops; C takes 30 writes that only B gets; B stops; C loses its store
    and WAL (keeping its identity file); A starts; C starts again and rejoins through A, which
    lacks those 30 rows. Returns (a, b, c, acked, C's last lsn before the loss), B down."""
    acked = Acked()
    a, b, c = mesh(tmp_path, 3)
    procs.extend([a, b, c])
    a.create_space("kv")
    wait_for(lambda: all("kv" in replicated_spaces(n) for n in (b, c)), 20, "space everywhere")
    for n in (a, b, c):
        acked.put(n, "kv", f"early-{n.name}", n.name)
    acked_everywhere([a, b, c], acked)
    assert a.stop() == 0
    c_last = [acked.put(c, "kv", f"c-{i}", i)["lsn"] for i in range(30)][-1]
    acked_everywhere([b, c], acked)
    assert b.stop() == 0
    lose_store_and_rejoin(c, a)
    return a, b, c, acked, c_last


def write_answer(node: ReplogProcess, key: str) -> tuple[int, dict]:
    """A write's answer once the node is past its start-up (not_ready, catching_up)."""
    def answered():
        s, d = node.put(f"/v1/spaces/kv/keys/{key}", key)
        code = d.get("error", {}).get("code") if s != 200 else None
        return None if code in ("not_ready", "catching_up") else (s, d)
    return wait_for(answered, 30, f"{node.name} answers a write")


def test_node_rebuilt_from_its_identity_waits_for_its_own_rows_before_writing(tmp_path, procs):
    """C, rebuilt from its identity file, must not write under its uuid while B (which may hold
    more of C's rows) is down: 503 own_rows_unconfirmed naming B; local spaces stay writable.
    Once B is back, C has its rows again and its next lsn follows them."""
    a, b, c, acked, c_last = rebuilt_from_identity(tmp_path, procs)
    bu = next(u for u, m in a.cluster().items() if m["address"] == b.address)
    s, d = write_answer(c, "while-b-down")
    assert s == 503 and d["error"]["code"] == "own_rows_unconfirmed", \
        f"C wrote under its own uuid while B, holding C's rows up to lsn {c_last}, was down: {s} {d}"
    assert bu in d["error"]["message"] or b.address in d["error"]["message"], d
    c.create_space("cloc", local=True)                   # local spaces are C's alone: writable
    c.kv_put("cloc", "local-1", 1)
    s, d = c.put("/v1/spaces/kv/keys/still-down", 1)
    assert s == 503 and d["error"]["code"] == "own_rows_unconfirmed", (s, d)

    b.start()
    acked_everywhere([a, b, c], acked, 60)              # C's 30 rows came back from B
    s, d = write_answer(c, "after-b")
    assert s == 200 and d["lsn"] > c_last, f"C's next lsn {d.get('lsn')}: its rows went to {c_last} ({s} {d})"
    acked.writes[("kv", "after-b")] = ("after-b", c.uuid(), d["lsn"])
    acked_everywhere([a, b, c], acked)
    no_fork([a, b, c])
    restart_all([a, b, c])


def test_node_rebuilt_from_its_identity_writes_again_once_the_silent_member_is_expelled(tmp_path, procs):
    """The way out when B is gone for good: expel it; C then takes writes again."""
    a, b, c, acked, c_last = rebuilt_from_identity(tmp_path, procs)
    bu = next(u for u, m in a.cluster().items() if m["address"] == b.address)
    s, d = write_answer(c, "while-b-down")
    assert s == 503 and d["error"]["code"] == "own_rows_unconfirmed", \
        f"C wrote under its own uuid while B, holding C's rows up to lsn {c_last}, was down: {s} {d}"
    s, d = a.delete(f"/v1/cluster/{bu}")                # the documented way out: B is gone for good
    assert s == 200, (s, d)
    # C's 30 rows went with B: expelling B gives them up; nothing else acknowledged may go.
    for k in [k for k in acked.writes if k[1].startswith("c-")]:
        del acked.writes[k]

    def written():
        s, d = c.put("/v1/spaces/kv/keys/after-expel", 1)
        return d if s == 200 else None
    d = wait_for(written, 30, "C accepts writes once B is expelled")
    acked.writes[("kv", "after-expel")] = (1, c.uuid(), d["lsn"])
    acked_everywhere([a, c], acked)
    no_fork([a, c])
    restart_all([a, c])


# --- D4: collection never outruns a member that is only briefly down -----------------------------

def segment_starts(node: ReplogProcess, pos: dict[str, int], n: int = 3) -> tuple[dict, list[dict]]:
    """`pos` (a vclock by uuid) in the node's ids, and the start vclocks of its n oldest segments."""
    ids = {u: mem["id"] for u, mem in node.cluster().items()}
    wal = os.path.join(node.data_dir, "wal")
    starts = [read_header(os.path.join(wal, x)).vclock for x in list_segments(wal)[:n]]  # a removal
    return {ids[u]: lsn for u, lsn in pos.items() if u in ids}, starts                   # races: retried


def past(start: dict[int, int], pos: dict[int, int]) -> bool:
    return any(lsn > pos.get(rid, 0) for rid, lsn in start.items() if rid != 0)


def collected_up_to(node: ReplogProcess, pos: dict[str, int]) -> bool:
    """Every WAL segment wholly below `pos` is gone: the oldest or second oldest starts past it."""
    mine, starts = segment_starts(node, pos, 2)
    return any(past(v, mine) for v in starts)


def collected_past(node: ReplogProcess, pos: dict[str, int]) -> bool:
    """Rows right after `pos` are gone from the node's WAL: its oldest segment starts past pos."""
    mine, starts = segment_starts(node, pos, 1)
    return bool(starts) and past(starts[0], mine)


def wait_collected_up_to(nodes: list[ReplogProcess], pos: dict[str, int], whose: str) -> None:
    """Each node collects what lies wholly below `pos` (what it may, if it holds pos for `whose`)."""
    for n in nodes:
        try:
            wait_for(lambda: collected_up_to(n, pos), 30, f"{n.name} collected its WAL up to {whose}")
        except AssertionError as e:
            mine, starts = segment_starts(n, pos)
            raise AssertionError(f"{e}: {whose} at {mine}; {n.name}'s oldest segments start at {starts}") from None


def hold(nodes: list[ReplogProcess], pos: dict[str, int], whose: str) -> None:
    """None of `nodes` collects its WAL past `pos` within 3 s (ten checkpoint intervals of SMALL):
    a negative check, the one bounded wait of the tests that use it."""
    try:
        n = wait_for(lambda: next((n for n in nodes if collected_past(n, pos)), None), 3, "a collection past pos")
    except AssertionError as e:
        if "timed out" not in str(e):
            raise
        return
    mine, starts = segment_starts(n, pos)
    raise AssertionError(f"{n.name} collected its WAL past {whose}'s position {mine} (its oldest segments "
                         f"start at {starts}): {whose} would be told to rejoin")


def acknowledged_to(victim: ReplogProcess, pos: dict[str, int], nodes: list[ReplogProcess]) -> None:
    """Each of `nodes` shows `victim`'s downstream with `pos` or more on disk (`durable`, what
    its hold moves by; what it applied may be ahead: a victim killed then holds the WAL below)."""
    vu = victim.uuid()
    for n in nodes:
        ids = {u: mem["id"] for u, mem in n.cluster().items()}
        want = {str(ids[u]): lsn for u, lsn in pos.items()}
        wait_for(lambda: any(all(d["durable"].get(k, 0) >= v for k, v in want.items())
                             for d in downstreams_of(n, vu)), 10, f"{victim.name} acknowledged {pos} to {n.name}")


def links_settled(nodes: list[ReplogProcess], missing: set[tuple[str, str]] = frozenset()) -> bool:
    """Every node follows every other (but the (follower, upstream) pairs in `missing`)."""
    for n in nodes:
        following = {u["uuid"] for u in n.info()["upstreams"] if u["status"] == "follow"}
        want = {m.uuid() for m in nodes if m is not n and (n.name, m.name) not in missing}
        if not want <= following:
            return False
    return True


def test_member_killed_and_restarted_within_seconds_is_never_told_to_rejoin(tmp_path, procs):
    """Five masters; three times one is killed (-9) while the others write and collect their WAL,
    then restarted: no member collects past its position, and it catches up by SUBSCRIBE, never
    told to rejoin. The first victim subscribes to one member (X) for the first time and dies
    before its first acknowledgement (an idle relay's first message comes after a second): X
    must hold its WAL from that SUBSCRIBE, whatever ACKs said."""
    acked = Acked()
    nodes = mesh_nodes(tmp_path, 5, extra=SMALL, lists=lambda i, j: (i, j) != (4, 0))
    procs.extend(nodes)
    # n1 founds the cluster before the others start: n5 does not list n1, so started all at once
    # n5 could see only fresh peers, have the lowest uuid among them and found a second cluster.
    n1_peers, nodes[0].peers = nodes[0].peers, []
    nodes[0].start()
    for n in nodes[1:4]:
        n.start(wait=False)
    for n in nodes[1:4]:
        n.wait_healthy(60)
    nodes[4].start()
    nodes[0].peers = n1_peers
    nodes[0].set_peers(n1_peers)
    x, first = nodes[0], nodes[4]                 # n5 does not follow n1 until round 0
    x.create_space("kv")
    wait_for(lambda: all("kv" in replicated_spaces(n) for n in nodes), 20, "space everywhere")
    for n in nodes:
        fill(n, acked, f"{n.name}-", 20)
    for rnd, victim in enumerate((first, nodes[1], nodes[3])):
        others = [n for n in nodes if n is not victim]
        no_ack = {x.name} if rnd == 0 else set()          # members the victim never acknowledges
        wait_for(lambda: links_settled(nodes, {(first.name, x.name)} if rnd == 0 else set()), 30, "links up")
        for n in nodes:                           # rows past every subscription: acknowledged, not assumed
            acked.put(n, "kv", f"{n.name}-mark-{rnd}", rnd)
        acked_everywhere(nodes, acked)
        pos = victim.info()["vclock_uuid"]
        acknowledged_to(victim, pos, [n for n in others if n.name not in no_ack])
        if rnd == 0:                              # the cluster is idle: X's relay sends nothing for 1 s
            victim.set_peers(others)
            wait_for(lambda: upstream(victim, x.address).get("status") == "follow", 10, "n5 subscribed to X",
                     interval=0.01)
        victim.kill9()
        for n in others:
            fill(n, acked, f"{n.name}-r{rnd}-", 60)
        wait_collected_up_to([n for n in others if n.name not in no_ack], pos, victim.name)
        hold(others, pos, victim.name)
        # The first victim comes back following X alone, so its SUBSCRIBE to X carries the
        # position it died at (it cannot catch up from the others first).
        victim.peers = [x.address] if rnd == 0 else [n.address for n in others]
        victim.start()
        after = {(first.name, n.name) for n in others if n is not x} if rnd == 0 else set()
        wait_for(lambda: "rejoin" in log_since_last_start(victim) or links_settled(nodes, after), 30,
                 f"{victim.name} back: following its peers, or told to rejoin")
        log = log_since_last_start(victim)
        assert "rejoin" not in log, f"{victim.name}, down for seconds, was told to rejoin: " + \
            next(line for line in log.splitlines() if "rejoin" in line)
        assert victim.info()["status"] == "running"
        if rnd == 0:
            victim.set_peers(others)
        acked_everywhere(nodes, acked, 60)
    no_fork(nodes)
    restart_all(nodes)


# --- D5: a member holds the donor's WAL from its JOIN on, across restarts ------------------------

def test_member_gone_right_after_its_join_catches_up_by_subscribe(tmp_path, procs):
    """J joins through D, subscribes, and dies before it ever acknowledges (D sends an idle
    subscriber its first message after a second, so J never acknowledged anything): D holds its
    WAL from J's SUBSCRIBE. D writes on, restarts (kill -9: the hold must be on disk), writes on
    and collects its WAL. J comes back and catches up by SUBSCRIBE with every row of D. (J killed
    before its SUBSCRIBE reaches D holds all D's WAL from the JOIN on, more than `pos`: the test
    waits for the SUBSCRIBE, or it raced it.)"""
    acked = Acked()
    d = started(procs, tmp_path, "d", extra=SMALL)
    d.create_space("kv")
    fill(d, acked, "pre-", 100)
    j = ReplogProcess(tmp_path, "j", peers=[d])
    procs.append(j)
    j.start(wait=False)
    ju = wait_for(lambda: (m := re.search(r"node ([0-9a-f-]{36}) listening", j.log_text())) and m.group(1), 60,
                  "J's uuid in its log")
    wait_for(lambda: any(f"member {ju} holds this node's WAL from" in line and "(it subscribed)" in line
                         for line in d.log_text().splitlines()), 60, "J joined and subscribed", interval=0.01)
    j.kill9()
    pos = d.info()["vclock_uuid"]                 # D has written nothing since J's snapshot
    fill(d, acked, "w1-", 150)
    d.kill9()
    d.start()
    fill(d, acked, "w2-", 150)
    wait_collected_up_to([d], pos, "J")
    hold([d], pos, "J")
    j.start(wait=False)
    wait_for(lambda: "rejoin" in j.log_text() or upstream(j, d.address).get("status") == "follow", 60,
             "J back: following D, or told to rejoin")
    log = log_since_last_start(j)
    assert "rejoin" not in log and "empty store and no peers" not in log, \
        "J was told to rejoin: D collected WAL it still needed: " + \
        next(line for line in log.splitlines() if "rejoin" in line or "empty store" in line)
    acked_everywhere([d, j], acked, 60)
    assert j.info()["status"] == "running"
    no_fork([d, j])
    restart_all([d, j])
