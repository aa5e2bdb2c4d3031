"""Errors that say whose fault it was.

- ConfigError: a bad option; raised before anything starts; the CLI exits 2 with one line.
- ClientError: a client sent bad input; mapped to a 4xx with a JSON error body.
- RemoteProtocolError: a peer sent something invalid; the link drops and reconnects.
- PeerRefused: a peer was refused (or refused us) for a reason that retrying soon will not fix.
- StorageError: the disk or the on-disk data failed us; the node stops.
- NoSpaceError: a StorageError the node survives: the disk or the store's map is full; writes
  are refused (507) until space returns, and the write that failed is retried (node/storage/space.py).
A broken invariant is an AssertionError: a bug, never caught."""


class ReplogError(Exception):
    """Base of replog's own errors."""


class ConfigError(ReplogError):
    def __init__(self, option: str, reason: str):
        super().__init__(f"{option}: {reason}")
        self.option = option
        self.reason = reason


class ClientError(ReplogError):
    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


class RemoteProtocolError(ReplogError):
    """The peer broke the protocol: drop the link, reconnect with backoff."""


class PeerNotReady(RemoteProtocolError):
    """The peer cannot serve for a moment: its greeting says it has not joined a cluster yet
    (it is forming one, or joining), or it closed the link as going away (it is stopping, for
    a restart perhaps). The link goes as any broken one does, but this passes: said at INFO."""


class PeerSilent(RemoteProtocolError):
    """The peer sent nothing for as long as the link waits for it (a process stalled or stopped,
    a network that drops everything): a link that broke, not bad bytes. A relay answers it with
    ERROR `silent`, which the applier it ends retries as a broken link, not as a refusal."""


class PeerRefused(ReplogError):
    """A handshake was refused for a lasting reason (secret, cluster, options, fencing)."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class StorageError(ReplogError):
    """The WAL or the store is unusable; the node must stop."""


class RecoveryError(StorageError):
    """The WAL cannot be recovered without operator action (see --force-recovery)."""


class NoSpaceError(StorageError):
    """The file system or the LMDB map has no room for a write. `kind` is "disk" or "map".
    Nothing was lost: the write is retried when space returns (etcd's NOSPACE alarm)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
