"""TLS for the node's one port (client API and replication) and for its links to peers, from
certificate files, with the standard library's `ssl`.

Rules kept here:
- TLS is on when `tls_cert_file` is set: the port serves only TLS, and every connection this
  node makes to a peer (appliers, probes, cluster shutdown) is wss://, verifying the peer's
  certificate against `tls_ca_file` (the system's CAs when unset) and its host name or IP
  against the address it was reached at. A cluster is all TLS or all plaintext.
- `tls_client_auth`: replication links must present a certificate signed by `tls_ca_file`.
  The TLS layer asks every client for one but lets clients without one finish the handshake
  (CERT_OPTIONAL), so the client API on the same port needs none; /v1/replication refuses a
  link that presented none (node/applier/accept.py), and a certificate that does not verify
  fails the TLS handshake itself. Appliers always present this node's certificate.
- TLS 1.2 at least; OpenSSL's defaults otherwise.
- A file that cannot be read or does not hold what it should is a ConfigError naming the
  option, raised when the configuration is loaded (exit 2, one line).
"""
from __future__ import annotations

import ssl
from typing import Protocol

from node.errors import ConfigError


class TlsOptions(Protocol):
    """The options read here (node/config.py Config has them): this module does not import the
    config that imports it."""
    tls_cert_file: str
    tls_key_file: str
    tls_ca_file: str
    tls_client_auth: bool


def check_options(cfg: TlsOptions) -> None:
    if bool(cfg.tls_cert_file) != bool(cfg.tls_key_file):
        raise ConfigError("tls_key_file" if cfg.tls_cert_file else "tls_cert_file",
                          "tls_cert_file and tls_key_file go together")
    if cfg.tls_ca_file and not cfg.tls_cert_file:
        raise ConfigError("tls_ca_file", "needs tls_cert_file and tls_key_file (links use TLS only when this node serves it)")
    if cfg.tls_client_auth and not (cfg.tls_cert_file and cfg.tls_ca_file):
        raise ConfigError("tls_client_auth", "needs tls_cert_file, tls_key_file and tls_ca_file")


def server_context(cfg: TlsOptions) -> ssl.SSLContext | None:
    """What the node's port serves with, or None (plaintext)."""
    if not cfg.tls_cert_file:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(ctx, cfg)
    if cfg.tls_client_auth:
        _load_ca(ctx, cfg)
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def client_context(cfg: TlsOptions) -> ssl.SSLContext | None:
    """What the node connects to its peers with, or None (plaintext)."""
    if not cfg.tls_cert_file:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if cfg.tls_ca_file:
        _load_ca(ctx, cfg)
    _load_chain(ctx, cfg)        # presented when a relay asks (tls_client_auth)
    return ctx


def _load_chain(ctx: ssl.SSLContext, cfg: TlsOptions) -> None:
    _readable("tls_cert_file", cfg.tls_cert_file)
    _readable("tls_key_file", cfg.tls_key_file)
    try:
        ctx.load_cert_chain(cfg.tls_cert_file, cfg.tls_key_file)
    except ssl.SSLError as e:
        raise ConfigError("tls_cert_file", f"{cfg.tls_cert_file} and {cfg.tls_key_file} are not a PEM "
                                           f"certificate chain and its private key ({e.reason or e})") from None


def _load_ca(ctx: ssl.SSLContext, cfg: TlsOptions) -> None:
    _readable("tls_ca_file", cfg.tls_ca_file)
    try:
        ctx.load_verify_locations(cafile=cfg.tls_ca_file)
    except ssl.SSLError as e:
        raise ConfigError("tls_ca_file", f"{cfg.tls_ca_file} holds no PEM CA certificate ({e.reason or e})") from None


def _readable(option: str, path: str) -> None:
    """ssl's own errors do not say which file they could not open."""
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        raise ConfigError(option, f"cannot read {path}: {e.strerror}") from None
