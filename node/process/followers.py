"""The operator's view of the anonymous replicas this node remembers as its followers, and the
way to have it forget those gone for good (GET and DELETE /v1/admin/followers).

A node remembers every anonymous replica that follows it, beside its identity, because one may
be the only holder of its last rows: a lost store waits to hear from each (node/fence.py). It
forgets one by itself only once every member holds what that one may hold
(node.core.anon_followers followers_to_forget); a node with no other member, or whose members
never subscribe to it, keeps them all, up to limits.anon_followers_max.

Rules kept here:
- Only a follower unseen for a while and with no link open here is forgotten (one that is
  linked takes rows now); `unseen_s` says how long, and the answer names those kept.
- Not while the own-rows fence stands: it waits for the followers it remembered, and the way
  to let one go then is to expel it (DELETE /v1/cluster/{uuid}), which every member learns.
- A forgotten follower is refused if it comes back (ERROR `forgotten`, node/process/peering.py):
  its rows of ours may then differ from ours under the same lsns, and it must be rebuilt."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING

from node import limits
from node.core.anon_followers import followers_unseen
from node.core.validate import is_uuid
from node.errors import ClientError

if TYPE_CHECKING:
    from node.process.ports import FollowersHost


class FollowerAdmin:
    def __init__(self, node: "FollowersHost"):
        self.node = node

    def view(self) -> dict:
        node = self.node
        self._running()
        r = node.retention
        return {"followers": r.followers_report(), "max": limits.anon_followers_max,
                "anon_ttl_s": node.cfg.anon_ttl_s, "forgotten": len(r.forgotten)}

    def forget(self, uuid: str | None, unseen_s: float | None) -> dict:
        """Forget one follower (`uuid`) or every one unseen for at least `unseen_s` seconds."""
        node = self._running()
        if node.core.fence is not None:
            raise ClientError(409, "fenced", "this node's own-rows fence waits for the followers it remembers: "
                              "expel one gone for good instead (DELETE /v1/cluster/{uuid})")
        r = node.retention
        if uuid is not None:
            if not is_uuid(uuid) or uuid not in r.followers:
                raise ClientError(404, "no_such_follower", f"{uuid[:80]} is not an anonymous follower this node remembers")
            if uuid in r.reach.open:
                raise ClientError(409, "follower_linked", f"{uuid} follows this node now: stop it first")
            gone, kept = [uuid], []
        else:
            assert unseen_s is not None
            gone, kept = followers_unseen(r.followers, r.holds, r.reach, time.time(), unseen_s)
        r.forget_by_operator(gone)
        return {"forgotten": gone, "kept": kept}

    def _running(self):
        node = self.node
        if node.core is None or node.status != "running":
            raise ClientError(503, "not_ready", f"node is {node.status}")
        return node

