"""The WAL hold of a backup (node/ops/backup.py): while a backup process holds its hold file's lock,
the checkpoint collects nothing (node/core/holds.py keep_vclock with the hold's position); a hold left
by a backup that died is removed, not obeyed for ever."""
import fcntl
import logging
import multiprocessing
import os

from node.ops.backup import Hold, wal_holds
from node.core.holds import keep_vclock


def _hold_then_die(data_dir: str, ready) -> None:
    Hold(data_dir)
    ready.set()
    os._exit(0)          # dies holding it: the kernel drops the lock, the file stays


def test_a_live_hold_keeps_every_segment_and_is_gone_once_released(tmp_path):
    hold = Hold(str(tmp_path))
    holds = wal_holds(str(tmp_path))
    assert holds == [{}]
    assert keep_vclock({1: 500, 2: 40}, holds) == {1: 0, 2: 0}, "nothing is collectable while a backup copies"
    assert os.path.exists(hold.path)
    hold.release()
    assert wal_holds(str(tmp_path)) == [] and os.listdir(tmp_path) == []


def test_a_hold_left_by_a_backup_that_died_is_removed_by_the_next_checkpoint(tmp_path):
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    p = ctx.Process(target=_hold_then_die, args=(str(tmp_path), ready))
    p.start()
    p.join(30)
    assert ready.is_set() and [n for n in os.listdir(tmp_path) if n.endswith(".hold")]
    assert wal_holds(str(tmp_path)) == []
    assert os.listdir(tmp_path) == []


def test_a_visible_hold_is_locked_by_its_backup(tmp_path):
    hold = Hold(str(tmp_path))
    fd = os.open(hold.path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            locked = False
        except BlockingIOError:
            locked = True
    finally:
        os.close(fd)
    assert locked, "a hold is renamed into sight only once locked"
    hold.release()


def test_a_hold_released_between_the_checkpoints_open_and_its_lock_is_no_error(tmp_path, monkeypatch, caplog):
    """Nemesis seed 131: a backup ended (unlink, then unlock) between the checkpoint's open of its
    hold and the checkpoint's lock; the lock was free, the unlink found no file, and the
    checkpoint failed with FileNotFoundError ("a bug; the node serves on")."""
    hold = Hold(str(tmp_path))
    real_open = os.open

    def open_then_release(path, flags, *a):
        fd = real_open(path, flags, *a)
        hold.release()
        return fd
    monkeypatch.setattr(os, "open", open_then_release)
    with caplog.at_level(logging.WARNING):
        assert wal_holds(str(tmp_path)) == []
    assert "did not finish" not in caplog.text
    assert os.listdir(tmp_path) == []
