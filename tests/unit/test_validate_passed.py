"""The strings validate.py remembers as already checked: canonical uuids (is_uuid) and
well-formed addresses (address_error). What a set holds is taken without matching again; it holds
only strings that passed, and never more than _PASSED_MAX (it is emptied when full)."""
import uuid

import pytest

from node import limits
from node.core import validate


@pytest.fixture
def passed():
    """Both sets, emptied before and after the test (other tests fill them)."""
    sets = (validate._uuids_passed, validate._addresses_passed)
    saved = [set(s) for s in sets]
    for s in sets:
        s.clear()
    yield sets
    for s, old in zip(sets, saved):
        s.clear()
        s.update(old)


def test_a_uuid_that_passed_is_remembered_and_one_refused_is_not(passed):
    good, bad = str(uuid.uuid4()), "g" * 36
    assert validate.is_uuid(good) and not validate.is_uuid(bad)
    assert passed[0] == {good}


def test_a_remembered_uuid_is_taken_without_matching_again(passed):
    fake = "z" * 36                       # only a string that passed gets here: this shows the set is read
    passed[0].add(fake)
    assert validate.is_uuid(fake)
    assert not validate.is_uuid("z" * 37) and not validate.is_uuid(None)   # length and type come first


def test_an_address_that_passed_is_remembered_and_one_refused_is_not(passed):
    assert validate.address_error("a.example:7301") is None
    assert validate.address_error("a.example:0") is not None and validate.address_error("[::1]:x") is not None
    assert passed[1] == {"a.example:7301"}


def test_a_remembered_address_is_taken_without_matching_again_but_within_its_length(passed):
    passed[1].update({"not an address", "h" * (limits.address_bytes_max + 1)})
    assert validate.address_error("not an address") is None
    assert validate.address_error("h" * (limits.address_bytes_max + 1)) == f"an address is at most {limits.address_bytes_max} bytes"


@pytest.mark.parametrize("which", [0, 1])
def test_each_set_is_emptied_when_full_and_keeps_the_one_just_checked(passed, which):
    n = validate._PASSED_MAX
    for i in range(n + 1):
        if which == 0:
            assert validate.is_uuid(f"{i:08x}-0000-4000-8000-000000000000")
        else:
            assert validate.address_error(f"h{i}:1") is None
        assert len(passed[which]) == i % n + 1        # full at n: emptied, then the new one
    last = f"{n:08x}-0000-4000-8000-000000000000" if which == 0 else f"h{n}:1"
    assert passed[which] == {last}


# The lsn rule written inline (lsn_error's): a _cluster row's bound and lsn, a vclock by uuid's lsns.
_UUID = "67a9c378-7c65-41e5-82e2-e662f728b4fa"
_NOT_LSNS = [1.5, True, "5", None, -1, limits.lsn_max + 1]


@pytest.mark.parametrize("lsn", _NOT_LSNS[:3] + _NOT_LSNS[4:])
def test_a_cluster_members_bound_that_is_no_lsn_is_refused_by_lsn_errors_message(lsn):
    assert validate.cluster_fields_error(1, "", "expelled", lsn) == "_cluster expelled_lsn: " + validate.lsn_error(lsn)
    assert validate.cluster_fields_error(1, "", "expelled", None) is None                # no bound stated
    assert validate.cluster_fields_error(1, "", "expelled", 0) is None
    assert validate.cluster_fields_error(1, "", "expelled", limits.lsn_max) is None


@pytest.mark.parametrize("lsn", _NOT_LSNS)
def test_a_cluster_rows_lsn_that_is_no_lsn_is_refused_by_lsn_errors_message(lsn):
    from node.core.validate_msgs import cluster_row_error
    assert cluster_row_error([_UUID, 1, "", "member", lsn]) == "_cluster lsn: " + validate.lsn_error(lsn)
    assert cluster_row_error([_UUID, 1, "", "member", 0]) is None
    assert cluster_row_error([_UUID, 1, "", "member", limits.lsn_max, 0]) is None


@pytest.mark.parametrize("lsn", _NOT_LSNS)
def test_a_vclock_by_uuid_whose_lsn_is_no_lsn_is_refused(lsn):
    from node.core.validate_msgs import vclock_uuid_error
    assert vclock_uuid_error({_UUID: lsn}) == f"vclock component {_UUID}: {str(lsn)[:30]} is not uuid: lsn within bounds"
    assert vclock_uuid_error({_UUID: 0}) is None and vclock_uuid_error({_UUID: limits.lsn_max}) is None
