"""`replog status` warns of an expelled member whose rows up to its bound not every member holds
yet (node/status.py `_short_of_bound`): those rows may be on the expelled member alone, which
must then run, followed, until the members have them (docs/replication.md, "A bound is only as
safe as the disk that backs it"; the simulation's full mix, seed 242)."""
from __future__ import annotations

import json

from node.status import Report, members, render_json, render_table

A, B, C, R = ("a" * 8 + "-0000-4000-8000-000000000001", "b" * 8 + "-0000-4000-8000-000000000002",
              "c" * 8 + "-0000-4000-8000-000000000003", "d" * 8 + "-0000-4000-8000-000000000004")


def report(b_holds: int, r_holds: int = 0) -> Report:
    """A and B are members that answered, C is expelled with bound 7, R an anonymous replica."""
    table = [{"uuid": A, "id": 1, "address": "a:1", "state": "member"},
             {"uuid": B, "id": 2, "address": "b:1", "state": "member"},
             {"uuid": C, "id": 3, "address": "c:1", "state": "expelled", "expelled_lsn": 7}]
    r = Report()
    for u, addr, holds in ((A, "a:1", 7), (B, "b:1", b_holds)):
        r.nodes[u] = {"address": addr, "status": "running", "upstreams": [], "vclock_uuid": {A: 3, C: holds}}
        r.clusters[u] = table
        r.ready[u] = {"status": "ready"}
    r.nodes[R] = {"address": "r:1", "status": "running", "anon": True, "upstreams": [],
                  "vclock_uuid": {A: 3, C: r_holds}}
    r.clusters[R] = table
    return r


def test_an_expelled_member_whose_rows_up_to_the_bound_a_member_lacks_is_named_with_who_lacks_them():
    text = render_table(report(b_holds=6))
    assert text.splitlines()[-1] == (f"{C[:8]} is expelled with its rows accepted up to lsn 7, but {B[:8]} "
                                     "holds them to 6: keep it running and followed until every member holds "
                                     "them all, or those rows are lost with it")     # A holds them all


def test_no_warning_once_every_member_holds_them_whatever_an_anonymous_replica_holds():
    text = render_table(report(b_holds=7, r_holds=2))
    assert "is expelled" not in text and text.endswith("every member answers and is ready")


def test_the_json_report_carries_the_bound():
    by_uuid = {e["uuid"]: e for e in json.loads(render_json(report(b_holds=6)))["members"]}
    assert by_uuid[C]["expelled_lsn"] == 7 and "expelled_lsn" not in by_uuid[A]
    assert [e["state"] for e in members(report(7))] == ["member", "member", "expelled", "anonymous"]
