"""Which event loop a node and the SDK run on (node/config.py loop_module, replog/sync.py): uvloop
where it is installed, but asyncio's with TLS. uvloop 0.23.0 leaves a TLS connect that the peer
resets during its handshake registered on a descriptor that was closed; every socket opened later
on that number is refused ("File descriptor N is used by transport") and the stale transport's
close would close whatever holds the number then. The secure nemesis met it (seed 48) and
bench/uvloop_tls.py shows it: thousands of refused dials in 10 s on uvloop, none on asyncio.
The last test here runs that dial on the loop a TLS node is given, and fails if it is uvloop."""
from __future__ import annotations

import asyncio

import pytest

from bench.throwaway_ca import ThrowawayCA
from node import config
from node.config import Config, load
from node.errors import ConfigError
import replog

uvloop = pytest.importorskip("uvloop")


def test_auto_takes_uvloop_without_tls_and_asyncio_with_it():
    assert config.loop_module(Config(event_loop="auto")) is uvloop
    assert config.loop_module(Config(event_loop="auto", tls_cert_file="node.pem")) is None
    assert config.loop_module(Config(event_loop="asyncio")) is None


def test_uvloop_asked_for_with_tls_is_refused_naming_the_option(tmp_path):
    tls = ThrowawayCA(str(tmp_path)).issue("node")
    flags = {"data_dir": str(tmp_path / "d"), "event_loop": "uvloop", "tls_cert_file": tls.cert_file,
             "tls_key_file": tls.key_file, "tls_ca_file": tls.ca_file}
    with pytest.raises(ConfigError) as e:
        load(flags, env={})
    assert e.value.option == "event_loop" and "TLS" in str(e.value)
    flags["event_loop"] = "auto"
    assert config.loop_module(load(flags, env={})) is None


def test_the_sdk_runs_tls_clients_on_asyncios_loop(tmp_path):
    tls = ThrowawayCA(str(tmp_path)).issue("node")
    for kw, tls_on in (({}, False), ({"ca_file": tls.ca_file}, True)):
        c = replog.Client(["127.0.0.1:9"], **kw)
        try:
            assert isinstance(c._loop, uvloop.Loop) is not tls_on, kw
        finally:
            c.close()


def test_tls_dials_to_a_peer_that_resets_leave_no_stale_descriptor_on_a_tls_nodes_loop(tmp_path):
    from bench import uvloop_tls
    cfg = Config(event_loop="auto", tls_cert_file="node.pem")
    module = config.loop_module(cfg)
    run = module.run if module is not None else asyncio.run
    got = run(uvloop_tls.main_counts(3.0, str(tmp_path)))
    assert got["dials"] > 100 and got["fd"] == 0 and got["other"] == 0, got
