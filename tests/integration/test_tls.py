"""TLS on real `replog serve` processes (node/tls.py), with a throwaway CA made in the test:
a 3-node mesh over TLS converges and serves its client API over https; a node trusting another
CA is refused with the reason in its log; with mutual TLS a link without a valid client
certificate is refused while API clients need none; a node on a public address without TLS
says loudly what it exposes."""
from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
import urllib.error

import aiohttp
import pytest

from bench.throwaway_ca import ThrowawayCA
from node.applier.conn import connect
from node.errors import PeerRefused
from node.client import request
from tests.integration.harness import REPLOG, ReplogProcess, mesh, vclocks_converged, wait_for


@pytest.fixture
def ca(tmp_path):
    return ThrowawayCA(str(tmp_path / "ca"))


def test_three_node_mesh_over_tls_converges_and_serves_the_api_over_https(tmp_path, procs, ca):
    tls = ca.issue("node")
    nodes = mesh(tmp_path, 3, tls=tls)
    procs.extend(nodes)
    nodes[0].create_space("kv")
    wait_for(lambda: all(n.get("/v1/spaces")[1]["spaces"] for n in nodes), 30, "space on every node")
    for i, n in enumerate(nodes):
        for k in range(20):
            n.kv_put("kv", f"{n.name}-{k}", {"by": n.name, "k": k})
    wait_for(lambda: vclocks_converged(nodes), 30, "vclocks converge over TLS")
    for n in nodes:
        assert all(n.kv_get("kv", f"{m.name}-19")[0] == 200 for m in nodes)
        wait_for(lambda: all(u["status"] == "follow" for u in n.info()["upstreams"]), 30, f"{n.name} follows all")
        assert "over TLS" in n.log_text()
    # The CLI speaks https given the CA (host:port alone then means https).
    r = subprocess.run([*REPLOG, "get", nodes[2].address, "kv", "n1-19", "--ca-file", tls.ca_file],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and json.loads(r.stdout)["value"] == {"by": "n1", "k": 19}, r.stderr
    # The port speaks only TLS: plaintext HTTP gets no answer, and https needs our CA.
    with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
        request("GET", f"http://{nodes[0].address}/v1/health", timeout=5)
    with pytest.raises(urllib.error.URLError) as e:
        request("GET", f"https://{nodes[0].address}/v1/health", timeout=5)   # the system CAs do not know ours
    assert isinstance(e.value.reason, ssl.SSLCertVerificationError)


def test_a_node_trusting_another_ca_is_refused_with_the_reason_in_its_log(tmp_path, procs, ca):
    a = ReplogProcess(tmp_path, "a", tls=ca.issue("a")).start()
    procs.append(a)
    other = ThrowawayCA(str(tmp_path / "other-ca"), name="another CA")
    b = ReplogProcess(tmp_path, "b", peers=[a], tls=other.issue("b")).start(wait=False)
    procs.append(b)
    wait_for(lambda: "does not verify against tls_ca_file" in b.log_text(), 30, "B logs why it cannot link to A")
    line = next(ln for ln in b.log_text().splitlines() if "does not verify" in ln)
    assert f"peer {a.address} refused: tls:" in line and "certificate verify failed" in line, line
    assert b.get("/v1/health")[0] == 503, "B must not pretend to have joined"
    assert len(a.cluster()) == 1


def test_mutual_tls_refuses_links_without_a_valid_client_certificate_but_not_api_clients(tmp_path, procs, ca):
    nodes = mesh(tmp_path, 2, tls=ca.issue("node"), client_auth=True)
    procs.extend(nodes)
    a = nodes[0]
    a.create_space("kv")
    a.kv_put("kv", "k", 1)
    wait_for(lambda: nodes[1].kv_get("kv", "k")[0] == 200, 30, "replication over mutual TLS")
    assert a.get("/v1/health")[0] == 200, "API clients need no certificate"

    async def link(client_cert) -> Exception:
        ctx = ssl.create_default_context(cafile=ca.ca_file)
        if client_cert is not None:
            ctx.load_cert_chain(client_cert.cert_file, client_cert.key_file)
        async with aiohttp.ClientSession() as session:
            with pytest.raises((PeerRefused, ConnectionError)) as e:
                await connect(session, a.address, ctx)
        return e.value

    refused = asyncio.run(link(None))
    assert isinstance(refused, PeerRefused) and refused.code == "tls_client_auth", refused
    assert "client certificate" in refused.message
    wait_for(lambda: "must present a client certificate" in a.log_text(), 10, "A logs the refusal")
    # A certificate of another CA fails the TLS handshake itself (under TLS 1.3 the client sees
    # the refusal as a reset once it has sent its certificate, or as a TLS alert).
    stranger = ThrowawayCA(str(tmp_path / "stranger"), name="stranger CA").issue("stranger")
    refused = asyncio.run(link(stranger))
    assert (isinstance(refused, PeerRefused) and refused.code == "tls") or "TLS certificate" in str(refused), refused
    wait_for(lambda: all(u["status"] == "follow" for u in a.info()["upstreams"]), 30,
             "the members' own links follow, certificates and all")


def test_a_public_address_without_tls_is_announced_loudly_and_with_tls_it_is_not(tmp_path, procs, ca):
    plain = ReplogProcess(tmp_path, "plain")
    procs.append(plain)
    plain.extra = ["--listen", f"0.0.0.0:{plain.port}", "--insecure"]
    plain.start()
    warning = [ln for ln in plain.log_text().splitlines() if "without TLS" in ln]
    assert warning and "WARNING" in warning[0], plain.log_tail()
    assert "bearer token" in warning[0] and "plaintext" in warning[0] and "tls_cert_file" in warning[0]
    tls = ReplogProcess(tmp_path, "tls", tls=ca.issue("tls"))
    procs.append(tls)
    tls.extra = ["--listen", f"0.0.0.0:{tls.port}", "--insecure"]
    tls.start()
    assert "without TLS" not in tls.log_text()
