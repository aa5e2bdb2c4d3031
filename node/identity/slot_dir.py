"""A lease slot's data directory (`<data_dir>/slot-<k>`) knows under which version of the slot
it last served, so a node that takes the slot again can tell whether it was the last holder.

Why: versions go up by one at each acquisition. A directory last served under version w is
current for an acquisition at w + 1 (this node was the last holder: a restart after a crash
or a release), and at any later one if no holder in between served (the slot's `served`,
node/identity/lease.py: a holder records it before it claims an lsn; one that never got as
far, say a standby that could not join, wrote none of the member's rows). Otherwise another
node held the slot in between, as the same member, and wrote rows under that member's lsns
from where its snapshot ended. The old
directory may hold rows under those same lsns with other contents (written and not yet sent
when it stopped), and is in any case behind: served as it is, its next write takes an lsn the
other holder used, and a peer that cannot be reached at that moment cannot say so (two rows for
one (origin, lsn), the acknowledged one lost on every other member). Such a directory is moved
aside, kept for inspection, and the node starts empty, joining from a peer's snapshot.

A directory without a stamp (written before stamps existed) is taken as it is and stamped.

Two stamps: `lease_version`, the version the directory last took the slot at (written before
anything under it), and `served_version`, the version it last *served* at (written once the slot
records that this holder serves, node/identity/lease_startup.py mark_serving). They differ for a
holder that took the slot and stopped before it served (a crash during its wait for its peers): it
wrote no row under the newer version, so its data is the member's as served at the older one, and
it may take the slot back from a holder that has not served (node/identity/lease.py preemptable).
A directory without `served_version` (written before it existed, or never served) counts as
having served at the version it took the slot at, which is exact for one that served at its last
take and never preempts wrongly for one that did not (its stamp is past the slot's `served`)."""
from __future__ import annotations

import logging
import os
import time

from node.wal.writer import fsync_dir

STAMP_FILE = "lease_version"
SERVED_FILE = "served_version"
log = logging.getLogger("replog.identity.lease")


def read_stamp(path: str, name: str = STAMP_FILE) -> int | None:
    """The version the directory last took the slot at (`name`: or last served at, SERVED_FILE);
    None without that stamp, -1 if unreadable."""
    try:
        with open(os.path.join(path, name)) as f:
            text = f.read().strip()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else -1


def mine(data_dir: str, name: str = STAMP_FILE) -> dict[int, int]:
    """The slots whose data this node holds (`slot-<k>` dirs under `data_dir`) and the version
    each last took the slot at (`name` = SERVED_FILE: served at); dirs without a readable stamp
    are left out."""
    out: dict[int, int] = {}
    try:
        names = os.listdir(data_dir)
    except FileNotFoundError:
        return out
    for entry in names:
        k = entry.removeprefix("slot-")
        if entry.startswith("slot-") and k.isdigit():
            stamp = read_stamp(os.path.join(data_dir, entry), name)
            if stamp is not None and stamp > 0:
                out[int(k)] = stamp
    return out


def last_served(data_dir: str, took: dict[int, int] | None = None) -> dict[int, int]:
    """For each slot dir of `mine` (`took`, if read already): the version it last served at (its
    SERVED_FILE, or, without one, the version it took the slot at: see the module's docstring)."""
    took = mine(data_dir) if took is None else took
    served = mine(data_dir, SERVED_FILE)
    return {k: served[k] if k in served and served[k] <= v else v for k, v in took.items()}


def _write_stamp(path: str, name: str, version: int) -> None:
    tmp = os.path.join(path, name + ".tmp")
    with open(tmp, "w") as f:
        f.write(f"{version}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(path, name))
    fsync_dir(path)


def mark_served(path: str, version: int) -> None:
    """The directory serves the slot at `version` from now on: the slot has recorded it."""
    _write_stamp(path, SERVED_FILE, version)


def take(path: str, slot: int, version: int, served: int | None = None) -> str | None:
    """Make `path` the directory of slot `slot` served under `version`: a directory last served
    under a version before `served` (the last version a holder served under before this one;
    None: `version - 1`), or after this one, is moved aside first. Returns where it went, or
    None. The stamp is on disk before anything is written under the new version."""
    held = read_stamp(path)
    served = version - 1 if served is None else served
    moved = None
    if held is not None and not served <= held <= version:
        moved = f"{path}.stale-v{held}-{time.strftime('%Y%m%dT%H%M%S')}"
        os.rename(path, moved)
        fsync_dir(os.path.dirname(path))
        if held < 0:
            why = "its stamp is unreadable"
        elif held > version:
            why = f"it last served under version {held}, newer than this one: the lease store was made anew"
        else:
            why = f"it last served under version {held}, and another node served the slot since (version {served})"
        log.warning("lease: slot %d's data dir %s is stale: %s, writing this member's rows from where its "
                    "snapshot ended. Served as it is, it would write under lsns that node used. Moved it to %s "
                    "(kept for inspection); starting empty, from a peer's snapshot", slot, path, why, moved)
    os.makedirs(path, exist_ok=True)
    _write_stamp(path, STAMP_FILE, version)
    return moved
