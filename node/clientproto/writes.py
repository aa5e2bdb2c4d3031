"""The client write fast path: a batch of checked client writes becomes this node's canonical
transactions and goes to the journal as one entry, the way the applier's packed path takes a
ROWS message (node/core/rowscan.py).

The batch is encoded once, as replog's own encoder writes a ROWS message (so it is canonical),
and handed to the native row scanner, which checks every row again by the data rules and indexes
it; the journal then writes the WAL frame spliced from those bytes and the store puts records
built from them (node.core.entry.PackedEntry): no Txn or Op object per row, and no second encoding.

Rules kept here:
- the node's checks come first, for the whole batch: `Node.write_check` (running, room to write)
  and `Node.replicated_write_check` (read_only, anon, the own-rows fence, own_rows_awaited);
- every op was checked by node.clientrules before it got here (the caller's job), and the
  scanner checks the encoded rows again (a pair of checks: before and after encoding); a batch
  the scanner does not take goes through the exact path (`Node.write`), never unchecked;
- reading the claimed lsn, building, scanning, claiming and submitting happen with no await in
  between, so WAL order is claim order and no lsn is used twice;
- a batch holds only writes to replicated spaces that exist here; each request is one
  transaction (a PUT or DELETE one row, a TXN all of its rows), acknowledged after the journal
  wrote the batch as wal_mode promises."""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from node.core import codec, rowscan
from node.core import messages as m
from node.core.entry import PackedEntry
from node.core.rows import GROUP_DEFAULT, Op

if TYPE_CHECKING:
    from node.process.ports import ClientHost

_ROWS = m.ROWS


def submit(node: "ClientHost", txns: list[list[Op]]) -> tuple[asyncio.Future, list[int]] | None:
    """Claim and queue `txns` (each a list of checked ops on existing replicated spaces) as one
    journal entry. Returns (the journal's future, each txn's last lsn), or None when the native
    scanner is missing or does not take the batch (the caller then uses the exact path). Raises
    ClientError when the node takes no writes now."""
    node.write_check()
    node.replicated_write_check()
    if rowscan.native is None:
        return None
    core = node.core
    rid = core.self_id
    lsn = core.claimed.get(rid) + 1
    hlc = core.hlc
    ts = hlc.now(node.wall_us())
    wire = []
    lasts = []
    for ops in txns:
        wire.append((rid, lsn, GROUP_DEFAULT, ts, ops))
        lsn += len(ops)
        lasts.append(lsn - 1)
        ts += 1
    data = codec.pack((_ROWS, {"frames": ((0, wire),)}))
    scan = rowscan.scan_rows(data)
    if scan is None or scan.ntxn != len(txns):
        return None
    core.claimed.follow(rid, lasts[-1])
    hlc.observe(ts - 1)
    return node.journal.submit_entry_nowait(PackedEntry(scan, [(0, scan.ntxn, rid)])), lasts
