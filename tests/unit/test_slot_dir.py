"""A lease slot's data directory and the version it last served under (node/identity/slot_dir.py):
kept for the next version (this node was the last holder) and past holders that never served,
moved aside once another node served the slot in between (as the same member), taken and
stamped without a stamp."""
from __future__ import annotations

import logging
import os

from node.identity import slot_dir


def make_dir(tmp_path, stamp: str | None) -> str:
    path = str(tmp_path / "slot-1")
    os.makedirs(os.path.join(path, "store"))
    with open(os.path.join(path, "store", "data.mdb"), "w") as f:
        f.write("rows")
    if stamp is not None:
        with open(os.path.join(path, slot_dir.STAMP_FILE), "w") as f:
            f.write(stamp)
    return path


def test_the_last_holder_keeps_its_dir_and_stamps_the_new_version(tmp_path):
    path = make_dir(tmp_path, "4\n")
    assert slot_dir.take(path, 1, 5) is None
    assert os.path.isfile(os.path.join(path, "store", "data.mdb"))
    assert slot_dir.read_stamp(path) == 5


def test_a_dir_from_before_another_holders_tenure_is_moved_aside_and_the_node_starts_empty(tmp_path, caplog):
    path = make_dir(tmp_path, "4\n")
    caplog.set_level(logging.WARNING, logger="replog")
    moved = slot_dir.take(path, 1, 6)                       # version 5 was another node's
    assert moved is not None and moved.startswith(path + ".stale-v4-")
    assert os.path.isfile(os.path.join(moved, "store", "data.mdb")), "the stale dir was not kept"
    assert sorted(os.listdir(path)) == [slot_dir.STAMP_FILE] and slot_dir.read_stamp(path) == 6
    assert any("served the slot since (version 5)" in r.getMessage() and moved in r.getMessage()
               for r in caplog.records)


def test_a_dir_is_kept_across_holders_that_never_served(tmp_path):
    """Versions 5 and 6 were held by nodes that never served (a standby that could not join):
    they wrote none of the member's rows, and the slot's `served` is still 4."""
    path = make_dir(tmp_path, "4\n")
    assert slot_dir.take(path, 1, 7, served=4) is None
    assert os.path.isfile(os.path.join(path, "store", "data.mdb")) and slot_dir.read_stamp(path) == 7


def test_a_dir_is_stale_once_a_later_holder_served(tmp_path, caplog):
    path = make_dir(tmp_path, "4\n")
    caplog.set_level(logging.WARNING, logger="replog")
    assert slot_dir.take(path, 1, 7, served=5) is not None
    assert any("served the slot since (version 5)" in r.getMessage() for r in caplog.records)


def test_a_dir_from_a_lease_store_made_anew_is_moved_aside(tmp_path, caplog):
    path = make_dir(tmp_path, "7\n")
    caplog.set_level(logging.WARNING, logger="replog")
    assert slot_dir.take(path, 1, 1) is not None
    assert any("made anew" in r.getMessage() for r in caplog.records)


def test_an_unreadable_stamp_is_taken_for_stale(tmp_path):
    path = make_dir(tmp_path, "garbage")
    assert slot_dir.read_stamp(path) == -1
    assert slot_dir.take(path, 1, 5) is not None


def test_a_dir_without_a_stamp_is_taken_as_it_is_and_a_new_one_is_made_with_a_stamp(tmp_path):
    path = make_dir(tmp_path, None)
    assert slot_dir.take(path, 1, 9) is None and slot_dir.read_stamp(path) == 9
    assert os.path.isfile(os.path.join(path, "store", "data.mdb"))
    fresh = str(tmp_path / "slot-2")
    assert slot_dir.take(fresh, 2, 1) is None and slot_dir.read_stamp(fresh) == 1
    assert slot_dir.take(fresh, 2, 1) is None, "the same acquisition taken again moved its own dir"


def test_mine_lists_the_slot_dirs_with_their_stamps_and_nothing_else(tmp_path):
    make_dir(tmp_path, "4\n")                                    # slot-1, stamped 4
    slot_dir.take(str(tmp_path / "slot-3"), 3, 2)
    os.makedirs(tmp_path / "slot-5")                             # no stamp
    os.makedirs(tmp_path / "slot-1.stale-v2-20261129T000000")
    (tmp_path / "slot-x").mkdir()
    assert slot_dir.mine(str(tmp_path)) == {1: 4, 3: 2}
    assert slot_dir.mine(str(tmp_path / "absent")) == {}


def test_a_dir_notes_the_version_it_served_at_apart_from_the_one_it_took_the_slot_at(tmp_path):
    """`served_version` is written when the slot records that the holder serves; `last_served`
    reads it, and without it (a dir from before that note, or one that never served) the
    version the dir took the slot at."""
    data = tmp_path
    path = make_dir(data, "4\n")
    assert slot_dir.last_served(str(data)) == {1: 4}                     # no note: as taken
    slot_dir.mark_served(path, 4)
    assert slot_dir.take(path, 1, 5) is None                              # taken again, not served at 5
    assert slot_dir.mine(str(data)) == {1: 5} and slot_dir.last_served(str(data)) == {1: 4}
    slot_dir.mark_served(path, 5)
    assert slot_dir.last_served(str(data)) == {1: 5}
    with open(os.path.join(path, slot_dir.SERVED_FILE), "w") as f:
        f.write("junk")
    assert slot_dir.last_served(str(data)) == {1: 5}                      # unreadable: as taken
    with open(os.path.join(path, slot_dir.SERVED_FILE), "w") as f:
        f.write("9\n")
    assert slot_dir.last_served(str(data)) == {1: 5}                      # past its take: as taken


def test_a_stale_dir_takes_its_served_note_aside_with_it(tmp_path):
    path = make_dir(tmp_path, "4\n")
    slot_dir.mark_served(path, 4)
    moved = slot_dir.take(path, 1, 7, served=5)
    assert moved is not None and slot_dir.read_stamp(moved, slot_dir.SERVED_FILE) == 4
    assert slot_dir.read_stamp(path, slot_dir.SERVED_FILE) is None
    assert slot_dir.last_served(str(tmp_path)) == {1: 7}
