"""A link greeted while its relay's rebuilt store was fenced greets again once the fence lifts
(node/core/link/relay.py `rows_may_go`, node/applier/stream.py), on real processes: that
greeting said every `_cluster` row of the relay's own was an earlier incarnation's, so a
subscriber kept on it would take no ids from the table the relay restates at the lift, nor
from the members it registers after (the simulation's full mix, seed 181, found a map gone
wrong that way). Ends with the oracles of tests/integration/oracles.py."""
from __future__ import annotations

from tests.integration.harness import ReplogProcess, wait_for
from tests.integration.oracles import acked_everywhere, log_since_last_start, no_fork, replicated_spaces, upstream
from tests.integration.test_membership_safety import rebuilt_from_identity, write_answer


def test_links_greeted_while_a_rebuilt_node_was_fenced_greet_again_at_its_lift_and_take_its_new_ids(tmp_path, procs):
    a, b, c, acked, c_last = rebuilt_from_identity(tmp_path, procs)
    wait_for(lambda: upstream(a, c.address).get("status") == "follow", 60, "A follows C while C is fenced")
    assert "greets again" not in log_since_last_start(c)

    b.start()                                      # C hears B, its rows come back, the fence lifts
    acked_everywhere([a, b, c], acked, 60)
    s, d = write_answer(c, "after-lift")
    assert s == 200 and d["lsn"] > c_last, (s, d)
    acked.writes[("kv", "after-lift")] = ("after-lift", c.uuid(), d["lsn"])
    wait_for(lambda: "greets again: this node's fence lifted since its greeting" in log_since_last_start(c), 30,
             "C's relay ending a link greeted while C was fenced")
    # C logs the end of the link once its ERROR is sent; A logs it when it reads it, a moment later
    wait_for(lambda: "greet_again" in log_since_last_start(a), 30, "A told to greet C again")
    wait_for(lambda: upstream(a, c.address).get("status") == "follow", 30, "A follows C again")

    # A member that joins through C now is registered under C's new ids: A, following C, takes
    # them from C's rows and translates the newcomer's rows that C relays.
    n = ReplogProcess(tmp_path, "d", peers=[c])
    procs.append(n)
    n.start()
    wait_for(lambda: "kv" in replicated_spaces(n), 60, "D joined through C")
    c.set_peers([a, b, n])                         # C follows D; A and B get D's rows through C
    s, d = write_answer(n, "from-d")
    assert s == 200, (s, d)
    acked.writes[("kv", "from-d")] = ("from-d", n.uuid(), d["lsn"])
    acked_everywhere([a, b, c, n], acked, 60)
    assert "refusing to guess" not in log_since_last_start(a)
    no_fork([a, b, c, n])
