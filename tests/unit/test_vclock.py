"""The vector clock (node/core/vclock.py): follow only grows, the cached signature stays
equal to the sum of components, four-way compare checked both ways, ignore_zero,
permute through an id map, and the canonical text form `{1: 10, 2: 5}`."""

import pytest
from hypothesis import given, strategies as st

from node.core.vclock import Order, VClock, parse_vclock

INVERSE = {Order.BEFORE: Order.AFTER, Order.AFTER: Order.BEFORE,
           Order.EQUAL: Order.EQUAL, Order.CONCURRENT: Order.CONCURRENT}


def assert_order(a: VClock, b: VClock, expected: Order, *, ignore_zero: bool = False) -> None:
    """a ? b is `expected` and b ? a is its inverse, and <= / >= agree with both."""
    assert a.compare(b, ignore_zero=ignore_zero) is expected
    assert b.compare(a, ignore_zero=ignore_zero) is INVERSE[expected]
    if not ignore_zero:
        assert (a <= b) is (expected in (Order.BEFORE, Order.EQUAL))
        assert (a >= b) is (expected in (Order.AFTER, Order.EQUAL))
        assert (b <= a) is (expected in (Order.AFTER, Order.EQUAL))
        assert (b >= a) is (expected in (Order.BEFORE, Order.EQUAL))
        assert (a == b) is (expected is Order.EQUAL)


def assert_signature_consistent(v: VClock) -> None:
    assert v.signature == sum(v.to_dict().values())
    assert 0 not in v.to_dict().values()


# --- follow -----------------------------------------------------------------------

def test_follow_advances_one_component_and_the_signature():
    v = VClock({1: 10, 2: 5})
    v.follow(2, 7)
    v.follow(3, 1)
    assert v.to_dict() == {1: 10, 2: 7, 3: 1}
    assert v.signature == 18
    assert v[2] == 7 and v.get(4) == 0


@pytest.mark.parametrize("lsn", [5, 4, 0])
def test_follow_refuses_an_lsn_that_does_not_grow(lsn):
    v = VClock({1: 5})
    with pytest.raises(AssertionError):
        v.follow(1, lsn)
    assert v.to_dict() == {1: 5} and v.signature == 5


def test_follow_of_an_absent_component_refuses_zero():
    v = VClock()
    with pytest.raises(AssertionError):
        v.follow(1, 0)
    assert len(v) == 0 and v.signature == 0


# --- signature ----------------------------------------------------------------------

def test_zero_components_are_not_stored_and_do_not_count():
    v = VClock({1: 0, 2: 5, 0: 0})
    assert v.to_dict() == {2: 5}
    assert 1 not in v and 2 in v and len(v) == 1
    assert v.signature == 5
    assert v == VClock({2: 5})


def test_negative_components_are_refused():
    with pytest.raises(ValueError):
        VClock({1: -1})
    with pytest.raises(ValueError):
        VClock({-1: 1})


def test_a_component_given_twice_is_refused_rather_than_counted_twice():
    # From pairs (parse_vclock's path) a repeated replica id must not leave a signature
    # that disagrees with the components.
    with pytest.raises(ValueError):
        VClock([(1, 10), (1, 5)])
    with pytest.raises(ValueError):
        parse_vclock("{1: 10, 1: 5}")


def test_copy_is_independent_and_keeps_the_signature():
    a = VClock({1: 3, 2: 4})
    b = a.copy()
    b.follow(1, 9)
    assert a.to_dict() == {1: 3, 2: 4} and a.signature == 7
    assert b.to_dict() == {1: 9, 2: 4} and b.signature == 13


def test_merge_keeps_the_signature_in_step():
    a = VClock({1: 3, 2: 9})
    a.merge(VClock({1: 5, 2: 1, 3: 2}))
    assert a.to_dict() == {1: 5, 2: 9, 3: 2}
    assert a.signature == 16


OPS = st.lists(st.tuples(st.sampled_from(["follow", "merge", "copy", "permute"]),
                         st.integers(0, 5), st.integers(1, 50),
                         st.dictionaries(st.integers(0, 5), st.integers(0, 50), max_size=5)),
               max_size=30)


@given(OPS)
def test_signature_equals_the_sum_after_any_sequence_of_changes(ops):
    v = VClock()
    for op, rid, step, other in ops:
        if op == "follow":
            v.follow(rid, v.get(rid) + step)
        elif op == "merge":
            v.merge(VClock(other))
        elif op == "copy":
            v = v.copy()
        else:  # an injective renaming: rotate ids 0..5
            v = v.permute({i: (i + step) % 6 for i in range(6)})
        assert_signature_consistent(v)


# --- compare --------------------------------------------------------------------------

@pytest.mark.parametrize("a,b,expected", [
    ({}, {}, Order.EQUAL),
    ({1: 10, 2: 5}, {1: 10, 2: 5}, Order.EQUAL),
    ({1: 10, 2: 0}, {1: 10}, Order.EQUAL),
    ({}, {1: 1}, Order.BEFORE),
    ({1: 10, 2: 5}, {1: 10, 2: 6}, Order.BEFORE),
    ({1: 10}, {1: 10, 3: 1}, Order.BEFORE),
    ({1: 1, 2: 1}, {1: 2, 2: 2}, Order.BEFORE),
    ({1: 11, 2: 5}, {1: 10, 2: 5}, Order.AFTER),
    ({1: 10, 2: 5, 4: 1}, {1: 10, 2: 5}, Order.AFTER),
    ({1: 11, 2: 5}, {1: 10, 2: 6}, Order.CONCURRENT),
    ({1: 1}, {2: 1}, Order.CONCURRENT),
    ({0: 3, 1: 1}, {0: 1, 1: 2}, Order.CONCURRENT),
])
def test_compare_is_four_way_and_checked_both_ways(a, b, expected):
    assert_order(VClock(a), VClock(b), expected)


@pytest.mark.parametrize("a,b,plain,ignoring_zero", [
    ({0: 5, 1: 1}, {0: 1, 1: 1}, Order.AFTER, Order.EQUAL),
    ({0: 5, 1: 1}, {0: 1, 1: 2}, Order.CONCURRENT, Order.BEFORE),
    ({0: 1, 1: 3}, {0: 9, 1: 2}, Order.CONCURRENT, Order.AFTER),
    ({0: 7}, {}, Order.AFTER, Order.EQUAL),
    ({0: 7, 1: 1}, {2: 1}, Order.CONCURRENT, Order.CONCURRENT),
])
def test_ignore_zero_leaves_the_local_component_out(a, b, plain, ignoring_zero):
    assert_order(VClock(a), VClock(b), plain)
    assert_order(VClock(a), VClock(b), ignoring_zero, ignore_zero=True)


VCLOCKS = st.dictionaries(st.integers(0, 6), st.integers(0, 20), max_size=7).map(VClock)


def _componentwise(a: VClock, b: VClock) -> Order:
    ids = set(a) | set(b)
    le = all(a[i] <= b[i] for i in ids)
    ge = all(a[i] >= b[i] for i in ids)
    return Order.EQUAL if le and ge else Order.BEFORE if le else Order.AFTER if ge else Order.CONCURRENT


@given(VCLOCKS, VCLOCKS)
def test_compare_is_antisymmetric_and_matches_the_componentwise_definition(a, b):
    assert a.compare(b) is INVERSE[b.compare(a)]
    assert a.compare(b) is _componentwise(a, b)
    assert a.compare(b, ignore_zero=True) is INVERSE[b.compare(a, ignore_zero=True)]


@given(VCLOCKS)
def test_a_vclock_equals_itself_and_its_copy(a):
    assert_order(a, a.copy(), Order.EQUAL)


@given(VCLOCKS, VCLOCKS)
def test_merge_is_the_least_upper_bound(a, b):
    m = a.copy()
    m.merge(b)
    assert m.compare(a) in (Order.AFTER, Order.EQUAL)
    assert m.compare(b) in (Order.AFTER, Order.EQUAL)
    assert m.to_dict() == {i: max(a[i], b[i]) for i in set(a) | set(b)}
    assert_signature_consistent(m)
    other = b.copy()
    other.merge(a)
    assert other == m                       # commutative


# --- permute ------------------------------------------------------------------------------

def test_permute_renames_components_and_leaves_unknown_ones_out():
    v = VClock({0: 4, 1: 10, 2: 5, 3: 7})
    p = v.permute({1: 2, 2: 1, 0: 0})
    assert p.to_dict() == {0: 4, 2: 10, 1: 5}
    assert p.signature == 19
    assert 3 not in p
    assert v.to_dict() == {0: 4, 1: 10, 2: 5, 3: 7}     # the original is untouched


def test_permute_through_an_empty_map_is_empty():
    p = VClock({1: 3}).permute({})
    assert len(p) == 0 and p.signature == 0 and str(p) == "{}"


@given(VCLOCKS, st.permutations(range(7)))
def test_permuting_there_and_back_is_the_identity(v, perm):
    there = dict(enumerate(perm))
    back = {t: f for f, t in there.items()}
    assert v.permute(there).permute(back) == v


# --- text form -------------------------------------------------------------------------------

def test_canonical_text_form():
    v = VClock({2: 5, 1: 10})
    assert str(v) == "{1: 10, 2: 5}"
    assert repr(v) == "{1: 10, 2: 5}"
    assert parse_vclock("{1: 10, 2: 5}") == v
    assert parse_vclock("{1: 10, 2: 5}").signature == 15
    assert str(VClock()) == "{}"
    assert parse_vclock("{}") == VClock()
    assert parse_vclock("  {2:5 ,1 : 10}  ") == v


@pytest.mark.parametrize("text", ["", "1: 10", "{1: 10", "{1 10}", "{a: 1}", "{1: b}", "{1: 10,}", "{1: -1}"])
def test_parse_refuses_text_that_is_not_a_vclock(text):
    with pytest.raises(ValueError):
        parse_vclock(text)


@given(VCLOCKS)
def test_text_round_trip(v):
    back = parse_vclock(str(v))
    assert back == v
    assert back.signature == v.signature
    assert str(back) == str(v)
