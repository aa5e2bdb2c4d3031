"""A SHUTDOWN phase (node/cluster_shutdown.py `ClusterShutdown.phase`) on a node that is ending:
quiesce is refused, and the node's status (stopping, stopped, failed, lease lost) stands, so
nothing shows it serving again (node/process/ports.py ENDING)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from node.cluster_shutdown import ClusterShutdown
from node.errors import ClientError


@pytest.mark.parametrize("status", ["stopping", "stopped", "failed", "lease_lost"])
async def test_an_ending_node_refuses_to_quiesce_and_keeps_its_status(status):
    node = SimpleNamespace(core=object(), status=status, status_reason="why")
    cs = ClusterShutdown(node)
    with pytest.raises(ClientError) as e:
        await cs.phase({"phase": "quiesce", "shutdown_id": "s-1"})
    assert (e.value.status, e.value.code) == (409, "not_ready")
    assert (node.status, node.status_reason) == (status, "why") and cs.shutdown_id is None
