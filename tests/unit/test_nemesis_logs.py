"""The nemesis's log oracle (tests/integration/nemesis.py `Nemesis.logs_clean`): a traceback, a
step of an orderly stop that failed, or a peer blamed for this node's own lost rows fails the
run; ordinary lines do not."""
from __future__ import annotations

import pytest

from tests.integration.nemesis import Nemesis

OK = ["2026-11-28T20:26:19.100Z INFO    replog.node: node: stopping on request",
      "2026-11-28T20:26:19.300Z WARNING replog.applier: applier 127.0.0.1:1: 127.0.0.1:1: connection closed",
      "2026-11-28T20:26:19.400Z ERROR   replog.node: shutdown: members did not reach one vclock within 20 s; "
      "stores stay dirty",
      "2026-11-28T20:26:20.200Z INFO    replog.node: node: stopped in 0.12 s"]


class Node:
    def __init__(self, name: str, lines: list[str]):
        self.name, self._text = name, "\n".join(lines)

    def log_text(self) -> str:
        return self._text


def nemesis(*nodes: Node, retired: tuple[Node, ...] = ()) -> Nemesis:
    n = object.__new__(Nemesis)        # only its nodes are read
    n.masters, n.replicas, n.retired = list(nodes), [], list(retired)
    return n


def test_ordinary_lines_pass():
    nemesis(Node("n1", OK), Node("n2", OK)).logs_clean()


@pytest.mark.parametrize("bad", [
    "2026-11-28T20:26:20.153Z ERROR   replog.node: shutdown: journal failed: TypeError: 'NoneType' object cannot "
    "be interpreted as an integer",
    "2026-11-28T20:26:20.153Z ERROR   replog.node: shutdown: replication links failed: took longer than 10 s",
    "Traceback (most recent call last):",
    "2026-11-28T20:26:20.153Z WARNING replog.applier: row x skipped lsns of its own (its WAL lost rows",
])
def test_a_traceback_a_failed_stop_step_or_an_own_gap_fails_the_run(bad):
    with pytest.raises(AssertionError, match="n2's log"):
        nemesis(Node("n1", OK), Node("n2", OK[:2] + [bad] + OK[2:])).logs_clean()


def test_a_master_replaced_for_good_still_has_its_log_read():
    with pytest.raises(AssertionError, match="n2's log"):
        nemesis(Node("n1", OK), retired=(Node("n2", OK[:2] + ["Traceback (most recent call last):"]),)).logs_clean()
