"""Tests of the pure lease core (node/identity/lease.py): encoding, every decision, clock edges.

Time is an argument everywhere here, so each boundary (expiry exactly at now, the renewal
deadline) is pinned with plain integers; no store, no clock, no threads."""

import ast
import pathlib
import sys

import pytest
from hypothesis import given, strategies as st

REPO = pathlib.Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:   # tests/unit has no __init__.py and replog is not pip-installed
    sys.path.insert(0, str(REPO))

from node import limits
from node.identity import lease as core
from node.identity.lease import Corrupt, Lease, LeaseCorrupt

D = 15_000   # lease duration, ms
UUID = "6f1c2a4e-0000-4000-8000-000000000001"


def free(slot=0, version=0):
    return Lease(slot=slot, task_id=None, version=version, expires_ms=0, member_uuid=UUID, nonce="n0")


def held(slot=0, version=1, expires_ms=10_000, task_id="task-a", **kw):
    return Lease(slot=slot, task_id=task_id, version=version, expires_ms=expires_ms,
                 member_uuid=UUID, nonce="n1", **kw)


# --- purity -------------------------------------------------------------------------

def test_core_imports_no_io_clock_or_randomness():
    src = pathlib.Path(core.__file__).read_text()
    imported = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    forbidden = {"asyncio", "time", "os", "socket", "random", "threading", "boto3", "botocore",
                 "aiohttp", "lmdb", "fcntl", "datetime", "uuid"}
    assert imported & forbidden == set()


# --- encoding -------------------------------------------------------------------------

def test_encode_decode_round_trip_keeps_every_field():
    lease = held(slot=3, version=7, known_versions={0: 2, 3: 7}, serial=12)
    assert core.decode(core.encode(lease), 3) == lease


@given(slot=st.integers(0, 4095), version=st.integers(0, 2**40), expires=st.integers(0, 2**50),
       task=st.one_of(st.none(), st.text(min_size=1, max_size=40)),
       kv=st.dictionaries(st.integers(0, 4095), st.integers(0, 2**40), max_size=20),
       serial=st.integers(0, 2**40), nonce=st.text(max_size=40))
def test_any_valid_lease_survives_encoding(slot, version, expires, task, kv, serial, nonce):
    lease = Lease(slot=slot, task_id=task, version=version, expires_ms=expires, member_uuid=UUID,
                  known_versions=kv, serial=serial, nonce=nonce)
    assert core.decode(core.encode(lease), slot) == lease


def test_two_writes_of_the_same_lease_never_have_equal_bytes():
    # The S3 ETag is the body's MD5: equal bodies would let a stale token match again.
    lease = held(expires_ms=10_000)
    a = core.renew(lease, 1_000, D, {}, nonce="x")
    b = core.renew(lease, 1_000, D, {}, nonce="y")
    assert core.encode(a) != core.encode(b)
    assert core.renew(a, 2_000, D, {}, nonce="z").serial == a.serial + 1


@pytest.mark.parametrize("body", [b"", b"\x00\xff garbage", b"[]", b'{"format": 1}', b"null",
                                  b'{"format": 99, "slot": 0}', b"[" * 100_000])
def test_decode_of_garbage_raises_lease_corrupt_naming_the_slot(body):
    with pytest.raises(LeaseCorrupt) as e:
        core.decode(body, 5)
    assert e.value.slot == 5 and "slot 5" in str(e.value)


def test_decode_refuses_a_body_that_names_another_slot():
    with pytest.raises(LeaseCorrupt, match="says slot 2"):
        core.decode(core.encode(held(slot=2)), 4)


def test_decode_refuses_wrong_types_and_oversized_bodies():
    doc = core.encode(held()).replace(b'"version":1', b'"version":"1"')
    with pytest.raises(LeaseCorrupt):
        core.decode(doc, 0)
    with pytest.raises(LeaseCorrupt, match="bytes"):
        core.decode(b" " * (limits.lease_body_bytes_max + 1), 0)


def test_decode_state_maps_absent_and_corrupt_to_values():
    assert core.decode_state(None, 1) is None
    assert core.decode_state(b"junk", 1) == Corrupt(1, core.decode_state(b"junk", 1).reason)
    assert core.decode_state(core.encode(free(slot=1)), 1) == free(slot=1)


def test_lease_validates_when_built():
    with pytest.raises(ValueError):
        Lease(slot=-1, task_id=None, version=0, expires_ms=0, member_uuid=UUID)
    with pytest.raises(ValueError):
        Lease(slot=0, task_id="", version=0, expires_ms=0, member_uuid=UUID)
    with pytest.raises(ValueError):
        Lease(slot=0, task_id=None, version=-1, expires_ms=0, member_uuid=UUID)


# --- is_free / choose_slot ----------------------------------------------------------------

def test_is_free_at_the_expiry_boundary():
    lease = held(expires_ms=10_000)
    assert not core.is_free(lease, 9_999)
    assert core.is_free(lease, 10_000)      # expiry exactly at now: expired
    assert core.is_free(lease, 10_001)
    assert core.is_free(free(), 0)          # released / never held


def test_choose_slot_takes_the_first_free_in_slot_order():
    leases = [held(slot=0), free(slot=1), free(slot=2)]
    assert core.choose_slot(leases, 5_000) == 1


def test_choose_slot_takes_an_expired_slot_exactly_at_its_expiry():
    leases = [held(slot=0, expires_ms=20_000), held(slot=1, expires_ms=10_000), free(slot=2)]
    assert core.choose_slot(leases, 9_999) == 2
    assert core.choose_slot(leases, 10_000) == 1


def test_choose_slot_treats_corrupt_as_expired_and_absent_as_free():
    assert core.choose_slot([held(slot=0), Corrupt(1, "junk")], 5_000) == 1
    assert core.choose_slot([held(slot=0), None], 5_000) == 1


def test_choose_slot_takes_the_slot_whose_data_this_node_holds_if_nobody_held_it_since():
    leases = [free(slot=0, version=3), held(slot=1, version=4, expires_ms=20_000), free(slot=2, version=7)]
    assert core.choose_slot(leases, 5_000, {2: 7}) == 2                 # not the first free one
    # held, at the version this node's data served under: its own previous process; wait for it
    assert core.choose_slot(leases, 5_000, {1: 4}) is None
    assert core.choose_slot(leases, 20_000, {1: 4}) == 1                # expired: taken
    # another node held slot 2 since (version 7, this node's data at 6): any slot, as before
    assert core.choose_slot(leases, 5_000, {2: 6}) == 0
    assert core.choose_slot(leases, 5_000, {9: 1, 0: 2}) == 0           # no such slot, an older version
    assert core.choose_slot([Corrupt(0, "junk"), free(slot=1, version=2)], 5_000, {0: 1}) == 0


def test_choose_slot_takes_this_nodes_slot_back_across_holders_that_never_served():
    """Slot 1 went through versions 5 and 6 after this node's data served under 4, but neither
    holder served (`served` is still 4): this node's data is still the member's."""
    never = free(slot=1, version=6)
    never = Lease(**{**{f: getattr(never, f) for f in never.__slots__}, "served": 4})
    leases = [free(slot=0, version=3), never]
    assert core.choose_slot(leases, 5_000, {1: 4}) == 1                 # not the first free one
    assert core.choose_slot(leases, 5_000, {1: 3}) == 0                 # served since 3: not current
    held_by_one_not_serving = held(slot=1, version=7, expires_ms=20_000, served=4)
    assert core.choose_slot([free(slot=0), held_by_one_not_serving], 20_000, {1: 4}) == 1


def test_a_holder_that_has_not_served_is_preempted_by_the_dir_that_served_last_and_only_by_it():
    """Slot 1 is held at version 7 by a node that has not served (`served` is 4): the dir that
    served under 4 takes it over at once; it does not wait for a lease that a holder unable to
    join would renew forever."""
    standby = held(slot=1, version=7, expires_ms=20_000, served=4)
    assert core.preemptable(standby, 5_000, 4)
    assert core.choose_slot([free(slot=0), standby], 5_000, {1: 4}) == 1
    taken = core.acquire(standby, "owner", 5_000, D, nonce="x", stamp=4)
    assert (taken.task_id, taken.version, taken.served, taken.expires_ms) == ("owner", 8, 4, 5_000 + D)
    assert core.needs_wait_for_peers(standby), "the holder it took the slot from may still run"
    # a dir the slot was taken into later, by a holder that never served: no rows of the member
    assert not core.preemptable(standby, 5_000, 6) and not core.preemptable(standby, 5_000, 7)
    assert core.choose_slot([held(slot=0), standby], 5_000, {1: 6}) is None
    with pytest.raises(AssertionError):
        core.acquire(standby, "other", 5_000, D, nonce="x", stamp=6)
    with pytest.raises(AssertionError):
        core.acquire(standby, "other", 5_000, D, nonce="x")
    # a holder that serves, or a body that does not say (served None: every holder served), is waited for
    serving = held(slot=1, version=7, expires_ms=20_000, served=7)
    unrecorded = held(slot=1, version=7, expires_ms=20_000)
    for lease in (serving, unrecorded):
        assert not core.preemptable(lease, 5_000, 7) and not core.preemptable(lease, 5_000, 4)
        assert core.choose_slot([free(slot=0), lease], 5_000, {1: 7}) is None
    # free or expired is not "preempted": taken as any free slot is
    assert not core.preemptable(free(slot=1, version=7), 5_000, 4)
    assert not core.preemptable(standby, 20_000, 4) and core.choose_slot([free(slot=0), standby], 20_000, {1: 4}) == 1
    assert not core.preemptable(None, 5_000, 4) and not core.preemptable(Corrupt(1, "junk"), 5_000, 4)


def test_a_dir_that_took_the_slot_again_and_stopped_before_serving_preempts_by_the_version_it_served_at():
    """The owner's dir served at 4, took the slot again at 5 and stopped before it served (no
    row under 5); a standby holds it at 6 and has not served (`served` is 4). By the version it
    last took the slot at (5) the dir did not serve last and waited; by the one it served at
    (slot_dir.last_served: 4) it did, and takes the slot."""
    standby = held(slot=1, version=6, expires_ms=20_000, served=4)
    assert core.choose_slot([held(slot=0), standby], 5_000, {1: 5}) is None
    assert core.choose_slot([held(slot=0), standby], 5_000, {1: 5}, {1: 4}) == 1
    assert core.choose_slot([held(slot=0), standby], 5_000, {1: 5}, {1: 3}) is None   # served before 4: stale
    assert core.choose_slot([held(slot=0), standby], 5_000, {1: 5}, {0: 4}) is None   # another slot's note
    assert core.acquire(standby, "owner", 5_000, D, nonce="x", stamp=4).version == 7


def test_served_is_kept_by_acquire_and_release_and_set_by_a_serving_renewal():
    lease = core.acquire(core.new_slot(0, UUID, nonce="a"), "t", 1_000, D, nonce="b")
    assert (lease.version, lease.served) == (1, 0), "a new holder has not served yet"
    lease = core.renew(lease, 2_000, D, {}, nonce="c")
    assert lease.served == 0
    lease = core.renew(lease, 3_000, D, {}, nonce="d", serving=True)
    assert lease.served == 1 and core.decode(core.encode(lease), 0) == lease
    lease = core.acquire(core.release(lease, nonce="e"), "u", 4_000, D, nonce="f")
    assert (lease.version, lease.served) == (2, 1)


def test_a_body_without_served_counts_every_holder_as_served():
    body = core.encode(held(version=7))
    assert b"served" not in body
    lease = core.decode(body, 0)
    assert lease.served is None and core.served_version(lease) == 7
    assert core.acquire(lease, "t", 20_000, D, nonce="x").served == 7


def test_a_served_version_past_the_slots_version_is_corrupt():
    body = core.encode(held(version=3)).replace(b'"serial"', b'"served":4,"serial"')
    with pytest.raises(LeaseCorrupt, match="served"):
        core.decode(body, 0)
    body = core.encode(held(version=3)).replace(b'"serial"', b'"served":"1","serial"')
    with pytest.raises(LeaseCorrupt, match="served"):
        core.decode(body, 0)


def test_choose_slot_returns_none_when_every_slot_is_held():
    assert core.choose_slot([held(slot=0), held(slot=1)], 5_000) is None
    assert core.choose_slot([], 5_000) is None


# --- acquire / renew / release ----------------------------------------------------------------

def test_acquire_bumps_the_version_and_keeps_the_member_uuid():
    got = core.acquire(free(version=4), "task-b", 1_000, D, nonce="n")
    assert (got.task_id, got.version, got.expires_ms, got.member_uuid) == ("task-b", 5, 1_000 + D, UUID)
    assert got.known_versions[0] == 5


def test_acquire_of_an_expired_lease_exactly_at_expiry():
    got = core.acquire(held(version=3, expires_ms=10_000), "task-b", 10_000, D, nonce="n")
    assert got.version == 4 and got.task_id == "task-b"


def test_acquire_of_a_held_lease_is_a_bug():
    with pytest.raises(AssertionError):
        core.acquire(held(expires_ms=10_000), "task-b", 9_999, D, nonce="n")


def test_renew_extends_expiry_keeps_version_and_merges_known_versions_upward():
    lease = held(version=3, expires_ms=10_000, known_versions={1: 5, 2: 2})
    got = core.renew(lease, 6_000, D, {1: 4, 2: 9, 3: 1}, nonce="n")
    assert got.version == 3 and got.expires_ms == 6_000 + D
    assert got.known_versions == {1: 5, 2: 9, 3: 1}
    assert got.member_uuid == UUID and got.serial == lease.serial + 1


def test_renew_past_the_deadline_is_a_bug():
    lease = held(expires_ms=10_000)
    deadline = core.renew_deadline(lease, D)
    core.renew(lease, deadline - 1, D, {}, nonce="n")
    with pytest.raises(AssertionError):
        core.renew(lease, deadline, D, {}, nonce="n")


def test_release_clears_holder_and_expiry_and_keeps_version():
    got = core.release(held(version=6), nonce="n")
    assert (got.task_id, got.version, got.expires_ms, got.member_uuid) == (None, 6, 0, UUID)
    assert core.acquire(got, "task-c", 1, D, nonce="m").version == 7


# --- waiting for peers, deadlines ----------------------------------------------------------------

def test_needs_wait_for_peers_only_when_the_previous_holder_did_not_release():
    assert core.needs_wait_for_peers(held(expires_ms=10_000)) is True
    assert core.needs_wait_for_peers(core.release(held(), nonce="n")) is False
    assert core.needs_wait_for_peers(free()) is False
    assert core.needs_wait_for_peers(None) is False
    assert core.needs_wait_for_peers(Corrupt(0, "junk")) is True
    assert core.peer_wait_until_ms(1_000, D) == 1_000 + D


def test_renew_interval_is_a_third_of_the_duration():
    assert core.renew_interval_ms(15_000) == 5_000


def test_renew_deadline_falls_after_two_renewals_and_before_anyone_can_take_the_slot():
    written = 100_000
    lease = held(expires_ms=written + D)
    deadline = core.renew_deadline(lease, D)
    assert deadline == lease.expires_ms - core.safety_margin_ms(D)
    assert written + 2 * core.renew_interval_ms(D) < deadline < lease.expires_ms
    assert not core.is_free(lease, deadline)   # at the deadline nobody else may take it yet


def test_next_renew_is_a_third_after_the_write_and_retries_sooner_after_a_failure():
    lease = held(expires_ms=100_000 + D)
    assert core.next_renew_ms(lease, D) == 100_000 + 5_000
    assert core.next_renew_ms(lease, D, failed_at_ms=105_000) == 105_000 + core.retry_interval_ms(D)
    late = core.renew_deadline(lease, D) - 1
    assert core.next_renew_ms(lease, D, failed_at_ms=late) == core.renew_deadline(lease, D)


# --- fencing -------------------------------------------------------------------------------------

def test_check_fencing_refuses_only_versions_older_than_seen():
    seen = {2: 5}
    assert core.check_fencing(seen, 2, 4) is False
    assert core.check_fencing(seen, 2, 5) is True
    assert core.check_fencing(seen, 2, 6) is True
    assert core.check_fencing(seen, 3, 1) is True        # never seen: nothing to fence


def test_note_version_never_lowers_a_seen_version():
    seen = core.note_version({2: 5}, 2, 3)
    assert seen == {2: 5}
    assert core.note_version(seen, 2, 8) == {2: 8}


def test_recover_version_uses_the_highest_version_on_record():
    leases = [held(slot=0, version=2, known_versions={1: 7}), Corrupt(1, "junk"),
              held(slot=2, version=1, known_versions={1: 9})]
    assert core.recover_version(leases, 1) == 9
    assert core.recover_version([None, Corrupt(1, "x")], 1) == 0


@pytest.mark.parametrize("field, value", [
    ("member_uuid", "not-a-uuid"), ("member_uuid", UUID.upper()), ("version", 2**70), ("serial", 2**64),
    ("expires_ms", 2**63), ("known_versions", {"0": 2**70}), ("nonce", "n" * 100_000),
])
def test_decode_refuses_a_body_whose_fields_no_node_could_have_written(field, value):
    """What is read back from a file or an S3 object is input: a member uuid that is not one
    became the node's uuid (every peer then refused its greetings), and a version past int64
    made every greeting fail to encode (each link died as a bug)."""
    import json
    doc = json.loads(core.encode(held(known_versions={0: 1})))
    doc[field] = value
    with pytest.raises(LeaseCorrupt):
        core.decode(json.dumps(doc).encode(), 0)


def test_the_largest_valid_fields_still_encode_in_a_greeting():
    import msgpack
    lease = held(version=limits.lease_int_max - 1, serial=limits.lease_int_max, expires_ms=limits.lease_int_max,
                 known_versions={0: limits.lease_int_max})
    assert core.decode(core.encode(lease), 0) == lease
    msgpack.packb({"slot": 0, "version": lease.version + 1, "seen": lease.known_versions})
