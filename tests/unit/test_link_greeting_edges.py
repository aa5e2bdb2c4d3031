"""node/core/link/greeting.py: every lasting reason to refuse a peer, and the one lie (a greeting
naming another uuid than its handshake proved), each at its edge: the uuid check only when a
handshake proved one, the cluster uuid compared only when both sides have one, a must-match
option named with the refuser's value, options that are absent or not a map read as none."""
from __future__ import annotations

import pytest

from node.core.link.greeting import check_greeting
from node.errors import PeerRefused, RemoteProtocolError
from node.identity.signature import options_digest

ME, PEER, CLUSTER, OTHER_CLUSTER = ("aaaaaaaa-0000-4000-8000-000000000001", "bbbbbbbb-0000-4000-8000-000000000002",
                                    "cccccccc-0000-4000-8000-000000000003", "dddddddd-0000-4000-8000-000000000004")
OPTIONS = {"cluster_name": "c", "identity": "local", "cluster_size": 3}


def _greeting(uuid: str, cluster_uuid: str | None = CLUSTER, options: dict | None = None, **kw) -> dict:
    options = dict(OPTIONS if options is None else options)
    return {"uuid": uuid, "cluster_uuid": cluster_uuid, "cluster_name": options.get("cluster_name", "c"),
            "options_digest": options_digest(options), "options": options, **kw}


def _refusal(mine: dict, theirs: dict, authenticated: str | None = None) -> PeerRefused:
    with pytest.raises(PeerRefused) as e:
        check_greeting(mine, theirs, "b:1", authenticated)
    return e.value


def test_a_greeting_that_matches_in_every_lasting_way_passes():
    check_greeting(_greeting(ME), _greeting(PEER), "b:1", PEER)
    check_greeting(_greeting(ME), _greeting(PEER), "b:1")


def test_a_greeting_naming_another_uuid_than_its_handshake_proved_is_a_lie_not_a_refusal():
    with pytest.raises(RemoteProtocolError, match=f"greeting names uuid '{PEER}', its handshake '{ME}'"):
        check_greeting(_greeting(ME), _greeting(PEER), "b:1", ME)


def test_with_no_handshake_uuid_to_compare_only_the_lasting_reasons_are_checked():
    e = _refusal(_greeting(ME), _greeting(ME))
    assert (e.code, e.message) == ("self", f"b:1 is this node itself (uuid {ME})")


def test_a_node_greeting_itself_is_refused_as_self():
    e = _refusal(_greeting(ME), _greeting(ME), ME)
    assert e.code == "self" and ME in e.message


def test_another_process_of_this_nodes_member_under_another_lease_version_is_a_stale_holder_not_self():
    mine = {**_greeting(ME), "lease": {"slot": 2, "version": 5, "seen": {}}}
    e = _refusal(mine, {**_greeting(ME), "lease": {"slot": 2, "version": 4, "seen": {}}}, ME)
    assert e.code == "lease_fenced" and "under lease version 4, this node under 5" in e.message
    e = _refusal(mine, {**_greeting(ME), "lease": {"slot": 2, "version": 6, "seen": {}}}, ME)
    assert e.code == "lease_fenced" and "under lease version 6, this node under 5" in e.message
    assert _refusal(mine, {**_greeting(ME), "lease": {"slot": 2, "version": 5, "seen": {}}}, ME).code == "self"
    assert _refusal(mine, _greeting(ME), ME).code == "self"                 # no lease field there: itself


def test_a_peer_of_another_cluster_is_refused_naming_both_clusters():
    e = _refusal(_greeting(ME), _greeting(PEER, OTHER_CLUSTER), PEER)
    assert e.code == "wrong_cluster"
    assert e.message == f"b:1 belongs to cluster {OTHER_CLUSTER}, this node to {CLUSTER} (wrong store)"


@pytest.mark.parametrize("mine, theirs", [(None, OTHER_CLUSTER), (CLUSTER, None), (None, None)])
def test_the_cluster_uuid_is_compared_only_when_both_sides_have_one(mine, theirs):
    check_greeting(_greeting(ME, mine), _greeting(PEER, theirs), "b:1", PEER)


def test_another_cluster_name_is_refused_with_this_nodes_name_to_stop_on():
    e = _refusal(_greeting(ME), _greeting(PEER, options={**OPTIONS, "cluster_name": "d"}), PEER)
    assert e.code == "cluster_name" and e.body == {"option": "cluster_name", "value": "c"}
    assert e.message == "b:1 has cluster_name 'd', this node 'c'"


def test_another_must_match_option_is_refused_naming_it_and_this_nodes_value():
    e = _refusal(_greeting(ME), _greeting(PEER, options={**OPTIONS, "cluster_size": 5}), PEER)
    assert e.code == "options" and e.body == {"option": "cluster_size", "value": 3}
    assert e.message == "b:1 has different must-match options: cluster_size is 5 there, 3 here"


def test_a_peer_without_an_options_map_is_refused_by_the_digest_and_no_option_is_blamed():
    """Absent, null, empty or not a map: which option differs is unknown, so none is named (read
    against nothing, cluster_name, the first option, would be blamed though the names agree)."""
    theirs = _greeting(PEER, options={**OPTIONS, "cluster_size": 5})
    mine = _greeting(ME)
    for options in ("absent", None, {}, ["cluster_size", 5]):
        if options == "absent":
            del theirs["options"]
        else:
            theirs["options"] = options
        e = _refusal(mine, theirs, PEER)
        assert e.code == "options" and not hasattr(e, "body"), options
        assert e.message == (f"b:1 has different must-match options (digest {theirs['options_digest']}, "
                             f"this node {mine['options_digest']})")


def test_this_node_without_options_to_name_refuses_by_the_digest_alone():
    mine = _greeting(ME)
    del mine["options"]
    theirs = _greeting(PEER, options={**OPTIONS, "cluster_size": 5})
    del theirs["options"]
    e = _refusal(mine, theirs, PEER)
    assert e.code == "options" and not hasattr(e, "body")
    assert e.message == (f"b:1 has different must-match options (digest {theirs['options_digest']}, "
                         f"this node {mine['options_digest']})")
