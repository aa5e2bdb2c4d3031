"""A row's origin through a peer's ids that its greeting did not teach the map
(node/core/cluster_rows.py `_translate`): the peer's greeting is its table now; what its
`_cluster` rows said before ("knowledge") may be an earlier incarnation's.

A member that rebuilds from a donor's snapshot takes the donor's ids (ids are local to each
node): its earlier incarnation's `_cluster` rows, still held and relayed everywhere, state ids
it no longer uses. The nemesis (seed 28) found a node that, fenced at the greeting, could not
register the peer and later learned it elsewhere: the peer's row under its new id 6 was looked
up in that knowledge, which said the peer's 6 was another member (the earlier incarnation's
6), and the map assert stopped the link. Had the map not held that member already, the row
would have been taken as the other member's: one (origin, lsn), two rows."""
from __future__ import annotations

import pytest

from node.cluster_space.table import STATE_MEMBER, ClusterTable, Member
from node.core.membership import OwnRowsFence
from node.core.replicaset import NodeCore
from node.core.rows import GROUP_CLUSTER, GROUP_DEFAULT, OP_CLUSTER, OP_PUT, Op, Txn
from node.core.vclock import VClock
from node.errors import RemoteProtocolError

SELF, S, J, NEW, OTHER = "u-self", "u-s", "u-j", "u-new", "u-other"
WALL = 1_700_000_000_000_000


def row(uuid: str, their_id: int) -> list:
    return [uuid, their_id, "", STATE_MEMBER]


def plain(their_id: int, lsn: int = 1) -> Txn:
    return Txn(their_id, lsn, GROUP_DEFAULT, WALL, (Op(OP_PUT, "s", f"k{lsn}", lsn),))


def greeted_while_fenced(knows_s: bool) -> NodeCore:
    """This node (ids: itself 1, S 5 if `knows_s`) greets J fenced, so registers nobody new;
    J's table now: this node 1, S 5, J 6 (it rebuilt from a donor); its earlier incarnation's
    rows said S was its 6 and it was its own 5. Then the fence lifts and this node learns J
    (and S) from elsewhere, under ids of its own."""
    members = [Member(SELF, 1, "", STATE_MEMBER)] + ([Member(S, 5, "", STATE_MEMBER)] if knows_s else [])
    core = NodeCore(SELF, ClusterTable(members), VClock({}), spaces={"s": False})
    core.fence = OwnRowsFence("a test loss")
    core.greeting(J, [row(SELF, 1), row(S, 5), row(J, 6)], WALL)
    core.fence = None
    # J's earlier incarnation's rows, relayed by another upstream after the greeting (only the
    # connected peer's own link knows where its history ends: Peer.history_lsn)
    core.knowledge[(J, S)] = 6
    core.knowledge[(J, J)] = 5
    core.table.upsert(Member(J, 7, "", STATE_MEMBER))
    if not knows_s:
        core.table.upsert(Member(S, 8, "", STATE_MEMBER))
    return core


@pytest.mark.parametrize("knows_s", [True, False])
def test_a_row_under_an_id_the_greeting_gave_is_the_greeted_members(knows_s):
    core = greeted_while_fenced(knows_s)
    out = core.receive(J, plain(6), WALL)
    assert [t.replica_id for t in out] == [7], "J's row taken as another member's"
    assert core.peers[J].map.to_local[6] == 7 and core.claimed.get(7) == 1


def test_an_id_the_greeting_gave_to_a_member_unknown_here_is_not_guessed():
    core = NodeCore(SELF, ClusterTable([Member(SELF, 1, "", STATE_MEMBER), Member(S, 5, "", STATE_MEMBER)]),
                    VClock({}), spaces={"s": False})
    core.fence = OwnRowsFence("a test loss")
    core.greeting(J, [row(SELF, 1), row(S, 5), row(J, 6)], WALL)
    core.fence = None
    core.knowledge[(J, S)] = 6            # the earlier incarnation's, relayed since
    with pytest.raises(RemoteProtocolError, match="id 6 is unknown"):
        core.receive(J, plain(6), WALL)
    assert 6 not in core.peers[J].map.to_local


def test_a_member_the_peer_registered_after_its_greeting_is_learned_from_its_rows():
    core = NodeCore(SELF, ClusterTable([Member(SELF, 1, "", STATE_MEMBER), Member(NEW, 4, "", STATE_MEMBER)]),
                    VClock({}), spaces={"s": False})
    core.greeting(J, [row(SELF, 1), row(J, 2)], WALL)
    core.knowledge[(J, NEW)] = 9          # J's row registering NEW came by a third node
    assert [t.replica_id for t in core.receive(J, plain(9), WALL)] == [4]


def test_knowledge_that_names_two_members_for_one_id_is_not_guessed_from():
    core = NodeCore(SELF, ClusterTable([Member(SELF, 1, "", STATE_MEMBER), Member(NEW, 4, "", STATE_MEMBER),
                                        Member(OTHER, 5, "", STATE_MEMBER)]), VClock({}), spaces={"s": False})
    core.greeting(J, [row(SELF, 1), row(J, 2)], WALL)
    core.knowledge[(J, NEW)] = 9          # one of them an earlier incarnation's
    core.knowledge[(J, OTHER)] = 9
    with pytest.raises(RemoteProtocolError, match="id 9 is unknown"):
        core.receive(J, plain(9), WALL)


def test_knowledge_of_a_member_the_greeting_lists_under_another_id_is_stale():
    core = NodeCore(SELF, ClusterTable([Member(SELF, 1, "", STATE_MEMBER), Member(J, 3, "", STATE_MEMBER),
                                        Member(NEW, 4, "", STATE_MEMBER)]), VClock({}), spaces={"s": False})
    core.fence = OwnRowsFence("a test loss")
    core.greeting(J, [row(SELF, 1), row(J, 2), row(NEW, 7)], WALL)   # (fenced: NEW's id 7 is mapped)
    core.fence = None
    core.knowledge[(J, NEW)] = 9          # the earlier incarnation's id for NEW
    with pytest.raises(RemoteProtocolError, match="id 9 is unknown"):
        core.receive(J, plain(9), WALL)


def test_only_knowledge_of_that_id_counts():
    core = NodeCore(SELF, ClusterTable([Member(SELF, 1, "", STATE_MEMBER), Member(NEW, 4, "", STATE_MEMBER),
                                        Member(OTHER, 5, "", STATE_MEMBER)]), VClock({}), spaces={"s": False})
    core.greeting(J, [row(SELF, 1), row(J, 2)], WALL)
    core.knowledge[(J, NEW)] = 9
    core.knowledge[(J, OTHER)] = 8        # another id: no rival
    core.knowledge[(S, OTHER)] = 9        # another origin's id: no rival
    assert [t.replica_id for t in core.receive(J, plain(9), WALL)] == [4]


def test_a_member_the_greeting_listed_but_this_node_learned_since_is_not_named_by_older_rows():
    """The greeting listed NEW under 7 while this node did not know NEW; knowledge from an
    earlier incarnation says J's 9 is NEW: 9 is not NEW (the greeting says 7)."""
    core = NodeCore(SELF, ClusterTable([Member(SELF, 1, "", STATE_MEMBER)]), VClock({}), spaces={"s": False})
    core.fence = OwnRowsFence("a test loss")
    core.greeting(J, [row(SELF, 1), row(J, 2), row(NEW, 7)], WALL)
    core.fence = None
    core.table.upsert(Member(NEW, 4, "", STATE_MEMBER))
    core.knowledge[(J, NEW)] = 9
    with pytest.raises(RemoteProtocolError, match="id 9 is unknown"):
        core.receive(J, plain(9), WALL)
    assert [t.replica_id for t in core.receive(J, plain(7), WALL)] == [4]      # its id now


def test_a_member_mapped_since_the_greeting_is_not_named_by_older_rows():
    """J registered NEW after its greeting (its row maps J's 11 to NEW); a relayed row of J's
    earlier incarnation then says J's 9 is NEW: 9 is not NEW."""
    core = NodeCore(SELF, ClusterTable([Member(SELF, 1, "", STATE_MEMBER), Member(J, 3, "", STATE_MEMBER)]),
                    VClock({}), spaces={"s": False})
    core.greeting(J, [row(SELF, 1), row(J, 2)], WALL)
    core.receive(J, Txn(2, 1, GROUP_CLUSTER, WALL, (Op(OP_CLUSTER, "_cluster", NEW,
                                                     {"id": 11, "address": "", "state": STATE_MEMBER}),)), WALL)
    local = core.table.id_of(NEW)
    assert core.peers[J].map.to_local[11] == local
    core.knowledge[(J, NEW)] = 9
    with pytest.raises(RemoteProtocolError, match="id 9 is unknown"):
        core.receive(J, plain(9), WALL)
