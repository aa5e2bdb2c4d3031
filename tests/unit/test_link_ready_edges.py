"""node/core/link/ready.py, the Ready contract on its own: a Ready is something to act on when
any one of its four parts holds anything; its `stop` is the Stop among the effects, wherever it
sits; an Outbox with nothing pending hands out EMPTY, which needs no advance; a Ready is
advanced only if this outbox handed it out, once, in any order, and claimed rows handed out
hold the next take until they are advanced."""
from __future__ import annotations

import pytest

from node.core.link.ready import EMPTY, Hold, Outbox, Ready, Send, Stop


@pytest.mark.parametrize("part", ["persist", "send", "apply", "effects"])
def test_a_ready_with_anything_in_any_one_part_is_something_to_act_on(part):
    assert Ready(**{part: ("x",)})
    assert not Ready()


def test_the_stop_of_a_ready_is_the_stop_among_its_effects_wherever_it_sits():
    stop = Stop(note="bye")
    assert Ready(effects=(Hold("u", False), stop)).stop is stop
    assert Ready(effects=(Hold("u", False),)).stop is None
    assert Ready().stop is None


def test_an_outbox_with_nothing_pending_hands_out_empty_which_needs_no_advance():
    box = Outbox()
    assert box.take() is EMPTY and box.take() is EMPTY
    box.send.append(Send(5, {}))
    rd = box.take()
    assert rd.send == (Send(5, {}),)
    box.advance(rd)
    box.advance(EMPTY)


def test_readies_handed_out_are_advanced_in_any_order_each_once():
    box = Outbox()
    box.send.append(Send(5, {}))
    first = box.take()
    box.apply.append("learned")
    second = box.take()
    box.advance(second)
    box.advance(first)
    with pytest.raises(AssertionError, match="did not hand out, or twice"):
        box.advance(first)


def test_a_ready_this_outbox_did_not_hand_out_is_refused_while_another_is_out():
    box = Outbox()
    box.send.append(Send(5, {}))
    out = box.take()
    with pytest.raises(AssertionError, match="did not hand out"):
        box.advance(Ready(send=(Send(5, {}),)))
    box.advance(out)


def test_claimed_rows_handed_out_hold_the_next_take_until_advanced():
    box = Outbox()
    box.persist.append("entry")
    with pytest.raises(AssertionError, match="not handed over"):
        box.assert_claims_taken()
    rd = box.take()
    with pytest.raises(AssertionError, match="advance first"):
        box.take()
    with pytest.raises(AssertionError, match="not advanced"):
        box.assert_claims_taken()
    box.advance(rd)
    box.assert_claims_taken()
    assert box.take() is EMPTY
