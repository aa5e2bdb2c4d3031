"""TLS options (node/tls.py, node/config.py): what a valid set of files gives, and every bad
combination or file is a ConfigError naming the option (`replog serve` exits 2, one line)."""
import ssl
import subprocess

import pytest

from bench.throwaway_ca import ThrowawayCA
from node.config import load, plaintext_exposure
from node.errors import ConfigError
from tests.unit.test_config_cli import REPLOG


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    ca = ThrowawayCA(str(tmp_path_factory.mktemp("ca")))
    return ca.issue("node")


def test_cert_and_key_give_a_server_and_a_verifying_client_context(files):
    cfg = load({"tls_cert_file": files.cert_file, "tls_key_file": files.key_file, "tls_ca_file": files.ca_file}, env={})
    assert cfg.tls and cfg.server_ssl.verify_mode == ssl.CERT_NONE, "API clients need no certificate"
    assert cfg.client_ssl.verify_mode == ssl.CERT_REQUIRED and cfg.client_ssl.check_hostname
    assert cfg.server_ssl.minimum_version >= ssl.TLSVersion.TLSv1_2


def test_client_auth_asks_every_client_for_a_certificate_and_verifies_it(files):
    cfg = load({"tls_cert_file": files.cert_file, "tls_key_file": files.key_file, "tls_ca_file": files.ca_file,
                "tls_client_auth": True}, env={})
    assert cfg.server_ssl.verify_mode == ssl.CERT_OPTIONAL


def test_without_tls_options_the_node_is_plaintext():
    cfg = load({}, env={})
    assert not cfg.tls and cfg.server_ssl is None and cfg.client_ssl is None


@pytest.mark.parametrize("which, option", [
    ({"tls_cert_file"}, "tls_key_file"),
    ({"tls_key_file"}, "tls_cert_file"),
    ({"tls_ca_file"}, "tls_ca_file"),
    ({"tls_cert_file", "tls_key_file", "tls_client_auth"}, "tls_client_auth"),
])
def test_incomplete_tls_options_are_refused_naming_the_option(files, which, option):
    given = {"tls_cert_file": files.cert_file, "tls_key_file": files.key_file, "tls_ca_file": files.ca_file,
             "tls_client_auth": True}
    with pytest.raises(ConfigError) as e:
        load({k: v for k, v in given.items() if k in which}, env={})
    assert e.value.option == option


def test_unreadable_or_wrong_files_are_refused_naming_the_option(files, tmp_path):
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    base = {"tls_cert_file": files.cert_file, "tls_key_file": files.key_file, "tls_ca_file": files.ca_file}
    for change, option in (({"tls_cert_file": str(tmp_path / "missing.pem")}, "tls_cert_file"),
                           ({"tls_key_file": str(tmp_path / "missing.pem")}, "tls_key_file"),
                           ({"tls_ca_file": str(tmp_path / "missing.pem")}, "tls_ca_file"),
                           ({"tls_cert_file": str(junk)}, "tls_cert_file"),
                           ({"tls_key_file": files.ca_file}, "tls_cert_file"),     # a key that is not the cert's
                           ({"tls_ca_file": str(junk)}, "tls_ca_file")):
        with pytest.raises(ConfigError) as e:
            load({**base, **change}, env={})
        assert e.value.option == option, (change, e.value)


def test_replog_serve_with_a_missing_certificate_exits_2_with_one_line(tmp_path, files):
    r = subprocess.run([str(REPLOG), "serve", "--data-dir", str(tmp_path / "d"), "--tls-cert-file",
                        str(tmp_path / "nope.pem"), "--tls-key-file", files.key_file],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("replog: error: tls_cert_file: cannot read"), r.stderr


def test_only_a_non_loopback_node_without_tls_is_said_to_expose_plaintext(files):
    assert plaintext_exposure(load({}, env={})) is None
    exposed = plaintext_exposure(load({"listen": "0.0.0.0:7301", "insecure": True}, env={}))
    assert "without TLS" in exposed and "bearer token" in exposed
    tls = load({"listen": "0.0.0.0:7301", "insecure": True, "tls_cert_file": files.cert_file,
                "tls_key_file": files.key_file}, env={})
    assert plaintext_exposure(tls) is None
