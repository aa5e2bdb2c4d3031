"""The replication link protocol as sans-IO machines (after etcd raft's Ready and h11).

`ApplierMachine` (applier.py) is the subscribing side of a link, `RelayMachine` (relay.py) the
serving side, `filter.py` what a relay sends of each WAL frame. A machine takes messages
(`step(message, now)`) and time (`tick(now)`), and hands back one `Ready` (ready.py): what to
persist, what to send, what the rest of the node must learn, and what the driver must do.
The drivers (node/applier/applier.py, relay.py) read a message, step, act on the Ready in its
order, and advance; they make no protocol decisions.

Rules kept here:
- No IO: no asyncio, aiohttp, lmdb, files or clock (tests/unit/test_core_purity.py). Time is an
  argument. What a machine reads of the rest of the node comes through a narrow host
  interface of synchronous, in-memory questions (`ApplierContext`, `RelayContext`).
- States are enums; a transition the driver should never ask for asserts.
- A peer's bad input never raises out of a machine: the machine ends the link with a `Stop`
  effect naming the error, after whatever it claimed is in the same Ready's persist."""
