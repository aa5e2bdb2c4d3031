"""What this node says to its peers and believes of them: its greeting, the checks run on
theirs, the claims a peer makes to hold this node's own rows, and the set of upstreams
(one applier per peer address).

Rules kept here (the rules on claims are node/core/lifecycle_fence.py's, which the
simulation runs too):
- `peers` is changed in place, so every holder of the list sees the sources in effect.
- An anonymous replica the operator had this node forget is refused at its greeting, either
  direction (ERROR `forgotten`: node/process/followers.py)."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import time
from typing import TYPE_CHECKING

from node import limits
from node.applier.applier import Applier
from node.core.lifecycle_fence import (claims_unheeded, disprove_claim, hear_greeting, own_history_lsn,
                                      own_rows_awaited)
from node.core.link import twins
from node.errors import PeerRefused, StorageError
from node.identity import identity_file as idf
from node.process.ports import ENDING

if TYPE_CHECKING:
    from node.process.ports import PeeringHost

log = logging.getLogger("replog.node")


class Peering:
    def __init__(self, node: "PeeringHost", peers: list[str]):
        self.node = node
        self.peers: list[str] = list(peers)   # the replication sources in effect (PUT /v1/admin/peers)
        # peer uuid -> (lsn of our own component it says it holds, its address): writes wait for
        # those rows while that peer is one of our upstreams (own_rows_awaited)
        self.own_claims: dict[str, tuple[int, str]] = {}
        # peers that claimed to hold our own rows and, streaming to us, did not send them
        # (Applier.check_claim): their claims are not believed again while this node runs
        self.claims_disproved: set[str] = set()
        self._twin_since: float | None = None   # refused as a live subscriber's twin since, and last
        self._twin_last = 0.0
        # this process's run of its member (node/core/link/twins.py)
        self.run = twins.new_run(time.time_ns() // 1000, secrets.token_hex(4))

    # --- greetings ------------------------------------------------------------------------------
    def greeting(self) -> dict:
        node = self.node
        core, store, cfg = node.core, node.store, node.cfg
        return {
            "uuid": node.uuid,
            "run": self.run,
            "cluster_uuid": store.get_meta("cluster_uuid") if store else None,
            "cluster_name": cfg.cluster_name,
            "options_digest": node.options_digest,
            "options": cfg.must_match(),
            "anon": cfg.anon,
            "address": cfg.address,
            "cluster": core.greeting_rows() if core else [],     # bounds as far as backed
            "status": node.status,
            "lease": node.lease.greeting_field() if node.lease else None,
            # our own `_cluster` rows up to here are an earlier incarnation's (all of them while a
            # rebuilt store is fenced): peers take no ids from them (Peer.history_lsn)
            "own_history_lsn": self.own_history_lsn(),
            # while fenced: members it heard are expelled, with no row of its own yet (the members
            # it waits for expel them too before their word counts: OwnRowsFence.unaware)
            **({"expels_heard": heard} if core and (heard := core.expels_heard()) else {}),
            **node.life.greeting_fields(),   # store status, signatures, vclock by uuid (join protocol)
        }

    def own_history_lsn(self) -> int:
        return own_history_lsn(self.node.core)

    def check_peer_greeting(self, theirs: dict) -> None:
        """Checks beyond check_greeting: lease fencing (raises PeerRefused); then what the
        greeting tells the join protocol, the fence, and the claims on our own rows."""
        node = self.node
        self._refuse_younger_twin(theirs)
        if node.lease:
            node.lease.check_peer(theirs)
        if theirs.get("anon") and theirs["uuid"] in node.retention.forgotten:
            # the operator said it is gone (node/process/followers.py): its rows of ours may differ
            # from ours under the same lsns by now, and a lost store did not wait for it
            raise PeerRefused("forgotten", f"anonymous replica {theirs['uuid']} was forgotten by this node at the "
                              "operator's request (DELETE /v1/admin/followers): start it again with a new data "
                              "directory")
        node.life.observe_greeting(theirs)
        hear_greeting(node.core, self.own_claims, self.claims_disproved, theirs, node.uuid)   # fence, claims

    # --- twins: two processes with one uuid (node/core/link/twins.py) ------------------------------
    def _refuse_younger_twin(self, theirs: dict) -> None:
        """A greeting of a member subscribed here by a live link of another, older run: refused
        (the younger stops when told). Lease identities fence their stale holders themselves."""
        run = twins.run_of(theirs)
        if run is None or theirs.get("lease") is not None:
            return
        now = time.monotonic()
        for r in self.node.relays:
            if r.uuid == theirs["uuid"] and not r.conn.closed and \
                    now - max(r.machine.acked_at, r.started_at) <= limits.twin_live_s:
                live = twins.run_of(r.machine.greeting or {})
                if live is not None and live < run:
                    raise twins.refusal(theirs["uuid"], theirs["address"], run, live,
                                        f"a member subscribed here from {r.address}", met=False)

    def twin_refused(self, e: BaseException) -> None:
        """A link ended with `e`: when it is a twin refusal and this process is the younger of
        the two, it stops before it writes anything the older one may write too; at once when
        the two met, else once a third node's refusals went on for twin_confirm_s."""
        if twins.younger_of(e) != self.run:
            return
        now = time.monotonic()
        if not twins.met(e):  # type: ignore[arg-type]
            if self._twin_since is None or now - self._twin_last > limits.twin_confirm_s:
                self._twin_since = now
                log.warning("node: %s; refused so for %g s, this process stops", e, limits.twin_confirm_s)
            self._twin_last = now
            if now - self._twin_since < limits.twin_confirm_s:
                return
        node = self.node
        if node.lease is None and node.core is not None and node.core.fence is None:
            # it may have written under lsns the older twin used: this dir must not serve again
            path = os.path.join(node.data_dir, twins.STOPPED_FILE)
            try:
                idf.write_note(node.data_dir, twins.STOPPED_FILE,
                               json.dumps({"run": self.run, "stopped_s": time.time(), "reason": str(e)}))
            except idf.IdentityFileError as oe:
                log.error("node: could not write %s: %s", path, oe)
        node.on_fatal(StorageError(f"this process stops: {e}"))

    # --- claims on our own rows (the rules: node/core/lifecycle_fence.py) -----------------------
    def disprove_claim(self, uuid: str, have: int) -> None:
        """An upstream caught us up without the rows of ours it said it holds: its claim is not believed."""
        claim = disprove_claim(self.own_claims, self.claims_disproved, self.node.core.fence, uuid, have)
        log.warning("node: %s said it holds this node's rows up to lsn %d and sent them only up to %d: its claim "
                    "is not believed", uuid, claim, have)

    def own_rows_awaited(self) -> tuple[int, str] | None:
        """(lsn, peer) of this node's own rows that one of its upstreams says it holds and this
        node has not claimed yet. Only an upstream can send them back, so only an upstream's
        claim is believed, and only while it is one: a peer that is not (a client greeting
        this node's relay) cannot hold its writes, and removing a peer ends its claim."""
        core = self.node.core
        return own_rows_awaited(self.own_claims, core.claimed.get(core.self_id), self._upstreams())

    def own_rows_unheeded(self) -> list[tuple[str, int, str]]:
        """(uuid, lsn, address) of the peers that are not upstreams and say they hold this node's
        own rows past what it claimed (lifecycle_fence.claims_unheeded)."""
        core = self.node.core
        return claims_unheeded(self.own_claims, core.claimed.get(core.self_id), self._upstreams())

    def _upstreams(self) -> set[str]:
        appliers = self.node.appliers
        return {a.peer_uuid for a in appliers.values()} | set(appliers)

    # --- upstreams --------------------------------------------------------------------------------
    def configure_peers(self, peers: list[str]) -> list[asyncio.Task]:
        """The replication sources from now on (PUT /v1/admin/peers); see set_peers. Before the
        node runs the list is only kept: a join polls it each round, and the appliers start from
        it once the node runs (node/process/node.py)."""
        self.peers[:] = dict.fromkeys(peers)
        if self.node.status != "running":
            return []
        return self.set_peers(list(self.peers))

    def set_peers(self, peers: list[str]) -> list[asyncio.Task]:
        """Make the appliers exactly `peers` (one per address; two addresses of one member keep
        one link: claims.claim_link); returns the tasks stopping removed appliers (awaited by
        `PUT /v1/admin/peers` so the answer means the links are down). A node that is stopping
        starts none: Node.stop has stopped its appliers and closes the HTTP client they dial
        with (a rejoin cancelled mid-rebuild brings its links back here, as it does when the
        rebuild fails: seed 48 of the secure nemesis saw them fail on the closed session)."""
        node = self.node
        appliers = node.appliers
        stopping = []
        for addr in list(appliers):
            if addr not in peers:
                a = appliers.pop(addr)
                stopping.append(node.spawn(a.stop(), f"stop-applier-{addr}"))
        if node.status in ENDING:
            return stopping
        for addr in peers:
            if addr not in appliers and addr != node.cfg.address:
                a = Applier(node, addr)
                appliers[addr] = a
                a.start()
        return stopping
