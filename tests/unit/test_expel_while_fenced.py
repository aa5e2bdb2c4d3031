"""An expel asked of a fenced node (node/process/writes.py Writes.expel) waits for the fence
(the expel row is a row under the node's own id) and stops the fence waiting for that member at
once (`expel_pending`). A fenced node registers nobody, so the member may have no row here: one
the fence waits for, or one whose word holds it (an expelled member that still runs and said it
holds this node's rows: the fence's status names it and says to expel it here too). Anyone
else unknown is a 404."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from node.cluster_space.table import STATE_MEMBER, ClusterTable, Member
from node.core.membership import OwnRowsFence
from node.errors import ClientError
from node.process.writes import Writes

SELF, HOLDER, STRANGER = (f"{c * 8}-0000-4000-8000-00000000000{i}" for i, c in enumerate("abc", 1))


def _writes(fence: OwnRowsFence) -> tuple[Writes, list[str]]:
    given: list[str] = []
    core = SimpleNamespace(table=ClusterTable([Member(SELF, 1, "a:1", STATE_MEMBER)]), uuid=SELF, fence=fence, anon=False,
                           expelled_reason=lambda: None)
    node = SimpleNamespace(core=core, status="running", uuid=SELF, cfg=SimpleNamespace(read_only=False),
                           space=SimpleNamespace(alarm=None),
                           fence=SimpleNamespace(try_lift=lambda: False, give_up=given.append))
    w = Writes(node)
    w.refuse_without_room = lambda: None
    return w, given


async def test_an_expelled_holder_the_fenced_node_has_no_row_for_can_be_expelled_here_too():
    fence = OwnRowsFence("lost")
    fence.hear(HOLDER, 8)
    fence.expelled.add(HOLDER)
    w, given = _writes(fence)
    assert await w.expel(HOLDER) == {"uuid": HOLDER, "id": None, "state": "expel_pending"}
    assert given == [HOLDER]


async def test_a_member_the_fence_waits_for_can_be_expelled_without_a_row():
    fence = OwnRowsFence("lost")
    fence.known.add(HOLDER)
    w, given = _writes(fence)
    assert (await w.expel(HOLDER))["state"] == "expel_pending" and given == [HOLDER]


async def test_a_uuid_the_fence_never_heard_of_is_not_a_member():
    fence = OwnRowsFence("lost")
    fence.hear(HOLDER, 8)
    w, given = _writes(fence)
    with pytest.raises(ClientError) as e:
        await w.expel(STRANGER)
    assert e.value.status == 404 and given == []
