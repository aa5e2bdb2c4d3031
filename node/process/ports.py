"""The narrow interfaces the process (node/process/node.py) hands to its parts: what each part
may read and call, and nothing else. A part names its port in its signature instead of `Node`.

Rules kept here:
- Ports are typing Protocols: the process satisfies them structurally and no part imports the
  process, so there is no import cycle around it. This module imports no module that takes a
  port (only value types, under TYPE_CHECKING).
- A port lists only what its part touches (tests/unit/test_process_ports.py checks each part's
  module against its port); a part that needs more widens its port here, in the open.
- Attributes a port marks mutable (`status`, `status_reason`, `fatal`, `data_dir`) are written
  by the parts named beside them; the store is written only by the owners docs/architecture.md
  names ("Who writes the store")."""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import aiohttp

    from node.config import Config
    from node.core.replicaset import NodeCore
    from node.journal import Journal
    from node.storage.space import SpaceWatch
    from node.storage.store import Store


# The statuses of a node that is ending (Node.stop, a fatal error, a lost lease): no part shows
# it otherwise again, nor brings its links back.
ENDING = ("stopping", "stopped", "lease_lost", "failed")


# --- small parts other parts reach through a port ----------------------------------------------
class RejoinNotes(Protocol):
    """What an applier tells the rejoin watcher (node/rejoin.py Rejoiner)."""
    def on_need_rejoin(self, address: str, reason: str, collected: dict[str, int]) -> None: ...
    def on_follow(self, address: str) -> None: ...
    def status_of(self, address: str) -> str: ...
    def going_without(self) -> dict[str, int]: ...


class Registrar(Protocol):
    """The donor side of JOIN / REGISTER (node/lifecycle.py Lifecycle.apply_registration)."""
    async def apply_registration(self, theirs: dict, body: dict) -> Any: ...


class PeerAddresses(Protocol):
    """Where members say they are (node/lifecycle.py Lifecycle.observe_greeting): the address
    each one's last greeting advertised, and those it advertised before."""
    advertised: dict[str, str]
    moved_from: dict[str, set[str]]


class ShutdownPhases(Protocol):
    """One phase of an orderly cluster shutdown, asked by a coordinator (node/cluster_shutdown.py)."""
    async def phase(self, body: dict) -> dict: ...


class WalHolds(Protocol):
    """Who holds the WAL (node/retention.py Retention): relays hold and acknowledge, HTTP views."""
    def hold_all(self, uuid: str, anon: bool) -> None: ...
    def on_subscribe(self, uuid: str, durable: dict[int, int], anon: bool) -> None: ...
    def on_ack(self, uuid: str, durable: dict[int, int], anon: bool) -> None: ...
    def follower(self, uuid: str, address: str) -> None: ...
    def follower_link_ended(self, uuid: str) -> None: ...
    def view(self) -> dict: ...
    @property
    def lapse(self) -> bool: ...


class LeaseGate(Protocol):
    """Lease identity as the paths that claim, acknowledge or send this node's rows see it
    (node/identity/lease_node.py): False once the slot may be another node's (the loss begun)."""
    def serving(self) -> bool: ...


# --- the link handshake ------------------------------------------------------------------------
class Handshake(Protocol):
    """What opening a link needs (node/applier/handshake.py open_link, probe): who we are, our
    greeting, and the checks run on theirs."""
    cfg: "Config"
    uuid: str

    def greeting(self) -> dict: ...
    def check_peer_greeting(self, theirs: dict) -> None: ...
    def twin_refused(self, e: BaseException) -> None: ...


# --- replication -------------------------------------------------------------------------------
class ApplierHost(Handshake, Protocol):
    """An applier (node/applier/applier.py): the core and journal it feeds, the followers map it
    claims its peer in, the own-rows claims it checks, and where it reports."""
    core: "NodeCore | None"
    journal: "Journal | None"
    space: "SpaceWatch"
    http_session: "aiohttp.ClientSession | None"
    rejoiner: RejoinNotes
    followers: dict[str, Any]                 # member uuid -> the applier linked to it
    own_claims: dict[str, tuple[int, str]]    # read only: peer uuid -> (our lsn it says it holds, address)
    life: PeerAddresses                       # read only: a member that moved (claims.claim_link)

    def wall_us(self) -> int: ...
    def disprove_claim(self, uuid: str, have: int) -> None: ...
    def note_failure(self, name: str, e: BaseException) -> None: ...
    def on_fatal(self, e: BaseException) -> None: ...


class RelayHost(Handshake, Protocol):
    """An inbound link once authenticated (node/applier/relay.py serve_link, Relay): the store
    it snapshots, the WAL it reads, the relays set it joins, the holds it keeps."""
    core: "NodeCore | None"
    journal: "Journal | None"
    lease: LeaseGate | None                   # no rows sent, nobody registered past its deadline
    store: "Store | None"
    wal_dir: str
    status: str
    status_reason: str
    relays: set
    retention: WalHolds
    life: Registrar
    cluster_shutdown: ShutdownPhases

    def note_failure(self, name: str, e: BaseException) -> None: ...


class AcceptHost(RelayHost, Protocol):
    """Accepting a link (node/applier/accept.py): the bounds on handshakes, the set of links
    stop() closes, and why links are refused for a moment; then it is a relay's."""
    link_guard: Any
    links: set
    links_refused: str | None


# --- the HTTP API (node/http/*) ----------------------------------------------------------------
class HealthView(Protocol):
    """/v1/health and the readiness behind it (node/http/health.py)."""
    cfg: "Config"
    core: "NodeCore | None"
    status: str
    status_reason: str
    fatal: BaseException | None
    appliers: dict[str, Any]
    own_claims: dict[str, tuple[int, str]]
    space: "SpaceWatch"

    def own_rows_awaited(self) -> tuple[int, str] | None: ...
    def own_rows_unheeded(self) -> list[tuple[str, int, str]]: ...


class MetricsView(HealthView, Protocol):
    """/metrics (node/http/metrics.py)."""
    data_dir: str
    wal_dir: str
    journal: "Journal | None"
    relays: set
    link_guard: Any
    started_at: float


class EventsView(Protocol):
    """The dashboard's event stream (node/http/events.py)."""
    cfg: "Config"
    core: "NodeCore | None"
    journal: "Journal | None"
    wal_dir: str
    retention: WalHolds

    def info(self) -> dict: ...
    def cluster_view(self) -> dict: ...


class BrowserView(Protocol):
    """Browser rules: CORS origins from the cluster's addresses (node/http/browser.py)."""
    cfg: "Config"
    core: "NodeCore | None"
    relays: set


class ClientHost(Protocol):
    """The client operations both client endpoints run (node/clientrules.py, and the binary
    protocol node/clientproto/): reads from the store, writes through the node's rules and
    the journal's fast path, read-your-writes by vclock."""
    cfg: "Config"
    uuid: str
    status: str
    core: "NodeCore | None"
    store: "Store | None"
    journal: "Journal | None"

    def wall_us(self) -> int: ...
    def info(self) -> dict: ...
    def vclock_uuid(self) -> dict[str, int]: ...
    def write_check(self) -> None: ...
    def replicated_write_check(self) -> None: ...
    def ack_check(self) -> None: ...
    def has_applied(self, vclock_uuid: dict[str, int]) -> bool: ...
    async def wait_applied(self, vclock_uuid: dict[str, int], timeout_s: float) -> dict[str, int]: ...
    async def write(self, ops: list) -> dict: ...


class BackupHost(Protocol):
    """A hot backup from inside the node (node/ops/backup_node.py): the store it copies,
    the journal position it replays from, the jobs in flight."""
    data_dir: str
    status: str
    status_reason: str
    core: "NodeCore | None"
    store: "Store | None"
    journal: "Journal | None"
    backups: list


class ApiHost(AcceptHost, MetricsView, EventsView, BrowserView, ClientHost, BackupHost, Protocol):
    """The whole client API (node/http/api.py): every view above, the replication endpoint, and
    the operations behind the client and admin routes (node/clientrules.py, node/ops/backup_node.py)."""
    store: "Store | None"
    client_server: Any
    backups: list

    def configure_peers(self, peers: list[str]) -> list[asyncio.Task]: ...
    def has_applied(self, vclock_uuid: dict[str, int]) -> bool: ...
    async def wait_applied(self, vclock_uuid: dict[str, int], timeout_s: float) -> dict[str, int]: ...
    async def write(self, ops: list) -> dict: ...
    async def expel(self, uuid: str) -> dict: ...
    async def checkpoint(self) -> list[str]: ...
    async def request_shutdown(self, cluster: bool, **phase) -> dict: ...
    def followers_view(self) -> dict: ...
    def forget_followers(self, uuid: str | None, unseen_s: float | None) -> dict: ...
    def allow_rejoin_discard(self, uuids: list[str]) -> dict: ...


# --- identity, lifecycle, shutdown ---------------------------------------------------------------
class TaskCancel(Protocol):
    def cancel_all(self, but: asyncio.Task | None = None) -> None: ...


class LeaseHost(Handshake, Protocol):
    """Lease identity (node/identity/lease_node.py): it picks the data dir before the store opens,
    and on a loss writes `status`/`fatal`, stops the links and cancels the start-up tasks."""
    data_dir: str                             # written by acquire(): the slot's directory
    status: str
    status_reason: str
    fatal: BaseException | None
    stopped: asyncio.Event
    http_session: "aiohttp.ClientSession | None"
    appliers: dict[str, Any]
    links: set                                # every inbound link (closed on a loss)
    tasks: TaskCancel

    def on_fatal(self, e: BaseException) -> None: ...


class HandoverLease(LeaseGate, Protocol):
    slot: int | None


class HandoverHost(Handshake, Protocol):
    """An orderly stop's hand-over of a lease node's rows (node/identity/lease_handover.py): the
    relays' acknowledgements it waits on, and the status it sets while it does."""
    core: "NodeCore | None"
    lease: HandoverLease | None
    relays: set
    status: str
    status_reason: str


class ShutdownHost(Handshake, Protocol):
    """Orderly cluster shutdown (node/cluster_shutdown.py): it quiesces (`status`), stops the
    process (`stopped`) and marks the store clean on stop."""
    core: "NodeCore | None"
    store: "Store | None"
    status: str
    status_reason: str
    stopped: asyncio.Event
    http_session: "aiohttp.ClientSession | None"

    def spawn(self, coro, name: str) -> asyncio.Task: ...


class Opening(Protocol):
    """The store's opening steps that the join protocol drives (node/process/opening.py)."""
    def wipe_partial_join(self) -> None: ...
    async def bootstrap_new_cluster(self, initial: Any = None) -> None: ...
    async def receive_snapshot(self, conn: Any, theirs: dict, *, join: bool) -> int: ...
    async def install_snapshot(self, theirs: dict, inst: Any) -> None: ...


class StatusExchange(Protocol):
    """The Qpid status exchange that joining reads (node/lifecycle.py Lifecycle)."""
    proposal: tuple[str, float]
    peers_seen: dict[str, dict]
    uses_identity_files: bool

    async def poll_peers(self, timeout: float = ...) -> dict[str, Any]: ...
    def check_wrong_store(self, polled: dict[str, Any]) -> None: ...
    def check_must_match(self, polled: dict[str, Any]) -> None: ...
    def decide(self) -> Any: ...
    def member_cluster_uuid(self) -> str | None: ...


class Joining(Protocol):
    """Joining and registering (node/join.py Join), as the lifecycle and the rejoin use it."""
    async def initialize_from_store(self) -> None: ...
    async def apply_registration(self, theirs: dict, body: dict) -> Any: ...
    async def apply_once(self, address: str, kind: int, code: str | None, requested_id: int | None) -> Any: ...


class StoreKeeper(Handshake, Protocol):
    """What every part that starts, joins or rebuilds the node reads: the data dir, the store
    and what runs on it, the status it reports, the peers it asks, and the clock."""
    data_dir: str
    core: "NodeCore | None"
    store: "Store | None"
    journal: "Journal | None"
    status: str
    status_reason: str
    peers: list[str]
    http_session: "aiohttp.ClientSession | None"

    def wall_us(self) -> int: ...


class JoinHost(StoreKeeper, Protocol):
    """Joining a cluster, founding one, registering (node/join.py)."""
    opening: Opening
    lease: LeaseGate | None

    async def register_member(self, uuid: str, address: str, state: str = ...) -> int: ...


class LifecycleHost(StoreKeeper, Protocol):
    """Identity files, the status exchange, going active (node/lifecycle.py)."""
    fatal: BaseException | None
    stopped: asyncio.Event
    lease: Any
    appliers: dict[str, Any]
    join: Joining
    rejoiner: Any                             # node/rejoin.py Rejoiner: a catch-up ends only between its attempts

    @property
    def options_digest(self) -> str: ...
    async def register_member(self, uuid: str, address: str, state: str = ...) -> int: ...
    def set_peers(self, peers: list[str]) -> list[asyncio.Task]: ...
    def configure_peers(self, peers: list[str]) -> list[asyncio.Task]: ...
    def supervise(self, name: str, run) -> asyncio.Task: ...


class RejoinHost(StoreKeeper, Protocol):
    """Rebuilding the store from a donor's snapshot (node/rejoin.py)."""
    appliers: dict[str, Any]
    relays: set
    life: Any                                 # node/lifecycle.py Lifecycle: uses_identity_files
    join: Joining

    def set_peers(self, peers: list[str]) -> list[asyncio.Task]: ...
    async def reopen_after_rejoin(self, swap) -> None: ...


# --- the process wing's own parts (node/process/*) ---------------------------------------------
class OpeningHost(StoreKeeper, Protocol):
    """Opening the store (node/process/opening.py): the one writer of `store`, `core`, `journal`
    (and of `uuid`, settled at start)."""
    wal_dir: str
    space: "SpaceWatch"
    lease: Any
    fence: Any                                # node/fence.py FenceKeeper
    life: Any                                 # node/lifecycle.py Lifecycle: after_open
    retention: Any                            # node/retention.py Retention: load
    links: set
    links_refused: str | None
    backups: list                             # node.ops.backup.BackupJob in flight: a rejoin's swap waits

    def on_fatal(self, e: BaseException) -> None: ...
    def set_peers(self, peers: list[str]) -> list[asyncio.Task]: ...


class PeeringHost(ApplierHost, Protocol):
    """Greetings, claims on our own rows and the appliers (node/process/peering.py); it hands
    itself on to each Applier, so it is an ApplierHost too."""
    store: "Store | None"
    status: str
    lease: Any
    life: Any                                 # greeting_fields, observe_greeting
    appliers: dict[str, Any]
    relays: set                               # read only: a live subscriber's run (twins)
    data_dir: str                             # where a stopped twin leaves its note
    retention: Any                            # forgotten: anonymous replicas refused at their greeting

    @property
    def options_digest(self) -> str: ...
    def spawn(self, coro, name: str) -> asyncio.Task: ...


class WritesHost(Protocol):
    """This node's own writes and read-your-writes (node/process/writes.py)."""
    cfg: "Config"
    lease: LeaseGate | None                   # nothing claimed or acknowledged past its deadline
    uuid: str
    core: "NodeCore | None"
    journal: "Journal | None"
    status: str
    status_reason: str
    space: "SpaceWatch"
    fence: Any                                # try_lift, give_up
    relays: set
    own_claims: dict[str, tuple[int, str]]

    def wall_us(self) -> int: ...
    def own_rows_awaited(self) -> tuple[int, str] | None: ...


class FollowersHost(Protocol):
    """The anonymous followers the operator sees and has forgotten (node/process/followers.py)."""
    cfg: "Config"
    core: "NodeCore | None"
    status: str
    retention: Any                            # followers, forgotten, holds, reach, followers_report, forget_by_operator


class InfoHost(Protocol):
    """/v1/info and /v1/cluster (node/process/views.py)."""
    cfg: "Config"
    uuid: str
    run: str                                  # this process's run of its member (node/core/link/twins.py)
    core: "NodeCore | None"
    store: "Store | None"
    status: str
    status_reason: str
    wal_dir: str
    client_server: Any
    appliers: dict[str, Any]
    relays: set
    started_at: float
    lease: Any
    task_failures: dict[str, dict]
    fence: Any                                # info
    rejoiner: Any                             # need, blocked
    space: "SpaceWatch"
