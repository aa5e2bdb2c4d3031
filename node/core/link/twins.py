"""Two processes with one member's uuid ("twins"): a data directory copied, or restored without
`--as-new-member`, and started while its node still runs. Each would write its own rows under
the member's next lsns, and one (origin, lsn) would name two rows on different nodes for good.

Every process says in its greeting which run of its member it is (`run`: the start time in µs
as 16 hex digits, then 8 random ones, so that a later start sorts after an earlier one).

Rules kept here:
- A greeting with this node's uuid and another run is a twin, refused (`twin`), never taken for
  this node itself (`self`: the same run) nor for a peer (its greeting would move the member's
  address, its rows would be taken under the member's lsns).
- A greeting of a member whose subscribed link here is live (it ACKed within `twin_live_s`) and
  whose run differs is a twin of that subscriber: refused, when it is the younger of the two.
  (An older one is taken: the live link is then the younger's, which is refused when it comes
  back; a link that did not ACK is presumed a dead process's and replaced, as before.)
- The younger run of two stops (`younger`, carried by the refusal's ERROR): wherever the two
  meet, directly or through a third node, the same one stops, and the older serves on. Met in
  one handshake, both are alive: it stops at once. Refused by a third node for its subscriber's
  link, it stops once such refusals have gone on for `twin_confirm_s` (twice `twin_live_s`): a
  dead process's link stops looking live within `twin_live_s`, so only a live twin's refusals
  last that long. The refusal is retried as a broken link is (within a second or so).
- Greetings without `run` (an older version; the simulation's) are never twins.
- A younger twin that stops with no own-rows fence up may have written rows under lsns the older
  one used (a copy made by hand has no fence): its data dir gets `STOPPED_FILE`, and no process
  starts on that dir again until the operator removes it. A fenced one (a restore) wrote nothing
  under its own id and may start again once the other is gone.
"""
from __future__ import annotations

import re

from node.errors import PeerRefused

RUN_RE = re.compile(r"[0-9a-f]{24}\Z")
CODE = "twin"
STOPPED_FILE = "twin-stopped"   # in the data dir of a younger twin that stopped with no fence up


def new_run(wall_us: int, random_hex: str) -> str:
    """A process's run of its member, for its greetings: its start (wall clock, µs), then 8
    random hex digits."""
    return f"{wall_us:016x}{random_hex[:8]:0>8}"


def valid_run(value: object) -> str | None:
    """`value` if it is a run (24 hex digits), else None."""
    return value if type(value) is str and RUN_RE.match(value) else None


def run_of(greeting: dict) -> str | None:
    return valid_run(greeting.get("run"))


def refusal(uuid: str, peer: str, run: str, other: str, where: str, met: bool) -> PeerRefused:
    """The refusal of a twin: `run` the greeting's, `other` the run it collides with (`where`:
    this node, or a subscriber's link here). `met`: the two runs met in this handshake, so both
    are alive now (else the other is a subscriber's link here, which a dead process may leave
    looking live for up to `twin_live_s`)."""
    younger = max(run, other)
    e = PeerRefused(CODE, f"{peer} is another process with the uuid {uuid} of {where} (runs {other} and {run}): "
                    "two processes of one member would write different rows under the same lsns; the younger "
                    f"({younger}) stops. Was a data directory copied, or restored without --as-new-member, "
                    "while its node ran?")
    e.body = {"younger": younger, "met": met}
    return e


def met(e: PeerRefused) -> bool:
    """Whether the two runs of a twin refusal met in one handshake (younger_of is not None)."""
    return e.body.get("met") is True


def younger_of(e: BaseException) -> str | None:
    """The run that must stop, from a twin refusal (raised here or received as an ERROR)."""
    if not isinstance(e, PeerRefused) or e.code != CODE:
        return None
    body = getattr(e, "body", None)
    return valid_run(body.get("younger")) if isinstance(body, dict) else None
