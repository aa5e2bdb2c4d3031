"""Recovery: replay exactly the WAL rows past the vclock the store reflects.

LMDB commits its vclock together with the data, so every WAL transaction whose last
lsn is above the store's vclock component was persisted to the WAL but not yet to the
store; they are applied in WAL order. A torn last frame is cut off (warning names the
file and byte offset); damage before the end refuses to start unless force_recovery.

A transaction that reads back but breaks a rule, or that the store refuses, can only come from
a version before today's checks or from a bug (every row is checked before it reaches the WAL).
It stops start-up with one message naming the file, the byte offset of its frame, the row and the
way out; `force_recovery` skips it loudly instead: logged, counted, and applied as nops, so its
lsns are counted as done and the next start does not meet it again. Values written before the
value rule are recovered as they are (node.core.validate: legacy values)."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import msgpack

from node import limits
from node.core import codec
from node.core.rows import Txn, frame_txns_upto, nop_of, txn_from_wire
from node.errors import NoSpaceError, RecoveryError, RemoteProtocolError, StorageError
from node.storage.store import Store
from node.wal.reader import SegmentScan, iter_segment, list_segments

log = logging.getLogger("replog.recovery")

REPLAY_BATCH_TXNS = 2048
WAY_OUT = ("start with --force-recovery to skip it (its rows are lost on this node; they may still "
           "be on its peers), or restore this node from a backup")


@dataclass
class RecoveryResult:
    replayed_txns: int = 0
    segments: int = 0
    last_segment: str | None = None
    last_valid_end: int | None = None
    torn: list[tuple[str, int]] = field(default_factory=list)
    skipped: list[tuple[str, int]] = field(default_factory=list)
    skipped_txns: list[tuple[str, int, str]] = field(default_factory=list)   # (segment, frame offset, why)
    hlc_last: int = 0


class _Replay:
    """Batches of txns to apply, each remembered with where it lies in the WAL."""

    def __init__(self, store: Store, self_uuid: str, force: bool, res: RecoveryResult):
        self.store, self.self_uuid, self.force, self.res = store, self_uuid, force, res
        self.batch: list[tuple[Txn, str, int]] = []
        self.hlc_last = 0
        # (segment, frame offset, which txn) skipped at an earlier start whose lsns could not be
        # counted as done (an envelope past the bounds): the operator decided once, not each start
        self.decided = {tuple(x) for x in store.get_meta("recovery_skipped") or []}

    def add(self, t: Txn, path: str, offset: int) -> None:
        if t.last_lsn > self.store.vclock.get(t.component):
            self.batch.append((t, path, offset))
            self.hlc_last = max(self.hlc_last, t.timestamp)
            if len(self.batch) >= REPLAY_BATCH_TXNS:
                self.flush()

    def skip(self, path: str, offset: int, what: str, why: str, raw) -> None:
        """A txn that cannot be replayed: stop start-up, or (force_recovery) skip it as nops.
        One the store's vclock already covers (skipped at an earlier start) is passed by."""
        nop = nop_of(raw)
        at = (os.path.basename(path), offset, what)
        if (nop is not None and nop.last_lsn <= self.store.vclock.get(nop.component)) or at in self.decided:
            return
        msg = f"{path}: the transaction {what} in the frame at byte {offset} cannot be recovered: {why}"
        if not self.force:
            raise RecoveryError(f"{msg}; {WAY_OUT}")
        log.error("force_recovery: skipping it: %s", msg)
        self.res.skipped_txns.append((os.path.basename(path), offset, why))
        if nop is not None:
            self.add(nop, path, offset)
        else:
            self.decided.add(at)
            self.store.set_meta(recovery_skipped=sorted(list(x) for x in self.decided))

    def flush(self) -> None:
        if not self.batch:
            return
        batch, self.batch = self.batch, []
        try:
            self.store.apply([[t for t, _, _ in batch]], self.self_uuid, self.hlc_last)
        except NoSpaceError as e:       # no row is at fault: the node cannot start until there is room
            raise NoSpaceError(e.kind, f"recovery cannot replay the WAL: {e}") from None
        except (StorageError, ValueError, TypeError, KeyError, AssertionError):
            for t, path, offset in batch:       # one by one: which txn is it?
                try:
                    self.store.apply([[t]], self.self_uuid, self.hlc_last)
                except NoSpaceError as e:
                    raise NoSpaceError(e.kind, f"recovery cannot replay the WAL: {e}") from None
                except (StorageError, ValueError, TypeError, KeyError, AssertionError) as e:
                    self.skip(path, offset, f"{t.replica_id}:{t.lsn}", f"the store refuses it: "
                              f"{type(e).__name__}: {e} (rows {[list(o) for o in t.ops]!r:.300})", t.to_wire())
        self.res.replayed_txns += len(batch)


def recover(store: Store, wal_dir: str, self_uuid: str, *, force_recovery: bool = False) -> RecoveryResult:
    res = RecoveryResult()
    names = list_segments(wal_dir)
    res.segments = len(names)
    replay = _Replay(store, self_uuid, force_recovery, res)
    replay.hlc_last = _stored_hlc(store, force_recovery)
    for i, name in enumerate(names):
        path = os.path.join(wal_dir, name)
        is_last = i == len(names) - 1
        scan = SegmentScan(name, None)
        for ref in iter_segment(path, is_last=is_last, force_recovery=force_recovery, scan=scan):
            try:
                _, parsed, bad = frame_txns_upto(ref.body, legacy=True)
            except (ValueError, TypeError, msgpack.UnpackException) as e:
                # The checksum matched, so these bytes were written by us: a bug or bit rot.
                if not force_recovery:
                    raise RecoveryError(f"{path}: frame at byte {ref.offset} does not decode: {e}; {WAY_OUT}") \
                        from None
                log.error("force_recovery: skipping undecodable frame %s:%d", path, ref.offset)
                res.skipped.append((name, ref.offset))
                continue
            for t in parsed:
                replay.add(t, path, ref.offset)
            if bad is not None:                 # a txn past the rules: it and each after it, one by one
                raws = msgpack.unpackb(ref.body, raw=False, strict_map_key=False, ext_hook=codec.refuse_ext)[1]
                for k in range(len(parsed), len(raws)):
                    try:
                        replay.add(txn_from_wire(raws[k], legacy=True), path, ref.offset)
                    except RemoteProtocolError as e:
                        replay.skip(path, ref.offset, f"#{k + 1}", str(e), raws[k])
        if scan.torn_at is not None:
            log.warning("wal: cutting off a torn frame at %s byte %d (an unacknowledged write)", path, scan.torn_at)
            res.torn.append((name, scan.torn_at))
        res.skipped.extend((name, off) for off in scan.skipped)
        if is_last:
            res.last_segment = name
            res.last_valid_end = scan.torn_at if scan.torn_at is not None else scan.valid_end
    replay.flush()
    res.hlc_last = replay.hlc_last
    if res.replayed_txns:
        log.info("recovery: replayed %d transactions from the WAL; vclock %s", res.replayed_txns, store.vclock)
    if res.skipped_txns:
        log.error("recovery: --force-recovery skipped %d transactions (their lsns count as done): %s",
                  len(res.skipped_txns), res.skipped_txns)
    return res


def _stored_hlc(store: Store, force_recovery: bool) -> int:
    """The hybrid clock the store kept. One past the bound was raised by a row from the far future
    that a version before the bound absorbed: it cannot go on (the next write would overflow)."""
    hlc = store.get_meta("hlc") or 0
    if type(hlc) is not int or not 0 <= hlc <= limits.timestamp_us_max:
        if not force_recovery:
            raise RecoveryError(f"{store.path}: the stored hybrid clock {hlc} is past its bound "
                                f"{limits.timestamp_us_max}: a row from the far future was absorbed by an "
                                "earlier version; start with --force-recovery to restart the clock from the "
                                "wall clock (writes to keys such a row holds keep losing to it)")
        log.error("force_recovery: the stored hybrid clock %s is past its bound; restarting it", hlc)
        store.set_meta(hlc=0)
        return 0
    return hlc
