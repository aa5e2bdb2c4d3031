"""A node still joining takes new peers (`PUT /v1/admin/peers`), as SIGHUP's reload always let it:
its join polls its peers each round, and from the next round polls these. A joiner whose peers are
all down, or fenced and unable to register it, is pointed at another member without a restart.
(The simulation's operator did so all along, and two of its full+replace seeds, 216015 and
221128, converge only by it: a fence waited for the word of a joiner that could join only through
a member it did not list.) A node that is not running and not joining still answers 503."""
from __future__ import annotations

from tests.integration.harness import PortReservation, ReplogProcess, wait_for
from tests.integration.oracles import replicated_spaces


def test_a_joining_node_takes_new_peers_and_joins_through_them(tmp_path, procs):
    a = ReplogProcess(tmp_path, "a")
    procs.append(a)
    a.start()
    a.create_space("kv")
    a.kv_put("kv", "before", {"n": 1})
    nobody = PortReservation(client_port=False)     # a peer that never answers
    try:
        f = ReplogProcess(tmp_path, "f", peers=[f"127.0.0.1:{nobody.port}"])
        procs.append(f)
        f.start(wait=False)
        wait_for(lambda: _status(f) in ("joining", "waiting"), 30, "f joining")
        assert f.put("/v1/admin/peers", {"peers": [f.address]})[0] == 400      # itself, as when running
        s, d = f.put("/v1/admin/peers", {"peers": [a.address, a.address]})
        assert (s, d) == (200, {"peers": [a.address], "stopping": []})
        wait_for(lambda: _status(f) == "ok", 60, "f joined through a and running")
        assert "kv" in replicated_spaces(f)
        assert f.kv_get("kv", "before")[0] == 200
        assert [u["address"] for u in f.info()["upstreams"]] == [a.address]   # its links: the peers given
    finally:
        nobody.close()


def _status(n: ReplogProcess) -> str | None:
    try:
        return n.get("/v1/health")[1].get("status")
    except OSError:                                  # not listening yet
        return None
