"""The job unchanged on a real Spark cluster: a one-worker standalone cluster on 127.0.0.1 and
`spark-submit --master spark://... spark/analyze.py`, as the README gives it. Every table equals
the oracle's (the input has a divergence, so the Spark SQL stage runs too), and none of the
local-mode shortcuts (the driver's head start) is taken. Slow (three JVMs): `pytest -m slow`."""
from __future__ import annotations

import os
import subprocess
import sys

import pyarrow.parquet as pq
import pyspark
import pytest

from bench.common import free_port
from spark import generate, oracle
from spark import tables as T
from tests.integration.harness import wait_for

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPARK_HOME = os.path.dirname(os.path.abspath(pyspark.__file__))
REGISTER_S = 120          # a worker's registration with the master, on a slow machine
SUBMIT_S = 600            # the whole spark-submit run


def _norm(v):
    if isinstance(v, dict):
        return tuple(sorted(v.items()))
    if isinstance(v, list):                     # a map, as pyarrow reads it: (key, value) pairs
        return tuple(sorted(tuple(x) for x in v))
    return v


def _log(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read()


@pytest.fixture
def cluster(tmp_path):
    env = {**os.environ, "SPARK_HOME": SPARK_HOME, "SPARK_LOCAL_IP": "127.0.0.1",
           "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    port = free_port()
    master_url = f"spark://127.0.0.1:{port}"
    spark_class = os.path.join(SPARK_HOME, "bin", "spark-class")
    logs = {n: str(tmp_path / f"{n}.log") for n in ("master", "worker")}
    procs = []
    try:
        with open(logs["master"], "w") as log:
            procs.append(subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                 "--webui-port", str(free_port())], env=env, stdout=log, stderr=subprocess.STDOUT))
        with open(logs["worker"], "w") as log:
            procs.append(subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.worker.Worker", "--cores", "2", "--memory", "2g",
                 "--port", str(free_port()), "--webui-port", str(free_port()), master_url],
                env=env, stdout=log, stderr=subprocess.STDOUT))
        try:
            wait_for(lambda: "Successfully registered with master" in _log(logs["worker"]), REGISTER_S,
                     "the worker to register with the master", interval=0.2)
        except AssertionError as e:
            raise AssertionError(f"{e}; the worker's log ends:\n{_log(logs['worker'])[-2000:]}") from None
        yield master_url, env
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=60)


def test_spark_submit_on_a_standalone_cluster_writes_the_oracles_tables(cluster, tmp_path):
    master_url, env = cluster
    m = generate.generate(str(tmp_path / "in"), nodes=4, rows=1500, seed=7, segment_bytes=24 * 1024, corrupt=True)
    dirs = [str(tmp_path / "in" / n["dir"]) for n in m["nodes"]]
    out = str(tmp_path / "out")
    r = subprocess.run([os.path.join(SPARK_HOME, "bin", "spark-submit"), "--master", master_url,
                        os.path.join(ROOT, "spark", "analyze.py"), *dirs, "--out", out, "--split-mb", "0.015625"],
                       env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=SUBMIT_S)
    assert r.returncode == 0, r.stderr[-4000:]
    assert "divergences: 1 rows" in r.stdout
    assert "read on the driver" not in r.stderr           # no head start on a cluster
    o = oracle.analyze(dirs)
    for name, cols in T.TABLES.items():
        got = sorted(tuple(_norm(row[c]) for c in cols) for row in pq.read_table(os.path.join(out, name)).to_pylist())
        assert got == sorted(tuple(_norm(x) for x in row) for row in o[name]), name
    assert len(os.listdir(os.path.join(out, "plots"))) == len(dirs)
