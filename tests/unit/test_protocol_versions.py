"""The protocol version range (node/core/session.py negotiate/accepted, node/applier/conn.py): the
highest version both sides speak, a version-2 relay (HELLO without `versions`) and a version-2
applier (AUTH without `version`) understood, anything outside the range refused naming both."""
import pytest

from node.core import messages as m
from node.core import session as sess

OURS = (m.PROTOCOL_VERSION_MIN, m.PROTOCOL_VERSION)


def test_this_release_speaks_its_own_version_and_the_one_before():
    assert m.PROTOCOL_VERSION_MIN == m.PROTOCOL_VERSION - 1


def test_two_nodes_of_this_release_settle_on_the_highest_version():
    assert sess.negotiate(OURS, OURS[0], list(OURS)) == m.PROTOCOL_VERSION


def test_a_relay_of_the_previous_version_is_spoken_to_in_its_version():
    assert sess.negotiate(OURS, m.PROTOCOL_VERSION - 1) == m.PROTOCOL_VERSION - 1


@pytest.mark.parametrize("theirs", [(1, 1), (m.PROTOCOL_VERSION + 1, m.PROTOCOL_VERSION + 3)])
def test_a_relay_outside_the_range_is_refused_naming_both_ranges(theirs):
    why = sess.negotiate(OURS, theirs[0], list(theirs) if theirs[0] != theirs[1] else None)
    assert isinstance(why, str)
    assert str(theirs[0]) in why and f"this node {OURS[0]}..{OURS[1]}" in why


def test_ranges_that_overlap_settle_on_the_highest_common_version():
    assert sess.negotiate((2, 5), 4, [4, 9]) == 5
    assert sess.negotiate((2, 3), 1, [1, 2]) == 2


@pytest.mark.parametrize("versions", [[3], [3, 2], ["2", 3], [True, 3], [0, 3], {"lo": 2}, [2, 1 << 40]])
def test_a_malformed_version_range_is_refused_not_guessed(versions):
    assert isinstance(sess.negotiate(OURS, 2, versions), str)


@pytest.mark.parametrize("version,ok", [(m.PROTOCOL_VERSION_MIN, True), (m.PROTOCOL_VERSION, True),
                                        (m.PROTOCOL_VERSION_MIN - 1, False), (m.PROTOCOL_VERSION + 1, False),
                                        ("3", False), (True, False), (None, False)])
def test_a_relay_accepts_exactly_the_versions_of_its_range(version, ok):
    assert (sess.accepted(OURS, version) is None) is ok


def test_the_version_is_part_of_what_the_proofs_cover():
    sn, cn = b"s" * sess.NONCE_BYTES, b"c" * sess.NONCE_BYTES
    a = sess.transcript(m.PROTOCOL_VERSION, sn, "relay", cn, "applier")
    b = sess.transcript(m.PROTOCOL_VERSION_MIN, sn, "relay", cn, "applier")
    assert not sess.proof_ok(b"k", sess.CLIENT, b, sess.proof(b"k", sess.CLIENT, a))
