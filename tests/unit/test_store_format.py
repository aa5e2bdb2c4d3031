"""The store's format version (node/storage/store.py) and the store options (map_size,
disk_reserve_bytes in node/config.py): a store says which layout it has, and a replog that does
not know that layout refuses it with one line instead of reading it wrong."""
import lmdb
import pytest

from node import limits
from node.config import load
from node.errors import ConfigError, StorageError
from node.storage.store import STORE_FORMAT_VERSION, Store, read_only_view


def test_a_new_store_records_its_format_version(tmp_path):
    s = Store(str(tmp_path / "s"))
    assert s.get_meta("store_format") == STORE_FORMAT_VERSION
    s.close()
    assert read_only_view(str(tmp_path / "s"))["meta"]["store_format"] == STORE_FORMAT_VERSION


def test_a_store_from_before_format_versions_opens_as_version_1_and_is_marked(tmp_path):
    env = lmdb.open(str(tmp_path / "s"), max_dbs=8)
    meta = env.open_db(b"_meta")
    with env.begin(write=True, db=meta) as t:
        t.put(b"uuid", b"\xa3abc")
    env.close()
    s = Store(str(tmp_path / "s"))
    assert s.get_meta("store_format") == 1 and s.get_meta("uuid") == "abc"
    s.close()


@pytest.mark.parametrize("version", [STORE_FORMAT_VERSION + 1, 99])
def test_a_store_of_a_newer_format_is_refused_at_open_naming_both_versions(tmp_path, version):
    s = Store(str(tmp_path / "s"))
    s.set_meta(store_format=version)
    s.close()
    for open_it in (lambda: Store(str(tmp_path / "s")), lambda: read_only_view(str(tmp_path / "s"))):
        with pytest.raises(StorageError) as e:
            open_it()
        assert f"format version {version}, newer than this replog reads ({STORE_FORMAT_VERSION})" in str(e.value)


@pytest.mark.parametrize("version", ["1", 0, -3, 1.5])
def test_a_format_version_replog_never_writes_is_called_damage(tmp_path, version):
    s = Store(str(tmp_path / "s"))
    s.set_meta(store_format=version)
    s.close()
    with pytest.raises(StorageError, match="damaged"):
        Store(str(tmp_path / "s"))


def test_map_size_is_an_option_with_todays_default_and_bounds():
    assert load({}, env={}).map_size == limits.store_map_bytes_default == 1 << 36
    assert load({"map_size": str(limits.store_map_bytes_min)}, env={}).map_size == limits.store_map_bytes_min
    assert load({}, env={"REPLOG_MAP_SIZE": str(1 << 30)}).map_size == 1 << 30
    for bad in (limits.store_map_bytes_min - 1, limits.store_map_bytes_max + 1):
        with pytest.raises(ConfigError, match="map_size"):
            load({"map_size": str(bad)}, env={})
    with pytest.raises(ConfigError, match="map_size"):
        load({"map_size": "64GiB"}, env={})


def test_the_disk_reserve_is_an_option_and_cannot_be_negative():
    assert load({}, env={}).disk_reserve_bytes == limits.disk_reserve_bytes_default
    assert load({"disk_reserve_bytes": "0"}, env={}).disk_reserve_bytes == 0
    with pytest.raises(ConfigError, match="disk_reserve_bytes"):
        load({"disk_reserve_bytes": "-1"}, env={})


def test_a_store_opened_with_a_small_map_says_how_full_it_is(tmp_path):
    s = Store(str(tmp_path / "s"), map_size=limits.store_map_bytes_min)
    sp = s.space()
    assert sp["map_size"] == limits.store_map_bytes_min and 0 < sp["map_used"] < sp["map_size"]
    s.close()
    assert s.space() == {}, "a closed store reports nothing rather than failing"
