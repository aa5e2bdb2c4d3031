"""The machines' states (link applier and relay, join, rejoin) hash by identity, as they compare:
every transition looks its state up in its machine's _NEXT, and enum's own __hash__ is a Python
call (hash of the name) on that path. (Each test builds its machine: a mutant of a state class
is given the tests that run its module's functions.)"""
from node.core.lifecycle_join import JoinMachine, JoinState
from node.core.lifecycle_rejoin import RejoinMachine, RejoinState
from node.core.link.applier import ApplierMachine, ApplierState
from node.core.link.relay import RelayMachine, RelayState


def _hash_by_identity(states, machine) -> None:
    assert machine.state in states
    for s in states:
        assert hash(s) == object.__hash__(s)
        assert states(s.value) is s and {s: 1}[s] == 1


def test_an_applier_links_state_hashes_by_identity():
    _hash_by_identity(ApplierState, ApplierMachine(None, None, "a:1"))   # type: ignore[arg-type]


def test_a_relay_links_state_hashes_by_identity():
    _hash_by_identity(RelayState, RelayMachine(None))                     # type: ignore[arg-type]


def test_a_join_machines_state_hashes_by_identity():
    _hash_by_identity(JoinState, JoinMachine(None))                       # type: ignore[arg-type]


def test_a_rejoin_machines_state_hashes_by_identity():
    _hash_by_identity(RejoinState, RejoinMachine(None))                   # type: ignore[arg-type]
