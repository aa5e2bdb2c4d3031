"""The notes kept beside the identity (node/fence.py): `registered_members` must be on disk
before a registration is answered, so a store lost later still knows who may hold this node's
rows. On disk means the file's bytes and, when the append made the file, its name in the
directory (a file fsync'd into a directory entry that was not can vanish with the power)."""
from __future__ import annotations

import os

from node import fence


def syncs_seen(monkeypatch) -> list[str]:
    """Which fsyncs ran: 'file' for the note itself, 'dir:<path>' for a directory."""
    seen: list[str] = []
    real_fsync = os.fsync

    def fsync(fd):
        seen.append("file")
        return real_fsync(fd)

    def fsync_dir(path):
        seen.append(f"dir:{path}")
    monkeypatch.setattr(fence.os, "fsync", fsync)
    monkeypatch.setattr(fence, "fsync_dir", fsync_dir)
    return seen


def test_the_first_registration_syncs_the_note_and_the_directory_that_names_it(tmp_path, monkeypatch):
    seen = syncs_seen(monkeypatch)
    fence.remember_registration(str(tmp_path), "u-1")
    assert seen == ["file", f"dir:{tmp_path}"]
    assert fence.registered_members(str(tmp_path)) == {"u-1"}


def test_a_later_registration_syncs_the_note_only(tmp_path, monkeypatch):
    fence.remember_registration(str(tmp_path), "u-1")
    seen = syncs_seen(monkeypatch)
    fence.remember_registration(str(tmp_path), "u-2")
    assert seen == ["file"]
    fence.remember_registration(str(tmp_path), "u-2")          # known: nothing written
    assert seen == ["file"]
    assert fence.registered_members(str(tmp_path)) == {"u-1", "u-2"}


def test_a_note_written_without_sync_syncs_nothing(tmp_path, monkeypatch):
    seen = syncs_seen(monkeypatch)
    fence._append_synced(str(tmp_path / "notes"), "x\n", sync=False)
    assert seen == [] and (tmp_path / "notes").read_text() == "x\n"
