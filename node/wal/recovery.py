"""Recovery: replay exactly the WAL rows past the vclock the store reflects.

LMDB commits its vclock together with the data, so every WAL transaction whose last
lsn is above the store's vclock component was persisted to the WAL but not yet to the
store; they are applied in WAL order. A torn last frame is cut off (warning names the
file and byte offset); damage before the end refuses to start unless force_recovery."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from node.core.rows import unpack_frame_txns
from node.errors import RecoveryError, RemoteProtocolError
from node.storage.store import Store
from node.wal.reader import SegmentScan, iter_segment, list_segments

log = logging.getLogger("replog.recovery")

REPLAY_BATCH_TXNS = 2048


@dataclass
class RecoveryResult:
    replayed_txns: int = 0
    segments: int = 0
    last_segment: str | None = None
    last_valid_end: int | None = None
    torn: list[tuple[str, int]] = field(default_factory=list)
    skipped: list[tuple[str, int]] = field(default_factory=list)


def recover(store: Store, wal_dir: str, self_uuid: str, *, force_recovery: bool = False) -> RecoveryResult:
    res = RecoveryResult()
    names = list_segments(wal_dir)
    res.segments = len(names)
    vc = store.vclock
    batch = []
    hlc_last = store.get_meta("hlc") or 0
    for i, name in enumerate(names):
        path = os.path.join(wal_dir, name)
        is_last = i == len(names) - 1
        scan = SegmentScan(name, None)
        for ref in iter_segment(path, is_last=is_last, force_recovery=force_recovery, scan=scan):
            try:
                _, parsed = unpack_frame_txns(ref.body)
            except (ValueError, TypeError, RemoteProtocolError) as e:
                # The checksum matched, so these bytes were written by us: a bug or bit rot.
                if not force_recovery:
                    raise RecoveryError(f"{path}: frame at byte {ref.offset} does not decode: {e}") from None
                log.error("force_recovery: skipping undecodable frame %s:%d", path, ref.offset)
                res.skipped.append((name, ref.offset))
                continue
            for t in parsed:
                if t.last_lsn > vc.get(t.component):
                    batch.append(t)
                    hlc_last = max(hlc_last, t.timestamp)
            if len(batch) >= REPLAY_BATCH_TXNS:
                store.apply([batch], self_uuid, hlc_last)
                res.replayed_txns += len(batch)
                batch = []
        if scan.torn_at is not None:
            log.warning("wal: cutting off a torn frame at %s byte %d (an unacknowledged write)", path, scan.torn_at)
            res.torn.append((name, scan.torn_at))
        res.skipped.extend((name, off) for off in scan.skipped)
        if is_last:
            res.last_segment = name
            res.last_valid_end = scan.torn_at if scan.torn_at is not None else scan.valid_end
    if batch:
        store.apply([batch], self_uuid, hlc_last)
        res.replayed_txns += len(batch)
    if res.replayed_txns:
        log.info("recovery: replayed %d transactions from the WAL; vclock %s", res.replayed_txns, store.vclock)
    return res
