"""The numbers a row carries (node/core/kinds.py) are protocol: WALs on disk and peers of the
previous release hold them, so they never change meaning. A frame written byte by byte as such a
file holds it reads back as the rows it names; the native scanner's copies (node/core/_rowscan.c)
read it the same; and codec.array_head writes each array size as the encoder does."""
import msgpack
import pytest

from node.core import codec, rowscan
from node.core.kinds import GROUP_NAMES, OP_NAMES
from node.core.messages import encode_rows
from node.core.rows import unpack_frame_txns

UUID = "0000000a-0000-4000-8000-00000000000b"

# [written_us, [txn, ...]] with the numbers spelled as literals, as an older WAL holds them:
# groups 0 default, 1 local, 2 cluster; ops 1 put, 2 delete, 3 space, 4 cluster, 5 nop
GOLDEN = msgpack.packb([7, [
    [1, 1, 0, 5, [[1, "s", "k", "v"], [2, "s", "d", None], [5, "s", "", None]]],
    [1, 4, 1, 6, [[1, "loc", "k", 1]]],
    [1, 5, 2, 7, [[4, "_cluster", UUID, {"id": 1, "address": "", "state": "member"}]]],
    [1, 6, 0, 8, [[3, "s2", "", {"local": False, "conflict": "lww"}]]],
]], use_bin_type=True)


def test_a_frame_written_by_the_numbers_on_disk_reads_back_as_the_rows_they_name():
    written_us, txns = unpack_frame_txns(GOLDEN)
    assert written_us == 7
    assert [GROUP_NAMES[t.group] for t in txns] == ["default", "local", "cluster", "default"]
    assert [[OP_NAMES[o.kind] for o in t.ops] for t in txns] == [["put", "delete", "nop"], ["put"], ["cluster"],
                                                                  ["space"]]
    assert [t.component for t in txns] == [1, 0, 1, 1]


def test_the_native_scanner_reads_the_numbers_of_plain_rows_as_the_exact_decoder_does():
    plain = msgpack.packb([7, [[1, 1, 0, 5, [[1, "s", "k", "v"], [2, "s", "d", None], [5, "s", "", None]]]]],
                          use_bin_type=True)
    data = encode_rows([plain])
    for scan in (rowscan.scan_rows(data), rowscan.scan_rows_py(data)):
        assert scan is not None
        assert scan.records([(0, 1, 1)]) == [("s", [(b"k", codec.pack(["v", 1, 1, 5, False])),
                                                    (b"d", codec.pack([None, 1, 2, 5, True]))])]


@pytest.mark.parametrize("n", [0, 1, 15, 16, 65535, 65536, 70000])
def test_an_array_head_is_what_the_encoder_writes_for_that_many_items(n):
    head = codec.array_head(n)
    assert codec.pack([None] * n) == head + b"\xc0" * n
