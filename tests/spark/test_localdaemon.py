"""spark/localdaemon/replog_local_daemon.py, imported by a fresh interpreter the way the JVM
starts it: SPARK_HOME's zips leave sys.path when an installed pyspark is there, and stay (and
are used) when none is."""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile

DAEMON_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                          "spark", "localdaemon")
PROBE = ("import sys, replog_local_daemon as d; "
         "print(d.daemon.__file__); print([p for p in sys.path if p.endswith('.zip')])")


def _spark_home(tmp_path) -> tuple[str, str]:
    """A SPARK_HOME whose pyspark.zip holds a daemon that says where it came from."""
    lib = tmp_path / "python" / "lib"
    lib.mkdir(parents=True)
    z = str(lib / "pyspark.zip")
    with zipfile.ZipFile(z, "w") as f:
        f.writestr("pyspark/__init__.py", "")
        f.writestr("pyspark/daemon.py", "def manager():\n    pass\n")
    return str(tmp_path), z


def _probe(spark_home: str, zip_path: str, *flags: str) -> list[str]:
    env = {**os.environ, "SPARK_HOME": spark_home, "PYTHONPATH": os.pathsep.join([zip_path, DAEMON_DIR])}
    out = subprocess.run([sys.executable, *flags, "-c", PROBE], env=env, cwd=spark_home, check=True,
                         stdout=subprocess.PIPE, text=True, timeout=60).stdout
    return out.splitlines()


def test_the_daemon_imports_the_installed_pyspark_and_drops_spark_homes_zips(tmp_path):
    import pyspark.daemon
    home, z = _spark_home(tmp_path)
    where, zips = _probe(home, z)
    assert where == pyspark.daemon.__file__
    assert z not in zips


def test_without_an_installed_pyspark_the_daemon_comes_from_the_zip(tmp_path):
    home, z = _spark_home(tmp_path)
    where, zips = _probe(home, z, "-S")           # -S: no site-packages, so no installed pyspark
    assert where == os.path.join(z, "pyspark", "daemon.py")
    assert z in zips
