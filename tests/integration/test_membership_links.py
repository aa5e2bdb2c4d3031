"""The peer set in effect is the configured one, one link per member, and a joiner refused for
a lasting reason says so and exits (issue 16, defects 3 and 6), on real processes."""
from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor

from tests.integration.harness import ReplogProcess, mesh, wait_for
from tests.integration.oracles import REPO, downstreams_of, replicated_spaces


# --- D3: the peer set in effect is the configured one, one link per member -----------------------

def open_fds(p: ReplogProcess) -> int:
    return len(os.listdir(f"/proc/{p.proc.pid}/fd"))


def one_link(a: ReplogProcess, b: ReplogProcess) -> bool:
    """A follows B over exactly one link: one upstream to B in "follow" on A, one downstream for A on B."""
    bu = b.uuid()
    ups = [u for u in a.info()["upstreams"] if u["status"] == "follow" and u["uuid"] == bu]
    return len(ups) == 1 and len(downstreams_of(b, a.uuid())) == 1


def put_peers(node: ReplogProcess, peers: list[str]) -> tuple[int, dict]:
    try:
        return node.put("/v1/admin/peers", {"peers": peers})
    except TimeoutError:
        raise AssertionError(f"PUT /v1/admin/peers {peers} on {node.name} got no answer within the "
                             "client's 10 s") from None


def churn(node: ReplogProcess, peers: list[str], toggles: int) -> None:
    """Toggle the node's peers between `peers` and [] `toggles` times, three clients at once with
    no waits in between (the answers race the links), then set [] last."""
    def one(_: int) -> None:
        for _ in range(toggles // 3):
            for ps in (peers, []):
                s, d = put_peers(node, ps)
                assert s == 200, (s, d)
    with ThreadPoolExecutor(3) as pool:
        list(pool.map(one, range(3)))
    s, d = put_peers(node, [])
    assert s == 200, (s, d)


def test_peer_list_churn_leaves_exactly_the_configured_links_and_no_leaked_fds(tmp_path, procs):
    a, b = mesh(tmp_path, 2)
    procs.extend([a, b])
    a.create_space("kv")
    au, bu = a.uuid(), b.uuid()
    wait_for(lambda: one_link(a, b) and one_link(b, a), 20, "A and B follow each other")
    fds = {a.name: open_fds(a), b.name: open_fds(b)}
    churn(a, [b.address], 30)

    def cut() -> bool:
        return a.info()["upstreams"] == [] and downstreams_of(b, au) == []
    try:
        wait_for(cut, 10, "A without upstreams and B without a downstream for A")
    except AssertionError as e:
        raise AssertionError(f"{e}: A upstreams {a.info()['upstreams']}, B downstreams for A "
                             f"{downstreams_of(b, au)}") from None
    before = a.info()["vclock_uuid"].get(bu, 0)
    b.kv_put("kv", "after-cut", 1)            # durable on B once answered
    # The one bounded wait used as a negative check: for 3 s, B's row must not reach A.
    try:
        wait_for(lambda: a.info()["vclock_uuid"].get(bu, 0) != before, 3, "B's row reaching A")
        raise AssertionError(f"A still receives B's rows after peers [] (vclock of B {before} -> "
                             f"{a.info()['vclock_uuid'].get(bu)}); B downstreams {b.info()['downstreams']}")
    except AssertionError as e:
        if "timed out" not in str(e):
            raise
    assert a.kv_get("kv", "after-cut")[0] == 404
    try:
        wait_for(lambda: open_fds(a) <= fds[a.name] + 3 and open_fds(b) <= fds[b.name] + 3, 10,
                 "open fds back to their value before the churn")
    except AssertionError as e:
        raise AssertionError(f"{e}: before {fds}, now {{a: {open_fds(a)}, b: {open_fds(b)}}}") from None

    a.set_peers([b])
    try:
        wait_for(lambda: one_link(a, b), 10, "exactly one link A <- B")
    except AssertionError as e:
        raise AssertionError(f"{e}: A upstreams {a.info()['upstreams']}, B downstreams for A "
                             f"{downstreams_of(b, au)}") from None
    wait_for(lambda: a.kv_get("kv", "after-cut")[0] == 200, 10, "A follows B again")


def test_duplicate_and_self_peer_entries_give_one_link_per_member_or_a_clear_refusal(tmp_path, procs):
    a, b = mesh(tmp_path, 2)
    procs.extend([a, b])
    au = a.uuid()
    pa, pb = a.port, b.port

    def links() -> str:
        return f"A upstreams {a.info()['upstreams']}, B downstreams for A {downstreams_of(b, au)}"

    s, d = put_peers(a, [b.address, b.address])
    assert s == 200, (s, d)
    wait_for(lambda: one_link(a, b), 10, "one link for [B, B]")
    assert len(a.info()["upstreams"]) == 1, links()

    s, d = put_peers(a, [f"localhost:{pb}", f"127.0.0.1:{pb}"])
    assert s == 200, (s, d)

    def one_of_two() -> bool:
        ups = a.info()["upstreams"]
        kept = [u for u in ups if u["status"] == "follow"]
        dup = [u for u in ups if u["status"] == "duplicate"]
        return (len(ups) == 2 and len(kept) == 1 and len(dup) == 1 and kept[0]["address"] in dup[0]["error"]
                and len(downstreams_of(b, au)) == 1)
    try:
        wait_for(one_of_two, 10, "one spelling of B followed, the other shown as a duplicate of it")
    except AssertionError as e:
        raise AssertionError(f"{e}: {links()}") from None

    s, d = put_peers(a, [a.address])
    assert s == 400 and d["error"]["code"] == "bad_peers" and "itself" in d["error"]["message"], (s, d)
    s, d = put_peers(a, [b.address, f"localhost:{pa}"])     # itself, spelled another way
    assert s == 200, (s, d)

    def self_refused() -> bool:
        ups = {u["address"]: u for u in a.info()["upstreams"]}
        return ups.get(f"localhost:{pa}", {}).get("status") == "self" and one_link(a, b)
    try:
        wait_for(self_refused, 10, "A's own address shown as \"self\", no link")
    except AssertionError as e:
        raise AssertionError(f"{e}: {links()}") from None
    assert downstreams_of(a, au) == [], "A has a link to itself"


def test_putting_the_same_peer_list_again_keeps_the_links(tmp_path, procs):
    """After Tarantool's gh-3711: applying the configuration in effect (in any order) restarts
    no link: no new SUBSCRIBE, and rows keep flowing over the links there are."""
    a, b, c = mesh(tmp_path, 3)
    procs.extend([a, b, c])
    a.create_space("kv")
    wait_for(lambda: one_link(a, b) and one_link(a, c) and "kv" in replicated_spaces(b), 20, "A follows B and C")
    subscribes = a.log_text().count("subscribed to")
    for peers in ([b.address, c.address], [c.address, b.address], [b.address, c.address]):
        s, d = put_peers(a, peers)
        assert s == 200, (s, d)
    b.kv_put("kv", "after-same-peers", 1)       # reaches A over the link in effect once it is up
    wait_for(lambda: a.kv_get("kv", "after-same-peers")[0] == 200, 10, "B's row on A")
    assert a.log_text().count("subscribed to") == subscribes, "a PUT of the peers in effect restarted links"
    assert one_link(a, b) and one_link(a, c)


# --- D6: a joiner refused for a must-match option exits naming it --------------------------------

def serve_once(tmp_path, name: str, peer: ReplogProcess, extra: list[str], timeout: float = 30.0):
    """`replog serve` on an empty data dir joining through `peer`: (exit code, stderr); the
    process must end by itself within `timeout`."""
    j = ReplogProcess(tmp_path, name, peers=[peer], extra=extra)
    argv = [a if a != "debug" else "info" for a in j.argv()]          # the default log level
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    except subprocess.TimeoutExpired as e:
        err = (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        raise AssertionError(f"the refused joiner was still running after {timeout} s; stderr:\n{err[-2000:]}") \
            from None
    return r.returncode, r.stderr


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("replog: error:")]


def test_joiner_with_another_cluster_name_exits_2_naming_the_option_and_both_values(tmp_path, procs):
    a = ReplogProcess(tmp_path, "a").start()
    procs.append(a)
    code, err = serve_once(tmp_path, "j", a, ["--cluster-name", "other"])
    assert code == 2, (code, err)
    lines = error_lines(err)
    assert len(lines) == 1 and lines[0] == err.rstrip().splitlines()[-1], err
    assert "cluster_name" in lines[0] and "'other'" in lines[0] and "'replog'" in lines[0], lines[0]
    assert "Traceback" not in err, err
    assert len(a.cluster()) == 1, "nothing was registered for the refused joiner"


def test_joiner_with_another_must_match_option_exits_2_naming_the_option_and_both_values(tmp_path, procs):
    a = ReplogProcess(tmp_path, "a").start()
    procs.append(a)
    # identity is in the options digest (Config.must_match): a lease-identity joiner, local donor
    leases = tmp_path / "leases"
    leases.mkdir()
    code, err = serve_once(tmp_path, "j", a, ["--identity", "lease", "--lease-store", f"file://{leases}",
                                              "--cluster-size", "1"])
    assert code == 2, (code, err)
    lines = error_lines(err)
    assert len(lines) == 1 and lines[0] == err.rstrip().splitlines()[-1], err
    assert "identity" in lines[0] and "'lease'" in lines[0] and "'local'" in lines[0], lines[0]
    assert "Traceback" not in err, err
    assert len(a.cluster()) == 1, "nothing was registered for the refused joiner"
