"""node/lifecycle.py and node/faults.py helpers (fault points, store status and signatures from `_meta` and greetings)
and `replog admin` over stores built in place: concurrent stores, different clusters, mark-clean."""
from __future__ import annotations

import argparse
import fcntl
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:   # tests/unit has no __init__.py and replog is not pip-installed
    sys.path.insert(0, str(REPO))

from node import admin, faults, lifecycle
from node.cluster_space.table import Member
from node.errors import ConfigError
from node.identity import identity_file as idf
from node.identity import signature
from node.identity.signature import FinalSignature, InitialSignature, StoreStatus
from node.storage.store import Store

A, B = "aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa", "bbbbbbbb-bbbb-4bbb-8bbb-bbbbbbbbbbbb"
CLUSTER, OTHER = "11111111-1111-4111-8111-111111111111", "22222222-2222-4222-8222-222222222222"
SIG = InitialSignature(CLUSTER, 100.0, (A, B))


@pytest.fixture(autouse=True)
def no_fault_hook(monkeypatch):
    monkeypatch.setattr(idf, "FAULT_POINT", None)
    monkeypatch.setattr(faults, "_server_fault", {})


# --- fault points ------------------------------------------------------------------------------

def test_fault_point_spec_is_checked_and_server_points_count_down():
    with pytest.raises(ConfigError, match="unknown fault point"):
        faults.install_fault_points({"REPLOG_FAULT_POINT": "after_lunch"})
    with pytest.raises(ConfigError, match="integer"):
        faults.install_fault_points({"REPLOG_FAULT_POINT": "after_apply_ok:x"})
    faults.install_fault_points({"REPLOG_FAULT_POINT": "lose_apply_answer:2"})
    assert [faults.fault("lose_apply_answer") for _ in range(3)] == [True, True, False]
    faults.install_fault_points({"REPLOG_FAULT_POINT": "after_apply_ok"})
    idf.fault_point("after_temp_written")      # another point: the hook lets it pass
    assert idf.FAULT_POINT is not None


# --- store status and signatures -----------------------------------------------------------------

def test_store_status_from_meta():
    meta: dict = {}
    assert signature.stored_status(meta.get) == (StoreStatus.EMPTY, None, None)
    assert signature.stored_status(meta.get, transient=True)[0] is StoreStatus.TRANSIENT
    meta.update(uuid=A, cluster_uuid=CLUSTER, initial_signature=signature.initial_to_wire(SIG))
    assert signature.stored_status(meta.get) == (StoreStatus.DIRTY, SIG, None)
    final = FinalSignature({A: 3, B: 2}, "s1")
    meta.update(final_signature=signature.final_to_wire(final))
    assert signature.stored_status(meta.get) == (StoreStatus.DIRTY, SIG, final), "ran since: dirty"
    meta.update(store_status="clean")
    assert signature.stored_status(meta.get) == (StoreStatus.CLEAN, SIG, final)
    legacy = {"uuid": A, "cluster_uuid": CLUSTER, "created_s": 5.0, "founders": [B, A]}
    assert signature.stored_status(legacy.get)[1] == InitialSignature(CLUSTER, 5.0, (A, B))


def test_member_status_from_greetings_tolerates_junk():
    g = {"uuid": A, "options_digest": "d", "store": {"status": "clean", "initial": signature.initial_to_wire(SIG),
                                                       "final": {"vclock_by_uuid": {A: 1}, "shutdown_id": "s"}}}
    st = signature.member_status_from_greeting(g)
    assert st.status is StoreStatus.CLEAN and st.initial == SIG and st.final.shutdown_id == "s"
    for junk in (None, [], {"status": "shiny"}, {"status": "clean", "initial": None},
                 {"status": "dirty", "initial": {"cluster_uuid": CLUSTER}}, {"status": "empty", "proposal": 3}):
        assert signature.member_status_from_greeting({**g, "store": junk}) is None, junk
    assert signature.member_status_from_greeting({"uuid": A}) is None


# --- replog admin --------------------------------------------------------------------------------

def make_store(data_dir: Path, vclock: dict[int, int], initial: InitialSignature = SIG, uuid: str = A) -> str:
    s = Store(str(data_dir / "store"))
    try:
        s.put_cluster_member(Member(A, 1, "127.0.0.1:1", "member"))
        s.put_cluster_member(Member(B, 2, "127.0.0.1:2", "member"))
        s.set_meta(uuid=uuid, cluster_uuid=initial.cluster_uuid, cluster_name="replog",
                   initial_signature=signature.initial_to_wire(initial), store_status="dirty", vclock=vclock)
    finally:
        s.close()
    return str(data_dir)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    cmd = argv[0]
    ns = argparse.Namespace(admin_cmd=cmd, dir=argv[1] if cmd != "compare" else None, dirs=list(argv[1:]))
    rc = admin.main(ns)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_compare_reports_concurrent_stores_as_such(tmp_path, capsys):
    x = make_store(tmp_path / "x", {1: 5, 2: 3})
    y = make_store(tmp_path / "y", {1: 4, 2: 6}, uuid=B)
    rc, out, _ = run(capsys, "compare", x, y)
    assert rc == 0
    assert f"{x} is concurrent with {y}" in out and "same cluster: yes" in out
    assert "latest: none" in out and f"concurrent: {x} and {y}" in out
    z = make_store(tmp_path / "z", {1: 5, 2: 6})
    rc, out, _ = run(capsys, "compare", x, y, z)
    assert f"latest: {z}" in out and f"{x} is behind {z}" in out


def test_compare_tells_different_clusters_apart(tmp_path, capsys):
    x = make_store(tmp_path / "x", {1: 5})
    y = make_store(tmp_path / "y", {1: 5}, initial=InitialSignature(OTHER, 1.0, (B,)))
    rc, out, _ = run(capsys, "compare", x, y)
    assert rc == 1 and "same cluster: no" in out and "different clusters" in out


def test_mark_clean_signs_with_the_stores_vclock_and_refuses_a_running_node(tmp_path, capsys):
    x = make_store(tmp_path / "x", {1: 5, 2: 3})
    y = make_store(tmp_path / "y", {1: 5, 2: 3}, uuid=B)
    rc, out, _ = run(capsys, "mark-clean", x)
    assert rc == 0 and "marked clean" in out
    info = admin.load(x)
    assert info["status"] is StoreStatus.CLEAN and info["final"].vclock_by_uuid == {A: 5, B: 3}
    assert run(capsys, "mark-clean", x)[1].endswith(f"already clean (shutdown {info['final'].shutdown_id})\n")
    run(capsys, "mark-clean", y)
    assert admin.load(y)["final"] == info["final"], "equal stores marked by hand agree on one final signature"
    rc, out, _ = run(capsys, "inspect", x)
    assert rc == 0 and "status:" in out and "clean" in out and f"shutdown {info['final'].shutdown_id}" in out

    z = make_store(tmp_path / "z", {1: 1})
    fd = os.open(os.path.join(z, lifecycle.LOCK_FILE), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)   # as a running node holds it
        rc, _, err = run(capsys, "mark-clean", z)
        assert rc == 2 and "in use by a running replog node" in err
    finally:
        os.close(fd)
    empty = tmp_path / "empty"
    empty.mkdir()
    rc, _, err = run(capsys, "mark-clean", str(empty))
    assert rc == 2 and "empty" in err
    rc, out, _ = run(capsys, "inspect", str(empty))
    assert rc == 0 and "empty" in out
