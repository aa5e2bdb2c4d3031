"""Relays between the journal's in-memory tail and the WAL file, with real processes.

A relay that is caught up sends the frames the journal just made durable from memory;
one that is behind (a restarted or a stopped subscriber) reads the WAL file, and returns
to memory once it has caught up. Either way the subscriber gets every row exactly once,
in order: `rows_sent` of the relay (its downstream entry in /v1/info) must equal the rows
the master wrote past the subscriber's position, and the subscriber must converge."""
from __future__ import annotations

import os
import signal

from node.wal.format import segment_signature
from node.wal.reader import list_segments
from tests.integration.harness import ReplogProcess, vclocks_converged, wait_for

BIG_TXN_OPS = 100
BIG_VALUE = "z" * 10_000             # a 1 MB transaction: ~100 of these, as one body
STOPPED_WRITE_BYTES = 40 << 20       # written while the subscriber is stopped: more than the tail
                                     # (4 MiB) plus what the sockets between the two can buffer


def downstream(master: ReplogProcess, uuid: str) -> dict:
    return next(d for d in master.info()["downstreams"] if d["uuid"] == uuid)


def own_lsn(node: ReplogProcess) -> int:
    info = node.info()
    return info["vclock_uuid"].get(info["uuid"], 0)


def wal_dir(node: ReplogProcess) -> str:
    return os.path.join(node.data_dir, "wal")


def segments(node: ReplogProcess) -> list[str]:
    return list_segments(wal_dir(node))


def has_lsn(node: ReplogProcess, uuid: str, lsn: int) -> bool:
    return node.info()["vclock_uuid"].get(uuid, 0) >= lsn


def all_sent(a: ReplogProcess, b: ReplogProcess, au: str, bu: str, start: int, what: str) -> dict:
    """Wait until b holds all of a's rows and a's relay to b counted exactly the rows past
    `start` (b's position when it subscribed): none twice, none left out. Its entry."""
    target = own_lsn(a)
    wait_for(lambda: has_lsn(b, au, target), 60, what)
    wait_for(lambda: downstream(a, bu)["rows_sent"] == target - start, 10,
             f"the relay to count {target - start} rows (no reconnect, no duplicate)")
    return downstream(a, bu)


def pair(tmp_path, procs, master_extra: list[str] | None = None) -> tuple[ReplogProcess, ReplogProcess, str, str]:
    """A master `a` and a member `b` that follows it, b caught up and subscribed."""
    a = ReplogProcess(tmp_path, "a", extra=master_extra).start()
    procs.append(a)
    a.create_space("kv")
    b = ReplogProcess(tmp_path, "b", peers=[a]).start()
    procs.append(b)
    au, bu = a.uuid(), b.uuid()
    a.kv_put("kv", "first", 1)
    target = own_lsn(a)
    wait_for(lambda: has_lsn(b, au, target), 20, "b caught up")
    wait_for(lambda: any(d["uuid"] == bu for d in a.info()["downstreams"]), 10, "b subscribed to a")
    return a, b, au, bu


def test_a_restarted_subscriber_reads_the_backlog_from_the_file_then_follows_from_memory(tmp_path, procs):
    a, b, au, bu = pair(tmp_path, procs)
    b.stop()
    start = own_lsn(a)                   # b has everything up to here: it subscribes from it
    for i in range(50):
        a.kv_put("kv", f"backlog{i}", "x" * 200)
    b.start()
    d = all_sent(a, b, au, bu, start, "b caught up on the backlog")
    assert d["frames_from_file"] >= 50 and d["rows_sent"] == 50
    from_file, from_memory = d["frames_from_file"], d["frames_from_memory"]
    for i in range(20):
        a.kv_put("kv", f"live{i}", "y" * 200)
    d = all_sent(a, b, au, bu, start, "b has the live rows")
    assert d["frames_from_file"] == from_file, "a caught-up relay read the file"
    assert d["frames_from_memory"] == from_memory + 20
    assert b.kv_get("kv", "backlog49")[1]["value"] == "x" * 200
    assert b.kv_get("kv", "live19")[1]["value"] == "y" * 200
    up = next(u for u in b.info()["upstreams"] if u["uuid"] == au)
    assert up["messages"]["scanned"] > 0, "plain rows reach b through the row scanner (node.core.rowscan)"
    wait_for(lambda: vclocks_converged([a, b]), 20, "converged")


def test_a_stopped_subscriber_falls_back_to_the_file_and_returns_to_memory(tmp_path, procs):
    a, b, au, bu = pair(tmp_path, procs)
    start = own_lsn(a) - downstream(a, bu)["rows_sent"]   # b's position when it subscribed
    for i in range(5):
        a.kv_put("kv", f"before{i}", 1)
    d = all_sent(a, b, au, bu, start, "b has the rows written before")
    assert d["frames_from_memory"] >= 5
    from_file = d["frames_from_file"]
    big = {"ops": [{"op": "put", "space": "kv", "key": f"big{{}}-{j}", "value": BIG_VALUE}
                   for j in range(BIG_TXN_OPS)]}
    b.proc.send_signal(signal.SIGSTOP)   # a slow subscriber: its socket fills, the relay blocks
    try:
        written = 0
        n = 0
        while written < STOPPED_WRITE_BYTES:
            body = {"ops": [dict(op, key=op["key"].format(n)) for op in big["ops"]]}
            s, r = a.post("/v1/txn", body)
            assert s == 200, (s, r)
            written += BIG_TXN_OPS * len(BIG_VALUE)
            n += 1
    finally:
        b.proc.send_signal(signal.SIGCONT)
    d = all_sent(a, b, au, bu, start, "b caught up after it was stopped")
    assert d["frames_from_file"] > from_file, "the relay left behind the tail did not read the file"
    from_memory, from_file = d["frames_from_memory"], d["frames_from_file"]
    for i in range(10):
        a.kv_put("kv", f"after{i}", 2)
    d = all_sent(a, b, au, bu, start, "b has the rows written after")
    assert d["frames_from_file"] == from_file and d["frames_from_memory"] == from_memory + 10
    assert b.kv_get("kv", f"big{n - 1}-{BIG_TXN_OPS - 1}")[1]["value"] == BIG_VALUE
    wait_for(lambda: vclocks_converged([a, b]), 20, "converged")


def test_segments_rotate_and_are_collected_while_the_relay_streams_from_memory(tmp_path, procs):
    a, b, au, bu = pair(tmp_path, procs, ["--segment-bytes-max", "4096", "--checkpoint-interval-s", "0.3"])
    start = own_lsn(a) - downstream(a, bu)["rows_sent"]
    d = downstream(a, bu)
    from_file, from_memory = d["frames_from_file"], d["frames_from_memory"]
    first_signature = segment_signature(segments(a)[-1])
    gc_before = a.info()["wal"]["gc_vclock"]
    for i in range(120):
        a.kv_put("kv", f"r{i}", "w" * 300)
    d = all_sent(a, b, au, bu, start, "b has every row")
    assert d["frames_from_file"] == from_file, "rotation sent the relay back to the file"
    assert d["frames_from_memory"] == from_memory + 120
    # Segments are named after the signature they start at. Collection may already have
    # removed the older ones, so rotation is read from names, not from counting files: the
    # newest segment starts at least 100 rows past the one current before the writes, and
    # no closed segment outgrew the cap, so those rows (~400-byte frames) spanned >= 9 segments.
    names = segments(a)
    assert segment_signature(names[-1]) >= first_signature + 100, names
    for name in names[:-1]:
        assert os.path.getsize(os.path.join(wal_dir(a), name)) <= 4096 + 1024, name
    wait_for(lambda: a.info()["wal"]["gc_vclock"] != gc_before and len(segments(a)) < 9, 10,
             "segments collected behind the relay")
    for i in (0, 59, 119):
        assert b.kv_get("kv", f"r{i}")[1]["value"] == "w" * 300
    wait_for(lambda: vclocks_converged([a, b]), 20, "converged")


def test_a_member_does_not_get_its_own_rows_echoed_back(tmp_path, procs):
    """In a mesh each node relays to the other. A's rows reach B; B's relay to A must not send
    them back (A wrote them after it subscribed to B): B's relay counts 0 rows sent to A."""
    a, b, au, bu = pair(tmp_path, procs)
    a.set_peers([b])                             # now A follows B too: a mesh of two
    wait_for(lambda: any(d["uuid"] == au for d in b.info()["downstreams"]), 20, "A subscribed to B")
    sent_before = downstream(b, au)["rows_sent"]
    for i in range(40):
        a.kv_put("kv", f"echo{i}", i)
    target = own_lsn(a)
    wait_for(lambda: has_lsn(b, au, target), 20, "B has A's rows")
    b.kv_put("kv", "from-b", 1)                  # and B's own row still goes to A
    wait_for(lambda: a.kv_get("kv", "from-b")[0] == 200, 20, "A has B's row")
    assert downstream(b, au)["rows_sent"] - sent_before == 1, "only B's own row went to A"
