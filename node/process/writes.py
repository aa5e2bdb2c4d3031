"""This node's own writes: client transactions, `_cluster` rows (register, expel), and the
read-your-writes waits on its vclock. Every client write path (HTTP, the binary protocol in
node/clientproto) goes through write_check here before it claims an lsn.

Rules kept here:
- A write is refused before it claims anything: not running (503), no room (507, the NOSPACE
  alarm), read-only or anonymous (409), expelled from the cluster (409: no member takes its
  rows), the own-rows fence standing or a peer still holding this node's own rows (503). A
  refused write leaves no trace.
- Checks, claim (core.local_txn) and submit happen with no await between them.
- The vclock by uuid is cached per vclock: a vclock only grows, so its signature and the
  table's size name it; callers never change the cached dict."""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from node.cluster_space.table import STATE_EXPELLED, STATE_MEMBER
from node.core.rows import GROUP_DEFAULT, GROUP_LOCAL, OP_SPACE, Op
from node.errors import ClientError

if TYPE_CHECKING:
    from node.process.ports import WritesHost


class Writes:
    def __init__(self, node: "WritesHost"):
        self.node = node
        self._vclock_uuid: dict[str, int] = {}      # vclock_uuid()'s cache, and what it was built from
        self._vclock_ids: dict[str, int] = {}       # the same vclock by local id, as answers show it
        self._vclock_uuid_at: tuple = ()

    # --- checks -------------------------------------------------------------------------------
    def write_check(self) -> None:
        """Whether this node takes client writes now (raises ClientError if not): running, with
        room to write (the NOSPACE alarm). Every client write path calls it, and
        replicated_write_check for rows under our own id."""
        node = self.node
        if node.lease is not None:
            node.lease.serving()       # past its deadline the loss begins here: the status refuses
        if node.status != "running" or node.core is None:
            raise ClientError(503, "not_ready", f"node is {node.status}: {node.status_reason}")
        self.refuse_without_room()

    def ack_check(self) -> None:
        """Before a write's answer: a lease node whose renewal deadline passed while the write was
        made durable (it was paused) does not acknowledge it. The slot may be another node's
        by now, and the row may never leave this one."""
        lease = self.node.lease
        if lease is not None and not lease.serving():
            raise ClientError(503, "lease_lost", "this node's lease ran out while the write was made durable "
                              "(the process was paused or stalled): the write may or may not survive; read it "
                              "back from another member before writing it again")

    def replicated_write_check(self) -> None:
        """Writes to replicated spaces, rows under this node's own id: refused on a read-only node
        or an anonymous replica, on a node expelled from the cluster, while the own-rows fence
        stands (node/fence.py), and while a peer says it holds more of this node's rows than it
        has (they are still coming back)."""
        node = self.node
        core = node.core
        if node.cfg.read_only or core.anon:
            why = "an anonymous replica" if core.anon else "read_only"
            raise ClientError(409, "read_only", f"this node is {why}: writes to replicated spaces are refused")
        self._refuse_if_expelled()
        if core.fence is not None and not node.fence.try_lift():
            raise ClientError(503, "own_rows_unconfirmed", core.fence_state()[1])
        awaited = node.own_rows_awaited() if node.own_claims else None
        if awaited is not None:
            have = core.claimed.get(core.self_id)
            raise ClientError(503, "catching_up", f"this node's own earlier rows (lsn {have + 1}..{awaited[0]}) "
                              f"are still coming back from {awaited[1]}, which holds them; retry shortly")

    def _refuse_if_expelled(self) -> None:
        """A node out of the cluster (NodeCore.expelled_reason) takes no row under its own id: no
        member would take it, so a write acknowledged here would reach nobody."""
        out = self.node.core.expelled_reason()
        if out is not None:
            raise ClientError(409, "expelled", f"this node was expelled from the cluster ({out}): no member takes "
                              "its writes; stop it, and join a new node (a new identity) in its place")

    def refuse_without_room(self) -> None:
        """While the NOSPACE alarm is raised a write is refused before it claims anything."""
        alarm = self.node.space.alarm
        if alarm is not None:
            raise ClientError(507, "no_space", f"writes are refused until there is room: {alarm}")

    # --- writes -------------------------------------------------------------------------------
    async def write(self, ops: list[Op]) -> dict:
        node = self.node
        self.write_check()
        core = node.core
        local_ops, repl_ops = [], []
        for op in ops:
            if op.kind == OP_SPACE:
                sdef_local = bool(op.value.get("local"))
            else:
                sdef_local = core.spaces.get(op.space)
                if sdef_local is None:
                    raise ClientError(404, "no_such_space", f"space {op.space!r} does not exist")
            (local_ops if sdef_local else repl_ops).append(op)
        if repl_ops:
            self.replicated_write_check()
        txns = []
        now = node.wall_us()
        if repl_ops:
            txns.append(core.local_txn(repl_ops, GROUP_DEFAULT, now))
        if local_ops:
            txns.append(core.local_txn(local_ops, GROUP_LOCAL, now))
        await node.journal.submit(txns)
        self.ack_check()
        t = txns[0]
        vclock_uuid = self.vclock_uuid()      # refreshes the cached vclock by local id too
        answer = {"lsn": t.last_lsn, "vclock": self._vclock_ids, "vclock_uuid": vclock_uuid}
        if repl_ops:
            answer["origin"] = node.uuid       # (origin, lsn) names the row on every node (GET answers both)
        return answer

    async def register_member(self, uuid: str, address: str, state: str = STATE_MEMBER) -> int:
        """A `_cluster` row for `uuid` (a new member, a new address, an expel), under our own id,
        on disk when this returns whatever `wal_mode` says: the member registered, or the operator
        told of the expel, relies on it (a donor that forgot a member it registered would leave a
        fence waiting for it after a power loss)."""
        node = self.node
        local_id, txn = node.core.register_member(uuid, address, node.wall_us(), state=state)
        if txn is not None:
            await node.journal.submit([txn])
            await node.journal.durable()
        return local_id

    async def expel(self, uuid: str) -> dict:
        node = self.node
        core = node.core
        if core is None or node.status != "running":
            raise ClientError(503, "not_ready", f"node is {node.status}")
        self.refuse_without_room()
        if core.anon or node.cfg.read_only:
            raise ClientError(409, "read_only", "expel needs a writable member")
        self._refuse_if_expelled()
        mem = core.table.get(uuid)
        fence = core.fence
        # a fenced node registers nobody: a member it waits for, or whose word holds it (an
        # expelled one that still runs and said it holds our rows), may be in no row here yet
        if mem is None and (fence is None or (uuid not in fence.waiting_for(core.table, core.uuid)
                                              and uuid not in fence.heard)):
            raise ClientError(404, "no_such_member", f"{uuid} is not in _cluster")
        if uuid == node.uuid:
            raise ClientError(400, "expel_self", "a node cannot expel itself; expel it from another member")
        if core.fence is not None and not node.fence.try_lift():
            # The expel row is a row under our own id: it waits for the fence, which stops waiting
            # for this member now (so a cluster whose every member is fenced can let one go).
            node.fence.give_up(uuid)
            return {"uuid": uuid, "id": mem.id if mem else None, "state": "expel_pending"}
        local_id = await self.register_member(uuid, mem.address, state=STATE_EXPELLED)
        for r in list(node.relays):
            if r.uuid == uuid:
                await r.conn.close()
        return {"uuid": uuid, "id": local_id, "state": STATE_EXPELLED}

    # --- read-your-writes ---------------------------------------------------------------------
    def vclock_uuid(self) -> dict[str, int]:
        """This node's durable vclock by member uuid (replicated rows only), cached per vclock."""
        core = self.node.core
        if core is None:
            return {}
        at = (id(core), core.vclock.signature, len(core.table))   # a vclock only grows: its sum names it
        if self._vclock_uuid_at != at:
            self._vclock_uuid = core.vclock_by_uuid()
            self._vclock_ids = {str(k): v for k, v in core.vclock.items()}
            self._vclock_uuid_at = at
        return self._vclock_uuid    # shared: callers never change it

    def has_applied(self, vclock_uuid: dict[str, int]) -> bool:
        """Whether this node's durable state holds every row of `vclock_uuid` ({uuid: lsn})."""
        core = self.node.core
        if core is None:
            return False
        id_of, v = core.table.id_of, core.vclock
        for uuid, lsn in vclock_uuid.items():
            if lsn > 0:
                i = id_of(uuid)
                if i is None or v.get(i) < lsn:
                    return False
        return True

    async def wait_applied(self, vclock_uuid: dict[str, int], timeout_s: float) -> dict[str, int]:
        """Wait until this node has applied `vclock_uuid` (read-your-writes across masters);
        returns the node's vclock by uuid then. Raises ClientError 504 `wait_timeout` after
        timeout_s, and 503 if the node stops serving meanwhile."""
        node = self.node
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not self.has_applied(vclock_uuid):
            left = deadline - loop.time()
            if left <= 0:
                raise ClientError(504, "wait_timeout", f"this node has not applied {vclock_uuid} within "
                                  f"{timeout_s:g} s (it holds {self.vclock_uuid()})")
            if node.journal is None or node.status not in ("running", "rejoining", "joining"):
                raise ClientError(503, "not_ready", f"node is {node.status}: {node.status_reason}")
            await node.journal.changed(timeout=left)
        return self.vclock_uuid()
