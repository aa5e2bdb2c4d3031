"""Membership changes while clients keep writing, after scenarios of Tarantool's replication
suite: a member joins under load (join_vclock.test.lua, gh-5566 "final join"); an anonymous
replica registers as a member under load (anon_register_gap.test.lua). No row written during
the change is skipped by the snapshot/SUBSCRIBE hand-over, and no (origin, lsn) forks."""
from __future__ import annotations

import threading

from tests.integration.harness import ReplogProcess, mesh, wait_for
from tests.integration.oracles import Acked, acked_everywhere, no_fork, replicated_spaces, restart_all, upstream


class Writer:
    """Acknowledged writes to one node from a thread, until stop(); a refused or failed write is
    not acknowledged and not recorded."""

    def __init__(self, node: ReplogProcess, acked: Acked, prefix: str):
        self.node, self.acked, self.prefix = node, acked, prefix
        self.done = threading.Event()
        self.count = 0
        self.thread = threading.Thread(target=self._run, name=f"writer-{prefix}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        i = 0
        while not self.done.is_set():
            try:
                self.acked.put(self.node, "kv", f"{self.prefix}{i}", {"by": self.prefix, "i": i})
                self.count += 1
            except (OSError, AssertionError):
                pass
            i += 1

    def wrote_more(self, n: int):
        """A condition: n more acknowledged writes from now."""
        target = self.count + n
        return lambda: self.count >= target

    def stop(self) -> None:
        self.done.set()
        self.thread.join(30)


def test_member_joining_while_every_master_writes_gets_every_acknowledged_row(tmp_path, procs):
    acked = Acked()
    a, b = mesh(tmp_path, 2)
    procs.extend([a, b])
    a.create_space("kv")
    wait_for(lambda: "kv" in replicated_spaces(b), 20, "space on B")
    writers = [Writer(a, acked, "a-"), Writer(b, acked, "b-")]
    try:
        wait_for(writers[0].wrote_more(50), 30, "writes under way")
        j = ReplogProcess(tmp_path, "j", peers=[a, b])
        procs.append(j)
        j.start()
        wait_for(lambda: all(upstream(j, p.address).get("status") == "follow" for p in (a, b)), 30,
                 "the joiner follows both masters")
        for w in writers:
            wait_for(w.wrote_more(50), 30, "writes after the join")
    finally:
        for w in writers:
            w.stop()
    assert all(w.count > 100 for w in writers), [w.count for w in writers]
    a.set_peers([b, j])
    b.set_peers([a, j])
    acked.put(j, "kv", "from-j", 1)
    acked_everywhere([a, b, j], acked, 60)
    no_fork([a, b, j])
    restart_all([a, b, j])


def test_anonymous_replica_registering_while_the_master_writes_skips_no_row(tmp_path, procs):
    acked = Acked()
    a = ReplogProcess(tmp_path, "a")
    procs.append(a)
    a.start()
    a.create_space("kv")
    r = ReplogProcess(tmp_path, "r", peers=[a], extra=["--anon"])
    procs.append(r)
    writer = Writer(a, acked, "a-")
    try:
        r.start()
        wait_for(writer.wrote_more(50), 30, "writes while the replica follows anonymously")
        ru = r.uuid()
        assert r.stop() == 0
        r.extra = []                               # restarted without --anon: REGISTER, then SUBSCRIBE
        r.start()
        wait_for(lambda: ru in a.cluster() and upstream(r, a.address).get("status") == "follow", 30,
                 "the replica registered and follows as a member")
        wait_for(writer.wrote_more(50), 30, "writes after the registration")
    finally:
        writer.stop()
    assert r.info()["anon"] is False
    acked_everywhere([a, r], acked, 60)
    a.set_peers([r])
    acked.put(r, "kv", "from-r", 1)
    acked_everywhere([a, r], acked)
    no_fork([a, r])
    restart_all([a, r])
