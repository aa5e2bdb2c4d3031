"""The node's log level does not open the libraries' DEBUG output (node/logsetup.py): the AWS
SDK, talking to an S3 lease store, logs each request's headers at DEBUG, the session token
(`x-amz-security-token`) and signatures among them. With `--log-level debug` a lease node on S3
wrote them to its log (seen in the lease nemesis with `--s3`)."""
from __future__ import annotations

import logging

import pytest

from node import logsetup


@pytest.fixture(autouse=True)
def restore_logging():
    root = logging.getLogger()
    saved = root.handlers[:], root.level, {n: logging.getLogger(n).level for n in logsetup.LIBRARY_LOGGERS}
    yield
    root.handlers[:], level, libs = saved
    root.setLevel(level)
    for n, lvl in libs.items():
        logging.getLogger(n).setLevel(lvl)


def test_debug_opens_the_nodes_loggers_but_not_the_aws_sdks():
    logsetup.setup("debug")
    assert logging.getLogger("replog.identity.lease").isEnabledFor(logging.DEBUG)
    for name in ("botocore", "botocore.auth", "botocore.endpoint", "boto3", "urllib3.connectionpool"):
        assert not logging.getLogger(name).isEnabledFor(logging.DEBUG), name
        assert logging.getLogger(name).isEnabledFor(logging.INFO), name


def test_a_quieter_level_quiets_the_libraries_too_and_a_reload_applies_it():
    logsetup.setup("warning")
    assert not logging.getLogger("botocore").isEnabledFor(logging.INFO)
    logsetup.set_level("debug")                     # SIGHUP with log_level changed
    assert logging.getLogger("replog").isEnabledFor(logging.DEBUG)
    assert not logging.getLogger("botocore.auth").isEnabledFor(logging.DEBUG)
