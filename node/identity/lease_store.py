"""Lease stores: where slot lease objects live, behind one compare-and-swap interface.

Two stores, same contract (`LeaseStore`):
- `create_if_absent(slot, body)` writes only if no object exists (bootstrap races are safe);
- `read(slot)` returns the body (None if absent) and an opaque CAS token;
- `compare_and_swap(slot, body, token)` writes only if the object still has `token`.
A conflict is an answer (False); a store that cannot answer raises `LeaseStoreUnavailable`.
Stores make no lease decisions. In particular a conditional write whose answer was lost
(a retried PUT that gets 412 because its first attempt succeeded) comes back as False
here; the lease manager tells a lost answer from a real loss by reading the object back.

`FileLeaseStore` (file:///abs/dir): one `<slot>.json` per slot. Create is `link()` of a
fully written, fsynced temp file (atomic, fails if present); CAS re-reads the object
under an exclusive `flock` on `.lock` and `rename()`s a temp file over it, then fsyncs
the directory. The token is the body's MD5, like S3's ETag: bodies never repeat (see
lease.py), so a token never comes back. Safe across threads and processes on one host
(flock is per open file description); not across hosts on NFS.

`S3LeaseStore` (s3://bucket/prefix): `PutObject` with `If-None-Match: *` to create and
`If-Match: <etag>` for CAS; 412 and 409 are conflicts. The endpoint comes from
`REPLOG_S3_ENDPOINT`, else `AWS_ENDPOINT_URL`, else AWS itself.
"""

from __future__ import annotations

import abc
import contextlib
import errno
import fcntl
import hashlib
import os
import tempfile
import threading
import time
from typing import Iterator
from urllib.parse import urlparse

from node import limits
from node.errors import ConfigError, StorageError



_boto3_session = None                # shared by every S3LeaseStore in the process
_boto3_session_lock = threading.Lock()
_CONFLICT = object()                 # an S3 error that is an answer ("no"), not a failure


class LeaseStoreUnavailable(StorageError):
    """The lease store did not answer (network, permissions, missing bucket or directory).

    The outcome of a write that raised this is unknown. Retry until the renewal deadline."""


class LeaseStore(abc.ABC):
    url: str

    @abc.abstractmethod
    def create_if_absent(self, slot: int, body: bytes) -> bool:
        """Write `body` as slot's object if there is none. False: one exists already."""

    @abc.abstractmethod
    def read(self, slot: int) -> tuple[bytes | None, str | None]:
        """The slot's body and CAS token; (None, None) if the object does not exist."""

    @abc.abstractmethod
    def compare_and_swap(self, slot: int, body: bytes, token: str) -> bool:
        """Replace slot's object if its token is still `token`. False on conflict or if absent."""

    def close(self) -> None:
        """Release clients and handles; the store is unusable afterwards."""


def open_store(url: str, *, endpoint_url: str | None = None,
               timeout_s: float = limits.lease_s3_timeout_s_default) -> LeaseStore:
    """A store for `file:///abs/dir` or `s3://bucket/prefix`; a bad URL is the user's ConfigError."""
    parsed = urlparse(url)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost") or not os.path.isabs(parsed.path):
            raise ConfigError("lease_store", f"{url!r}: expected file:///absolute/directory")
        return FileLeaseStore(parsed.path)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ConfigError("lease_store", f"{url!r}: expected s3://bucket/prefix")
        endpoint = (endpoint_url or os.environ.get("REPLOG_S3_ENDPOINT")
                    or os.environ.get("AWS_ENDPOINT_URL") or None)
        return S3LeaseStore(parsed.netloc, parsed.path.strip("/"), endpoint_url=endpoint,
                            timeout_s=timeout_s)
    raise ConfigError("lease_store", f"{url!r}: expected file:///abs/dir or s3://bucket/prefix")


def _md5_token(body: bytes) -> str:
    return hashlib.md5(body, usedforsecurity=False).hexdigest()


class FileLeaseStore(LeaseStore):
    def __init__(self, directory: str):
        self.directory = os.path.abspath(directory)
        self.url = f"file://{self.directory}"
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as e:
            raise LeaseStoreUnavailable(f"lease store {self.url}: cannot create directory: {e}") from e
        self._lock_path = os.path.join(self.directory, ".lock")

    def _path(self, slot: int) -> str:
        return os.path.join(self.directory, f"{slot}.json")

    def _unavailable(self, what: str, e: OSError) -> LeaseStoreUnavailable:
        return LeaseStoreUnavailable(f"lease store {self.url} unavailable: {what}: {e}")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            deadline = time.monotonic() + limits.lease_file_lock_wait_s_max
            poll_s = limits.lease_file_lock_poll_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise OSError(errno.ETIMEDOUT, f"{self._lock_path} held for over "
                                      f"{limits.lease_file_lock_wait_s_max}s") from None
                    time.sleep(poll_s)   # IO edge: waiting on another process's lock
                    poll_s = min(poll_s * 2, limits.lease_file_lock_poll_s_max)
            yield
        finally:
            os.close(fd)   # closing the descriptor drops the flock

    def _read_bounded(self, slot: int) -> bytes:
        # One byte past the limit is enough for the decoder to call the body corrupt.
        with open(self._path(slot), "rb") as f:
            return f.read(limits.lease_body_bytes_max + 1)

    def _write_temp(self, slot: int, body: bytes) -> str:
        fd, tmp = tempfile.mkstemp(prefix=f".{slot}.json.", suffix=".tmp", dir=self.directory)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(body)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            os.unlink(tmp)
            raise
        return tmp

    def _fsync_dir(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def create_if_absent(self, slot: int, body: bytes) -> bool:
        try:
            with self._locked():
                tmp = self._write_temp(slot, body)
                try:
                    os.link(tmp, self._path(slot))   # atomic, and the object is whole when it appears
                except FileExistsError:
                    return False
                finally:
                    os.unlink(tmp)
                self._fsync_dir()
                return True
        except OSError as e:
            raise self._unavailable(f"creating slot {slot}", e) from e

    def read(self, slot: int) -> tuple[bytes | None, str | None]:
        try:
            body = self._read_bounded(slot)
        except FileNotFoundError as e:
            # A missing object is an answer; a missing directory (unmounted volume) is not.
            if not os.path.isdir(self.directory):
                raise self._unavailable(f"reading slot {slot}", e) from e
            return None, None
        except OSError as e:
            raise self._unavailable(f"reading slot {slot}", e) from e
        return body, _md5_token(body)

    def compare_and_swap(self, slot: int, body: bytes, token: str) -> bool:
        try:
            with self._locked():
                try:
                    current = self._read_bounded(slot)
                except FileNotFoundError:
                    return False
                if _md5_token(current) != token:
                    return False
                tmp = self._write_temp(slot, body)
                try:
                    os.replace(tmp, self._path(slot))
                except BaseException:
                    os.unlink(tmp)
                    raise
                self._fsync_dir()
                return True
        except OSError as e:
            raise self._unavailable(f"swapping slot {slot}", e) from e


class S3LeaseStore(LeaseStore):
    def __init__(self, bucket: str, prefix: str, *, endpoint_url: str | None = None,
                 timeout_s: float = limits.lease_s3_timeout_s_default):
        import boto3                          # only S3 users pay for importing boto3
        from botocore.config import Config

        self.bucket = bucket
        self.prefix = prefix
        self.url = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
        config = Config(connect_timeout=timeout_s, read_timeout=timeout_s,
                        retries={"max_attempts": limits.lease_s3_attempts_max, "mode": "standard"},
                        s3={"addressing_style": "path"} if endpoint_url else None)
        global _boto3_session
        with _boto3_session_lock:   # sessions are not thread-safe; one shared session loads the S3 model once
            if _boto3_session is None:
                _boto3_session = boto3.session.Session()
            self._client = _boto3_session.client("s3", endpoint_url=endpoint_url,
                                                 region_name=_boto3_session.region_name or "us-east-1",
                                                 config=config)

    def _key(self, slot: int) -> str:
        return f"{self.prefix}/{slot}.json" if self.prefix else f"{slot}.json"

    def _call(self, what: str, slot: int, conflict_codes: tuple[str, ...], fn):
        """fn()'s result, or _CONFLICT for an error S3 gives as an answer (code or HTTP status
        in `conflict_codes`); anything else means the store did not answer usefully."""
        from botocore.exceptions import BotoCoreError, ClientError
        try:
            return fn()
        except ClientError as e:
            err = e.response.get("Error", {})
            status = str(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode"))
            code = err.get("Code") or status
            if code in conflict_codes or status in conflict_codes:
                return _CONFLICT
            raise LeaseStoreUnavailable(f"lease store {self.url} unavailable: {what} slot {slot}: "
                                        f"{code} {err.get('Message', '')}".rstrip()) from e
        except (BotoCoreError, OSError) as e:
            raise LeaseStoreUnavailable(f"lease store {self.url} unavailable: {what} slot {slot}: "
                                        f"{type(e).__name__}: {e}") from e

    def create_if_absent(self, slot: int, body: bytes) -> bool:
        # 412: the object exists. 409: a concurrent conditional write on the key; the
        # caller reads the slot afterwards either way.
        result = self._call("creating", slot, ("PreconditionFailed", "412",
                                               "ConditionalRequestConflict", "409"),
                            lambda: self._client.put_object(
                                Bucket=self.bucket, Key=self._key(slot), Body=body,
                                IfNoneMatch="*", ContentType="application/json"))
        return result is not _CONFLICT

    def read(self, slot: int) -> tuple[bytes | None, str | None]:
        def get() -> tuple[bytes, str]:
            resp = self._client.get_object(Bucket=self.bucket, Key=self._key(slot))
            with contextlib.closing(resp["Body"]) as stream:
                return stream.read(limits.lease_body_bytes_max + 1), resp["ETag"]
        result = self._call("reading", slot, ("NoSuchKey",), get)
        return (None, None) if result is _CONFLICT else result

    def compare_and_swap(self, slot: int, body: bytes, token: str) -> bool:
        # 412: the ETag moved on. 409: a concurrent conditional write. NoSuchKey: deleted.
        result = self._call("swapping", slot, ("PreconditionFailed", "412", "ConditionalRequestConflict",
                                               "409", "NoSuchKey"),
                            lambda: self._client.put_object(
                                Bucket=self.bucket, Key=self._key(slot), Body=body,
                                IfMatch=token, ContentType="application/json"))
        return result is not _CONFLICT

    def close(self) -> None:
        self._client.close()
