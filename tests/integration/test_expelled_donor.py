"""A member expelled while it was down does not know it when it starts again: the expel row is
in no WAL it reads yet, and every member refuses its links as expelled. It must not register a
newcomer meanwhile: the registration would be its own row past its expel bound, which no member
takes, so the newcomer would hold rows nobody else can have (full-mix seed 15214: every node then
told the newcomer to rejoin, and no snapshot covered it). On real processes."""
from __future__ import annotations

from tests.integration.harness import ReplogProcess, mesh, wait_for


def _told_expelled(node: ReplogProcess) -> list[str]:
    s, d = node.get("/v1/health")
    return [w for w in (d.get("warnings") or []) if "refused this node as expelled" in w] if s == 200 else []


def test_a_member_refused_as_expelled_registers_nobody_and_says_so(tmp_path, procs):
    nodes = mesh(tmp_path, 3)
    procs.extend(nodes)
    a, b, c = nodes
    a.create_space("kv")
    wait_for(lambda: all(n.get("/v1/spaces/kv/keys")[0] == 200 for n in nodes), 20, "kv everywhere")
    cu = c.uuid()
    c.stop()
    s, body = a.delete(f"/v1/cluster/{cu}")
    assert s == 200, (s, body)
    wait_for(lambda: (b.cluster().get(cu) or {}).get("state") == "expelled", 20, "C expelled on B")
    c.start()
    assert (c.cluster().get(cu) or {}).get("state") == "member"     # C has not heard of its expel
    warned = wait_for(lambda: _told_expelled(c), 30, "C's health says members refused it as expelled")
    assert "registers nobody" in warned[0], warned
    members = set(c.cluster())

    n = ReplogProcess(tmp_path, "n", peers=[c]).start(wait=False)
    procs.append(n)
    wait_for(lambda: "donor_expelled" in n.log_text(), 30, "the newcomer's JOIN refused by C")
    assert set(c.cluster()) == members and set(a.cluster()) == set(b.cluster()) == members
    assert n.get("/v1/info")[1].get("status") != "running"
