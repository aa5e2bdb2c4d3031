"""What replication messages carry besides rows: `_cluster` tables, vclocks, a greeting's fields,
snapshots and the steps of an orderly cluster shutdown. Pure.

node.core.messages checks each message's body with these after its types (a body that breaks one is
a RemoteProtocolError naming the message); they are built on node.core.validate's rules for uuids,
addresses, lsns, keys, values and space definitions, which stay there, so each rule has one home."""
from __future__ import annotations

import math
from typing import Any

from node import limits
from node.core import record
from node.core.link.twins import valid_run
from node.core.validate import (address_error, cluster_fields_error, is_uuid, key_error, lsn_error, space_def_error,
                                space_name_error, value_error)


# --- _cluster tables, vclocks ----------------------------------------------------------------------
def cluster_row_error(row: Any) -> str | None:
    """A `_cluster` tuple as greetings, snapshots and segment headers carry it:
    [uuid, id, address, state(, lsn(, expelled_lsn))]."""
    if type(row) is not list or not 4 <= len(row) <= 6:
        return "a _cluster row is [uuid, id, address, state, lsn, expelled_lsn]"
    if not is_uuid(row[0]):
        return f"_cluster uuid {str(row[0])[:80]!r} is not a canonical uuid"
    n = len(row)
    err = cluster_fields_error(row[1], row[2], row[3], row[5] if n > 5 else None)
    # (lsn_error's rule, inline: a greeting carries a row per member)
    if err is None and n > 4 and (type(row[4]) is not int or not 0 <= row[4] <= limits.lsn_max):
        err = "_cluster lsn: " + lsn_error(row[4])
    return err


def cluster_rows_error(rows: Any) -> str | None:
    """A whole `_cluster`: at most members_max rows, one per uuid and one per id."""
    if type(rows) is not list or len(rows) > limits.members_max:
        return f"a _cluster table is a list of at most {limits.members_max} rows"
    uuids, ids = set(), set()
    for r in rows:
        err = cluster_row_error(r)
        if err is not None:
            return err
        if r[0] in uuids or r[1] in ids:
            return f"_cluster names {r[0]} or id {r[1]} twice"
        uuids.add(r[0])
        ids.add(r[1])
    return None


def vclock_error(d: Any) -> str | None:
    """A vclock on the wire: {id: lsn}, ids 0..replica_id_max, lsns 0..lsn_max."""
    if type(d) is not dict or len(d) > limits.members_max + 1:
        return f"a vclock is a map of at most {limits.members_max + 1} components"
    id_max, lsn_max = limits.replica_id_max, limits.lsn_max
    for k, v in d.items():      # (lsn_error's rule, inline: every ACK and SUBSCRIBE carries two)
        if type(k) is not int or not 0 <= k <= id_max or type(v) is not int or not 0 <= v <= lsn_max:
            return f"vclock component {str(k)[:20]}: {str(v)[:30]} is not id: lsn within bounds"
    return None


def vclock_uuid_error(d: Any) -> str | None:
    if type(d) is not dict or len(d) > limits.members_max:
        return f"a vclock by uuid is a map of at most {limits.members_max} components"
    lsn_max = limits.lsn_max
    for k, v in d.items():      # (lsn_error's rule, inline)
        if not is_uuid(k) or type(v) is not int or not 0 <= v <= lsn_max:
            return f"vclock component {str(k)[:40]}: {str(v)[:30]} is not uuid: lsn within bounds"
    return None


def _finite_number(x: Any) -> bool:
    return (type(x) is float and math.isfinite(x)) or type(x) is int


def store_field_error(st: Any) -> str | None:
    """A greeting's `store` (the join protocol's status exchange, node/lifecycle.py): null, or
    {"status", "initial": null | {cluster_uuid, created_s, founders}, "final": null |
    {vclock_by_uuid, shutdown_id}, "proposal": null | [cluster uuid, created_s]}."""
    if st is None:
        return None
    if type(st) is not dict:
        return "store is an object"
    if st.get("status") is not None and (type(st["status"]) is not str
                                         or len(st["status"]) > limits.greeting_field_chars_max):
        return "store.status is a short string"
    ini = st.get("initial")
    if ini is not None and (type(ini) is not dict or not is_uuid(ini.get("cluster_uuid"))
                            or not _finite_number(ini.get("created_s")) or type(ini.get("founders")) is not list
                            or len(ini["founders"]) > limits.members_max or not all(map(is_uuid, ini["founders"]))):
        return "store.initial is {cluster_uuid, created_s, founders: [uuid, ...]}"
    fin = st.get("final")
    if fin is not None and (type(fin) is not dict or not is_uuid(fin.get("shutdown_id"))
                            or vclock_uuid_error(fin.get("vclock_by_uuid")) is not None):
        return "store.final is {vclock_by_uuid, shutdown_id}"
    prop = st.get("proposal")
    if prop is not None and (type(prop) is not list or len(prop) != 2 or not is_uuid(prop[0])
                             or not _finite_number(prop[1])):
        return "store.proposal is [cluster uuid, created_s]"
    return None


def uuid_list_error(v, name: str) -> str | None:
    """An optional list of members (GREETING expels_heard, SUBSCRIBE without): absent, or at
    most members_max canonical uuids."""
    ok = v is None or (type(v) is list and len(v) <= limits.members_max and all(is_uuid(u) for u in v))
    return None if ok else f"{name} is a list of at most {limits.members_max} canonical uuids"


def subscribe_error(b: dict) -> str | None:
    """SUBSCRIBE {vclock, durable?, own_rows?, without?}: `without`, the members whose rows the
    subscriber goes without where this relay collected them (node.core.link.relay)."""
    return (vclock_error(b["vclock"]) or (vclock_error(b["durable"]) if "durable" in b else None)
            or (None if type(b.get("own_rows", False)) is bool else "own_rows is not a boolean")
            or uuid_list_error(b.get("without"), "without"))


def greeting_error(g: dict) -> str | None:
    """The fields of a GREETING that this node acts on, past their types (node.core.messages);
    the optional ones are null or of the shape this node reads."""
    if not is_uuid(g["uuid"]):
        return f"uuid {g['uuid'][:80]!r} is not a canonical uuid"
    if g["cluster_uuid"] is not None and not is_uuid(g["cluster_uuid"]):
        return "cluster_uuid is not a canonical uuid"
    if g.get("member_of") is not None and not is_uuid(g["member_of"]):
        return "member_of is not a canonical uuid"
    if not 0 < len(g["cluster_name"]) <= limits.cluster_name_chars_max or \
            len(g["options_digest"]) > limits.greeting_field_chars_max or len(g["status"]) > limits.greeting_field_chars_max:
        return "cluster_name, options_digest or status too long"
    err = address_error(g["address"]) or cluster_rows_error(g["cluster"])
    if err is None and g.get("vclock_uuid") is not None:
        err = vclock_uuid_error(g["vclock_uuid"])
    if err is None:
        err = uuid_list_error(g.get("expels_heard"), "expels_heard")
    if err is None and g.get("run") is not None and valid_run(g["run"]) is None:
        err = "run is 24 hex digits or null"
    for name, types in (("options", (dict,)), ("lease", (dict,)), ("wait_for", (int,))):
        if err is None and g.get(name) is not None and type(g[name]) not in types:
            err = f"{name} is {' or '.join(t.__name__ for t in types)} or null"
    return err or store_field_error(g.get("store"))


def shutdown_error(body: dict) -> str | None:
    """SHUTDOWN {phase, shutdown_id, final?}: one step of an orderly cluster shutdown
    (node/cluster_shutdown.py), whose id and vclock end up in status and in the store."""
    if body["phase"] not in ("quiesce", "final", "resume") or not is_uuid(body["shutdown_id"]):
        return "phase is quiesce, final or resume, and shutdown_id a canonical uuid"
    final = body.get("final")
    if final is not None and (type(final) is not dict or final.get("shutdown_id") != body["shutdown_id"]
                              or vclock_uuid_error(final.get("vclock_by_uuid")) is not None):
        return "final is null or {vclock_by_uuid, shutdown_id} of this shutdown"
    return None


def snapshot_error(body: dict) -> str | None:
    """SNAPSHOT {vclock, cluster, spaces}: what install_snapshot will write."""
    spaces = body["spaces"]
    err = vclock_error(body["vclock"]) or cluster_rows_error(body["cluster"])
    if err is None and len(spaces) > limits.store_spaces_max:
        err = f"a snapshot holds at most {limits.store_spaces_max} spaces"
    for name, d in spaces.items() if err is None else ():
        err = space_name_error(name) or space_def_error(d)
        if err:
            break
    return err


def snapshot_rows_error(body: dict) -> str | None:
    """SNAPSHOT_ROWS {space, rows}: [[key, record], ...] (node.core.record). Values may be legacy
    ones (module comment): the donor holds them acknowledged."""
    err = space_name_error(body["space"])
    if err is None and len(body["rows"]) > limits.snapshot_chunk_rows_max:
        err = f"a snapshot chunk holds at most {limits.snapshot_chunk_rows_max} rows"
    for item in body["rows"] if err is None else ():
        if type(item) is not list or len(item) != 2 or type(item[1]) is not list or len(item[1]) != record.FIELDS:
            return "a snapshot row is [key, [value, origin id, lsn, hlc, deleted]]"
        key, rec = item
        value, origin, lsn, hlc, deleted = (rec[record.VALUE], rec[record.ORIGIN_ID], rec[record.LSN],
                                            rec[record.HLC], rec[record.DELETED])
        err = key_error(key) or value_error(value, legacy=True) or lsn_error(lsn)
        if err is None and (type(origin) is not int or not 0 <= origin <= limits.replica_id_max
                            or type(hlc) is not int or not 0 <= hlc <= limits.timestamp_us_max
                            or type(deleted) is not bool):
            err = "a snapshot record's origin id, hlc or deleted flag is out of bounds"
        if err:
            break
    return err
