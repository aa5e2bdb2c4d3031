"""How a link ended, and what its driver does next: for an applier, the one map from an error
to the link's status, its log line and the wait before the next try (`after_link`, with the
backoff kept by `Retry`; node/applier/applier.py acts on it); for a relay, the one map from an
error to its log line and the ERROR answered (`relay_end`; node/applier/relay.py acts on it).

Rules kept here:
- Every error has a next step. A peer's bad input arrives as RemoteProtocolError (the decoders
  and the core's checks raise nothing else for it); a refusal (PeerRefused) is a lasting
  reason, retried slowly, except `need_rejoin`, which goes to the rejoiner (node/rejoin.py
  decides; this link is tried again and serves once the node is past what the upstream
  collected), and `not_ready` and `lease_lost` (the upstream is shutting down, has not joined
  a cluster yet, or lost its lease slot and exits to be replaced: it will be back as a
  restarted peer is, so it is retried as a broken network is, not 10 s later, and it is no ERROR; a peer not joined yet or closing the link as it stops,
  PeerNotReady, is said at INFO too), and `silent` (the upstream heard nothing on the link
  for `peer_timeout_s`: this node stalled or was stopped, or the network dropped everything;
  the link broke, so it is retried with the backoff, said as a WARNING), and `lease_fenced` (one
  side is a stale lease holder, which stops within a lease duration, and the address may serve
  the slot's next holder then: retried with the backoff, said as a WARNING), and `twin` (another
  process with one member's uuid: the younger stops; retried with the backoff, so that a third
  node's refusals confirm a live twin soon, said as a WARNING); a broken network is
  retried with capped exponential backoff; our own state asking for a fresh SUBSCRIBE
  (Resubscribe), or the upstream asking for a fresh greeting (`greet_again`), retries at once;
  the disk failing (StorageError) stops the node; anything else is a bug here: this link
  stops, the node serves on.
- Backoff doubles per failed try up to `reconnect_backoff_max_s` and starts again from the
  minimum after a link that lived for a while; every wait is jittered (0.5x to 1.5x), so links
  that broke together do not come back together.
- A relay answers the peer's refusal with its code, a peer that said nothing for its timeout
  with `silent`, a peer's bad input with `protocol`, and a bug of ours with `internal` (logged
  with its traceback by the node); a lost connection gets no answer."""
from __future__ import annotations

import logging
import random
import sys
from dataclasses import dataclass

from node import limits
from node.core.link.applier import Resubscribe
from node.core.link.relay import GREET_AGAIN
from node.errors import PeerNotReady, PeerRefused, PeerSilent, RemoteProtocolError, StorageError

RETRY, REJOIN, FATAL, END = "retry", "rejoin", "fatal", "end"


@dataclass(frozen=True, slots=True)
class After:
    then: str                  # RETRY, REJOIN (tell the rejoiner, then retry), FATAL (the node stops), END
    status: str | None         # the link's status from now (None: as it was)
    error: str                 # the link's last error, as /v1/info shows it
    delay: float               # seconds before the next try (the driver jitters it)
    level: int = logging.INFO  # of the log line saying why
    line: str = ""             # the log line (empty: none)


def after_link(e: BaseException | None, backoff: float) -> After:
    """What follows a link that ended with `e` (None: the peer said BYE)."""
    if e is None:
        return After(RETRY, None, "", limits.reconnect_backoff_min_s)   # come back soon
    if isinstance(e, PeerNotReady) or (isinstance(e, PeerRefused) and e.code in ("not_ready", "lease_lost")):
        # joining, or stopping (it said so, or showed it; or it lost its lease slot and exits, to
        # be replaced, often at the same address): back as soon as a restarted peer is
        return After(RETRY, "disconnected", str(e), backoff, logging.INFO, str(e))
    if isinstance(e, Resubscribe):
        return After(RETRY, "resubscribing", str(e), 0.0, logging.INFO, str(e))
    if isinstance(e, PeerRefused):
        if e.code == GREET_AGAIN:            # the upstream's greeting no longer holds: hear it again now
            return After(RETRY, "resubscribing", str(e), 0.0, logging.INFO, str(e))
        if e.code == "silent":              # it heard nothing from us for its timeout: a link that broke
            return After(RETRY, "disconnected", str(e), backoff, logging.WARNING, str(e))
        if e.code == "lease_fenced":        # a stale holder (it or this node) stops within a lease duration
            return After(RETRY, "lease_fenced", str(e), backoff, logging.WARNING, str(e))
        if e.code == "twin":                # the younger of two processes of one member stops (node/core/link/twins.py)
            return After(RETRY, "twin", str(e), backoff, logging.WARNING, str(e))
        if e.code == "need_rejoin":
            return After(REJOIN, "need_rejoin", str(e), limits.rejoin_retry_s, logging.WARNING, str(e))
        # A lasting reason (secret, cluster, options, expelled, this node itself, a second address of
        # a member already followed): said once per try, slowly.
        return After(RETRY, e.code if e.code in ("self", "duplicate") else "refused", str(e),
                      limits.refused_backoff_s, logging.ERROR, f"refused: {e}")
    if isinstance(e, RemoteProtocolError):     # something we cannot use, or the link broke mid-message
        return After(RETRY, "disconnected", str(e), backoff, logging.WARNING, str(e))
    if isinstance(e, _network_errors()):
        text = str(e) or type(e).__name__
        return After(RETRY, "disconnected", text, backoff, logging.INFO, text)
    if isinstance(e, StorageError):            # the disk failed us (the journal has usually said so)
        return After(FATAL, "failed", str(e), 0.0)
    return After(END, "failed", f"{type(e).__name__}: {e}", 0.0)


def _network_errors() -> tuple[type[BaseException], ...]:
    """A link's network failures: the OS's, timeouts (asyncio's TimeoutError is the builtin one,
    an OSError) and aiohttp's. aiohttp is asked for only once imported: an error of it cannot exist
    before (the simulation, which runs after_link, never imports it)."""
    aio = sys.modules.get("aiohttp")
    return (OSError,) if aio is None else (OSError, aio.ClientError)     # (ConnectionError, TimeoutError: OSErrors)


def next_backoff(backoff: float, lived_s: float) -> float:
    """The wait after the next failed try: doubled, capped, or the minimum again after a link
    that was healthy for a while."""
    if lived_s > 10 * limits.reconnect_backoff_max_s:
        return limits.reconnect_backoff_min_s
    return min(backoff * 2, limits.reconnect_backoff_max_s)


class Retry:
    """An applier's backoff across its links: `begin` when a link starts, `end` when it ended
    (what follows it, by after_link), `jitter` the wait before the next."""

    def __init__(self, rng: random.Random | None = None):
        self.backoff = limits.reconnect_backoff_min_s
        self.started = 0.0
        self._rng = rng or random.Random()

    def begin(self, now: float) -> None:
        self.started = now

    def end(self, e: BaseException | None, now: float) -> After:
        nxt = after_link(e, self.backoff)
        self.backoff = next_backoff(self.backoff, now - self.started)
        return nxt

    def jitter(self, delay: float) -> float:
        return delay * (0.5 + self._rng.random())


@dataclass(frozen=True, slots=True)
class RelayEnd:
    level: int                 # of the log line
    line: str                  # the log line ("" for a bug: the node reports it, with its traceback)
    code: str | None           # the ERROR answered (None: none, the link is gone)
    message: str = ""
    bug: bool = False          # ours, not the peer's: node.note_failure


def relay_end(e: Exception, peer: str) -> RelayEnd:
    """What a relay does about the error that ended its link to `peer` (how logs name it)."""
    if isinstance(e, PeerRefused):            # a lasting reason (a second ERROR after the greeting's is harmless)
        return RelayEnd(logging.WARNING, f"relay: refused {peer}: {e}", e.code, e.message)
    if isinstance(e, PeerSilent):             # the peer sent nothing for the link's timeout
        return RelayEnd(logging.INFO, f"relay: link to {peer} dropped: {e}", "silent", str(e))
    if isinstance(e, RemoteProtocolError):    # the peer sent something we cannot use
        return RelayEnd(logging.INFO, f"relay: link to {peer} dropped: {e}", "protocol", str(e))
    if isinstance(e, (ConnectionError, TimeoutError)):     # nobody to answer
        return RelayEnd(logging.INFO, f"relay: link to {peer} lost: {e}", None)
    return RelayEnd(logging.ERROR, "", "internal", f"{type(e).__name__}: {e}", bug=True)
