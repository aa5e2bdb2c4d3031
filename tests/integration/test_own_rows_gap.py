"""A peer that sends its own rows with a gap (lsn 2, then 4), against a real node: the node logs
one warning (a link) naming the peer and the lsns it skipped, applies nothing past the gap, counts the
rows in the upstream's `gaps`, and keeps the link (an honest origin whose WAL lost rows it had
sends such a gap too: node/core/receive.py `_own_gap`, docs/replication.md). The peer is the
lying member of tests/integration/fakepeer.py."""
from __future__ import annotations

from node.core.rows import OP_PUT, Op
from tests.integration.fakepeer import FakePeer, running
from tests.integration.harness import ReplogProcess, mesh, wait_for
from tests.integration.oracles import log_since_last_start, upstream


def _put(peer: FakePeer, lsn: int):
    return peer.txn(lsn, (Op(OP_PUT, "kv", f"{peer.uuid[:8]}-{lsn}", lsn),))


def _warnings(node: ReplogProcess, peer: FakePeer) -> list[str]:
    return [ln for ln in log_since_last_start(node).splitlines()
            if "WARNING" in ln and f"{peer.uuid} sent its own row" in ln]


def test_a_peer_that_skips_lsns_of_its_own_is_logged_once_per_link_and_its_link_kept(tmp_path, procs):
    a, b = mesh(tmp_path, 2)
    procs.extend([a, b])
    a.create_space("kv")
    wait_for(lambda: b.get("/v1/spaces/kv/keys")[0] == 200, 20, "space kv on B")
    with running(FakePeer(b""), a.address) as (peer, _):
        peer.script = [_put(peer, 1), _put(peer, 2), _put(peer, 4), _put(peer, 5), _put(peer, 6)]
        a.set_peers([b, peer])
        wait_for(lambda: upstream(a, peer.address).get("gaps") == 3, 30, "the rows past the gap counted")
        lines = [w.split("replog.core: ", 1)[1] for w in _warnings(a, peer)]
        assert set(lines) == {
            f"replication: {peer.uuid} sent its own row 4 while this node holds its rows up to 2: it skipped lsns "
            "3..3 of its own (its WAL lost rows it had, or it is broken or lying); its rows past the gap wait for a "
            "route that has those (docs/replication.md)"}, lines
        assert 1 <= len(lines) <= peer.subscribes, (lines, peer.subscribes)    # once a link, not once a row
        up = upstream(a, peer.address)
        assert (up["status"], up["error"]) == ("follow", ""), up
        for lsn, held in ((1, 200), (2, 200), (4, 404), (5, 404), (6, 404)):
            assert a.kv_get("kv", f"{peer.uuid[:8]}-{lsn}")[0] == held, lsn
        b.kv_put("kv", "from-b", 1)              # replication from an honest peer goes on
        wait_for(lambda: a.kv_get("kv", "from-b")[0] == 200, 20, "B's write reaches A")
        a.set_peers([b])
