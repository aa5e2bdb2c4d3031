"""Persistent identity: atomic files, strict loading, every crash point of the online process
(each in a real child process killed with os._exit), and the idempotent server-side apply."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import uuid as uuid_mod
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:   # tests/unit has no __init__.py and replog is not pip-installed
    sys.path.insert(0, str(REPO))

from node.errors import RemoteProtocolError, StorageError
from node.identity import identity_file as idf
from node.identity.identity_file import (
    ApplyOk, ApplyRejected, ApplyUnknown, Identity, IdentityFileError, PendingRegistration,
    RegistrationAction, RegistrationDecision, apply_answer, apply_registration, commit_identity,
    discard_pending, load_identity, load_pending, new_pending, new_register_code, write_pending,
)

NODE = "11111111-1111-4111-8111-111111111111"
OTHER = "22222222-2222-4222-8222-222222222222"
CLUSTER = "cccccccc-cccc-4ccc-8ccc-cccccccccccc"
CODE_A, CODE_B = "a" * 32, "b" * 32


def pending(requested_id=None, code=CODE_A) -> PendingRegistration:
    return PendingRegistration(NODE, requested_id, code, CLUSTER, 1700000000.5)


@pytest.fixture(autouse=True)
def no_fault_hook(monkeypatch):
    monkeypatch.setattr(idf, "FAULT_POINT", None)


# --- atomic writes ---------------------------------------------------------------------------

def test_pending_and_identity_round_trip(tmp_path):
    write_pending(tmp_path, pending(3))
    assert load_pending(tmp_path) == pending(3)
    assert load_identity(tmp_path) is None
    commit_identity(tmp_path, pending(3).granted(3))
    assert load_identity(tmp_path) == Identity(NODE, 3, CODE_A, CLUSTER, 1700000000.5, active=False)
    assert not (tmp_path / "identity.temp").exists()
    assert load_pending(tmp_path) is None


def test_an_identity_is_inactive_until_its_member_goes_active_and_stays_active_after(tmp_path):
    commit_identity(tmp_path, pending(3).granted(3))
    assert load_identity(tmp_path).active is False
    idf.mark_active(tmp_path)
    assert load_identity(tmp_path) == Identity(NODE, 3, CODE_A, CLUSTER, 1700000000.5, active=True)
    idf.mark_active(tmp_path)                       # idempotent
    assert load_identity(tmp_path).active is True


def test_an_identity_file_written_before_the_active_field_counts_as_active(tmp_path):
    body = {"format": idf.FORMAT_VERSION, "kind": "identity", "uuid": NODE, "replica_id": 3,
            "register_code": CODE_A, "cluster_uuid": CLUSTER, "created_s": 1700000000.5}
    body["crc32"] = idf._crc(body)
    (tmp_path / "identity").write_text(json.dumps(body))
    assert load_identity(tmp_path).active is True


def test_missing_files_mean_no_identity(tmp_path):
    assert load_identity(tmp_path) is None
    assert load_pending(tmp_path) is None
    assert load_identity(tmp_path / "absent") is None


def test_write_fsyncs_the_file_before_rename_and_the_directory_after(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append("fsync_dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "fsync_file")
        real_fsync(fd)

    def replace(src, dst):
        events.append(f"rename {Path(src).name} -> {Path(dst).name}")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    write_pending(tmp_path, pending())
    assert events == ["fsync_file", "rename .identity.temp.writing -> identity.temp", "fsync_dir"]
    events.clear()
    commit_identity(tmp_path, pending().granted(1))
    # identity durable first, then the temp removal made durable
    assert events == ["fsync_file", "rename .identity.writing -> identity", "fsync_dir", "fsync_dir"]


def test_failed_write_keeps_the_previous_file_whole(tmp_path, monkeypatch):
    write_pending(tmp_path, pending(1, CODE_A))

    def broken_fsync(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(IdentityFileError) as err:
        write_pending(tmp_path, pending(2, CODE_B))
    assert err.value.path == str(tmp_path / "identity.temp")
    assert isinstance(err.value, StorageError)
    monkeypatch.undo()
    assert load_pending(tmp_path) == pending(1, CODE_A)


def test_write_pending_over_an_identity_is_a_bug(tmp_path):
    commit_identity(tmp_path, pending().granted(1))
    with pytest.raises(AssertionError):
        write_pending(tmp_path, pending())


def test_discard_pending_removes_the_temp_and_tolerates_absence(tmp_path):
    write_pending(tmp_path, pending())
    discard_pending(tmp_path)
    assert load_pending(tmp_path) is None
    discard_pending(tmp_path)


def test_fault_hook_sees_each_crash_point_in_order(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(idf, "FAULT_POINT", seen.append)
    write_pending(tmp_path, pending())
    commit_identity(tmp_path, pending().granted(1))
    assert seen == ["after_temp_written", "after_identity_written", "after_temp_removed"]
    with pytest.raises(AssertionError):
        idf.fault_point("after_lunch")


# --- strict loading --------------------------------------------------------------------------

def _valid(name: str) -> bytes:
    value = pending(4) if name == "identity.temp" else pending(4).granted(4)
    return idf._encode(value)


def _bad_crc(name: str) -> bytes:
    doc = json.loads(_valid(name))
    doc["created_s"] = 1.0   # still valid JSON, but not what was written
    return json.dumps(doc).encode()


def _swapped_kind(name: str) -> bytes:
    return _valid("identity" if name == "identity.temp" else "identity.temp")


def _no_crc(name: str) -> bytes:
    doc = json.loads(_valid(name))
    del doc["crc32"]
    return json.dumps(doc).encode()


CORRUPTIONS = {
    "empty": lambda name: b"",
    "whitespace": lambda name: b" \n",
    "truncated": lambda name: _valid(name)[: len(_valid(name)) // 2],
    "garbage": lambda name: b"\x00\xff\xfe garbage \x80",
    "json_list": lambda name: b"[1, 2]",
    "checksum_mismatch": _bad_crc,
    "checksum_missing": _no_crc,
    "wrong_kind": _swapped_kind,
}


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_damaged_identity_file_is_an_error_naming_it_never_no_identity(tmp_path, corruption):
    path = tmp_path / "identity"
    path.write_bytes(CORRUPTIONS[corruption]("identity"))
    with pytest.raises(IdentityFileError) as err:
        load_identity(tmp_path)
    assert err.value.path == str(path) and str(path) in str(err.value)
    with pytest.raises(IdentityFileError):   # nor may the temp file be resumed past it
        load_pending(tmp_path)


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_damaged_temp_file_is_an_error_naming_it(tmp_path, corruption):
    path = tmp_path / "identity.temp"
    path.write_bytes(CORRUPTIONS[corruption]("identity.temp"))
    with pytest.raises(IdentityFileError) as err:
        load_pending(tmp_path)
    assert err.value.path == str(path) and str(path) in str(err.value)


def test_damaged_identity_leaves_the_temp_file_alone(tmp_path):
    write_pending(tmp_path, pending())
    (tmp_path / "identity").write_bytes(b"{")
    with pytest.raises(IdentityFileError):
        load_identity(tmp_path)
    assert (tmp_path / "identity.temp").exists()


@pytest.mark.parametrize("temp_content", ["valid", "garbage"])
def test_both_files_present_identity_wins_and_temp_is_removed(tmp_path, temp_content):
    write_pending(tmp_path, pending(4))
    (tmp_path / "identity").write_bytes(_valid("identity"))
    if temp_content == "garbage":
        (tmp_path / "identity.temp").write_bytes(b"\x00")
    assert load_identity(tmp_path).replica_id == 4
    assert not (tmp_path / "identity.temp").exists()


# --- crash points, each in a child process ---------------------------------------------------

CHILD = r'''
import asyncio, json, os, sys
from node.identity import identity_file as idf

data_dir, server_dir, point, hit_at, requested, lose = sys.argv[1:7]
hits = 0
def hook(name):
    global hits
    if name == point:
        hits += 1
        if hits == int(hit_at):
            os._exit(77)
idf.FAULT_POINT = hook

def load(name, default):
    try:
        with open(os.path.join(server_dir, name)) as f:
            return json.load(f)
    except FileNotFoundError:
        return default

def save(name, value):
    tmp = os.path.join(server_dir, name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(value, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(server_dir, name))

async def apply(pending):
    # the server survives the client's crash: its state lives in server_dir
    registry = {u: tuple(v) for u, v in load("registry.json", {}).items()}
    taken = {rid for rid, _ in registry.values()}
    lowest = min(i for i in range(1, len(taken) + 2) if i not in taken)
    result = idf.apply_registration(registry, pending.uuid, pending.requested_id, pending.register_code, lowest)
    applies = load("applies.json", [])
    applies.append([pending.register_code, pending.requested_id, result[0]])
    save("registry.json", registry)
    save("applies.json", applies)
    idf.fault_point("after_apply_sent")
    if len(applies) <= int(lose):
        return idf.ApplyUnknown("answer lost")
    return idf.apply_answer(result, lowest)

try:
    identity = asyncio.run(idf.register(
        data_dir, apply, new_uuid=sys.argv[7], cluster_uuid=sys.argv[8],
        requested_id=None if requested == "-" else int(requested), now_s=1700000000.0))
except idf.RegistrationPending as e:
    print(e)
    sys.exit(3)
print(json.dumps([identity.replica_id, identity.register_code]))
'''


class Harness:
    def __init__(self, tmp_path: Path):
        self.data = tmp_path / "data"
        self.server = tmp_path / "server"
        self.data.mkdir()
        self.server.mkdir()

    def run(self, point="-", hit_at=1, requested=None, lose=0) -> subprocess.CompletedProcess:
        args = [sys.executable, "-c", CHILD, str(self.data), str(self.server), point, str(hit_at),
                "-" if requested is None else str(requested), str(lose), NODE, CLUSTER]
        env = dict(os.environ, PYTHONPATH=str(REPO))
        return subprocess.run(args, capture_output=True, text=True, timeout=60, env=env)

    def applies(self) -> list:
        path = self.server / "applies.json"
        return json.loads(path.read_text()) if path.exists() else []

    def registry(self) -> dict:
        path = self.server / "registry.json"
        return {u: tuple(v) for u, v in json.loads(path.read_text()).items()} if path.exists() else {}

    def seed_registry(self, registry: dict) -> None:
        (self.server / "registry.json").write_text(json.dumps(registry))

    def files(self) -> set[str]:
        return {p.name for p in self.data.iterdir() if not p.name.startswith(".")}


@pytest.mark.parametrize("point", idf.FAULT_POINTS)
def test_crash_at_each_point_then_restart_ends_with_one_identity_and_one_code(tmp_path, point):
    h = Harness(tmp_path)
    crashed = h.run(point)
    assert crashed.returncode == 77, crashed.stderr
    if point in ("after_temp_written", "after_apply_sent", "after_apply_ok"):
        assert h.files() == {"identity.temp"}
    elif point == "after_identity_written":
        assert h.files() == {"identity", "identity.temp"}
    else:
        assert h.files() == {"identity"}
    code_before = json.loads((h.data / "identity.temp").read_text())["register_code"] \
        if (h.data / "identity.temp").exists() else load_identity(h.data).register_code
    applies_before = len(h.applies())

    restarted = h.run()
    assert restarted.returncode == 0, restarted.stderr
    assert h.files() == {"identity"}
    identity = load_identity(h.data)
    assert json.loads(restarted.stdout) == [identity.replica_id, identity.register_code]
    assert identity.register_code == code_before
    assert h.registry() == {NODE: (identity.replica_id, code_before)}
    assert all(code == code_before and outcome == "ok" for code, _, outcome in h.applies())
    # once identity is durable, a restart needs no apply at all
    expected_new = 0 if point in ("after_identity_written", "after_temp_removed") else 1
    assert len(h.applies()) == applies_before + expected_new


def test_lost_answer_is_retried_with_the_same_code_and_gets_the_same_id(tmp_path):
    h = Harness(tmp_path)
    result = h.run(lose=2)
    assert result.returncode == 0, result.stderr
    codes = {code for code, _, _ in h.applies()}
    assert len(h.applies()) == 3 and len(codes) == 1
    assert h.registry() == {NODE: (1, codes.pop())}


def test_answers_lost_every_time_keep_the_temp_file_for_the_next_start(tmp_path):
    h = Harness(tmp_path)
    gave_up = h.run(lose=10_000)
    assert gave_up.returncode == 3, gave_up.stderr
    assert h.files() == {"identity.temp"}
    code = load_pending(h.data).register_code
    assert h.run().returncode == 0
    assert load_identity(h.data).register_code == code
    assert {c for c, _, _ in h.applies()} == {code}


def test_only_an_explicit_rejection_starts_over_with_a_fresh_code(tmp_path):
    h = Harness(tmp_path)
    h.seed_registry({OTHER: (1, CODE_B)})
    # asked for id 1, rejected (taken by OTHER); die right after the fresh temp is durable
    crashed = h.run("after_temp_written", hit_at=2, requested=1)
    assert crashed.returncode == 77, crashed.stderr
    [(first_code, asked, outcome)] = h.applies()
    assert (asked, outcome) == (1, "rejected")
    fresh = load_pending(h.data)
    assert fresh.register_code != first_code and fresh.requested_id == 2
    assert h.run().returncode == 0
    identity = load_identity(h.data)
    assert (identity.replica_id, identity.register_code) == (2, fresh.register_code)
    assert h.registry() == {OTHER: (1, CODE_B), NODE: (2, fresh.register_code)}


def test_unfinished_registration_with_another_cluster_is_refused(tmp_path):
    h = Harness(tmp_path)
    write_pending(h.data, PendingRegistration(NODE, None, CODE_A, str(uuid_mod.UUID(int=7)), 0.0))
    result = h.run()
    assert result.returncode != 0 and "IdentityFileError" in result.stderr
    assert h.applies() == []


# --- the decision, pure ----------------------------------------------------------------------

def test_ok_answer_commits_the_granted_id():
    d = RegistrationDecision.decide(pending(), ApplyOk(5), CODE_B)
    assert d.action is RegistrationAction.COMMIT and d.identity == pending().granted(5)


def test_ok_with_another_id_than_requested_is_the_servers_fault():
    with pytest.raises(RemoteProtocolError):
        RegistrationDecision.decide(pending(3), ApplyOk(4), CODE_B)


def test_rejection_starts_over_with_the_fresh_code_and_the_next_id():
    d = RegistrationDecision.decide(pending(3), ApplyRejected("taken", next_id=6), CODE_B)
    assert d.action is RegistrationAction.START_OVER and d.identity is None
    assert d.pending == PendingRegistration(NODE, 6, CODE_B, CLUSTER, pending().created_s)
    with pytest.raises(AssertionError):
        RegistrationDecision.decide(pending(3), ApplyRejected("taken", 6), CODE_A)


def test_unknown_outcome_retries_the_same_pending():
    d = RegistrationDecision.decide(pending(3), ApplyUnknown("timeout"), CODE_B)
    assert d.action is RegistrationAction.RETRY and d.pending == pending(3)


def test_register_codes_are_fresh_and_seedable():
    assert new_register_code() != new_register_code()
    assert new_register_code(random.Random(1)) == new_register_code(random.Random(1))
    with pytest.raises(ValueError):
        PendingRegistration(NODE, 0, CODE_A, CLUSTER, 0.0)


# --- the server-side apply -------------------------------------------------------------------

def test_apply_is_idempotent_for_uuid_and_code():
    registry = {}
    assert apply_registration(registry, NODE, None, CODE_A, 1) == ("ok", 1)
    assert apply_registration(registry, NODE, None, CODE_A, 2) == ("ok", 1)
    assert apply_registration(registry, NODE, 1, CODE_A, 2) == ("ok", 1)
    assert registry == {NODE: (1, CODE_A)}


def test_apply_rejects_same_uuid_with_another_code_or_id_and_a_taken_id():
    registry = {NODE: (1, CODE_A)}
    assert apply_registration(registry, NODE, None, CODE_B, 2)[0] == "rejected"
    assert apply_registration(registry, NODE, 2, CODE_A, 2)[0] == "rejected"
    kind, reason = apply_registration(registry, OTHER, 1, CODE_B, 2)
    assert kind == "rejected" and NODE in reason
    assert registry == {NODE: (1, CODE_A)}
    assert apply_answer(("rejected", reason), 2) == ApplyRejected(reason, 2)
    with pytest.raises(AssertionError):   # the caller's lowest free id must be free
        apply_registration(registry, OTHER, None, CODE_B, 1)


UUIDS = [str(uuid_mod.UUID(int=i + 1)) for i in range(5)]
CODES = [c * 32 for c in "abc"]


def lowest_free(registry: dict) -> int:
    taken = {rid for rid, _ in registry.values()}
    return min(i for i in range(1, len(taken) + 2) if i not in taken)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(UUIDS), st.none() | st.integers(1, 7), st.sampled_from(CODES)),
                max_size=40))
def test_apply_never_duplicates_or_leaks_ids(ops):
    registry: dict = {}
    for uuid, requested, code in ops:
        before = dict(registry)
        lowest = lowest_free(registry)
        kind, value = apply_registration(registry, uuid, requested, code, lowest)
        if uuid in before:
            assert registry == before                      # a registration never changes
            same = before[uuid][1] == code and requested in (None, before[uuid][0])
            assert (kind, value) == ("ok", before[uuid][0]) if same else kind == "rejected"
        elif kind == "ok":
            assert registry == {**before, uuid: (value, code)}
            assert value == (lowest if requested is None else requested)
        else:
            assert registry == before and requested in {rid for rid, _ in before.values()}
        ids = [rid for rid, _ in registry.values()]
        assert len(ids) == len(set(ids))


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_clients_with_lost_answers_and_crashes_each_end_with_their_own_id(data):
    n = data.draw(st.integers(1, 4))
    rng = random.Random(data.draw(st.integers(0, 2**32)))
    registry: dict = {}
    disk = {u: new_pending(u, CLUSTER, data.draw(st.none() | st.integers(1, n + 1)), 0.0, rng)
            for u in UUIDS[:n]}
    done: dict = {}
    for step in range(400):
        if len(done) == n:
            break
        uuid = data.draw(st.sampled_from(sorted(set(disk) - set(done))))
        p = disk[uuid]
        faults = ["deliver", "lost_request", "lost_answer", "crash_after_apply"] if step < 40 else ["deliver"]
        fate = data.draw(st.sampled_from(faults))
        if fate == "lost_request":
            answer = ApplyUnknown("timeout")
        else:
            lowest = lowest_free(registry)
            answer = apply_answer(apply_registration(registry, uuid, p.requested_id, p.register_code, lowest), lowest)
            if fate == "crash_after_apply":
                continue                                 # the process died; identity.temp holds p
            if fate == "lost_answer":
                answer = ApplyUnknown("timeout")
        d = RegistrationDecision.decide(p, answer, new_register_code(rng))
        if d.action is RegistrationAction.COMMIT:
            done[uuid] = d.identity
        else:
            assert (d.pending.register_code != p.register_code) == isinstance(answer, ApplyRejected)
            disk[uuid] = d.pending
    assert len(done) == n
    assert registry == {u: (i.replica_id, i.register_code) for u, i in done.items()}
    assert len({i.replica_id for i in done.values()}) == n
