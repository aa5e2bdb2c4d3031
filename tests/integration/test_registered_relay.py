"""A member that subscribed to an anonymous replica before it registered, on real processes (the
simulation's full+anon mix found it, seeds 4088 and 6200): an anonymous node's relay sends none
of its own rows (node/core/link/relay.py), so a link it took while anonymous carried none of
them, and it outlived the registration: every row written on the new member afterwards stayed
off that link for as long as it lived, which under heartbeats is for ever. Now the relay ends
such a link with `greet_again` once its node is a member, and the subscriber's new greeting
names it. (On the relay before the fix: R's write, acknowledged, was on neither member 30 s
later.)"""
from __future__ import annotations

from tests.integration.harness import ReplogProcess, mesh, wait_for
from tests.integration.oracles import Acked, acked_everywhere, no_fork, replicated_spaces, upstream


def test_a_link_taken_while_the_replica_was_anonymous_carries_its_rows_once_it_registers(tmp_path, procs):
    acked = Acked()
    m1, m2 = mesh(tmp_path, 2)
    procs.extend([m1, m2])
    m1.create_space("kv")
    r = ReplogProcess(tmp_path, "r", peers=[m2], extra=["--anon"])
    procs.append(r)
    r.start()
    wait_for(lambda: all("kv" in replicated_spaces(x) for x in (m1, m2)), 30, "kv on both masters")
    for x in (m1, m2):
        acked.put(x, "kv", f"early-{x.name}", x.name)
    acked_everywhere([m1, m2, r], acked)
    ru = r.uuid()

    # R starts without --anon to register, through m2, which is down: R serves meanwhile, as an
    # anonymous node, and m1, which lists R as a peer, subscribes to it
    assert r.stop() == 0 and m2.stop() == 0
    m1.set_peers([m2, r])
    r.extra = []
    r.start(wait=False)
    wait_for(lambda: upstream(m1, r.address).get("status") == "follow" and r.info().get("anon") is True, 60,
             "m1 follows R while R is still anonymous")
    m2.start()
    wait_for(lambda: r.info().get("anon") is False, 60, "R registered through m2")
    wait_for(lambda: all(ru in m.cluster() and m.cluster()[ru]["state"] == "member" for m in (m1, m2)), 30,
             "the members know R as a member")

    d = r.kv_put("kv", "from-r", "after registering")
    acked.writes[("kv", "from-r")] = ("after registering", ru, d["lsn"])
    acked_everywhere([m1, m2, r], acked, 30)           # through m1's link to R (m2 follows m1 alone)
    assert "greets again: this node is a member now" in r.log_text()
    no_fork([m1, m2, r])
