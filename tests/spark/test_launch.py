"""spark/launch.py's ship_code: the zip of the code it sends to the executors stays for the
life of the process (executors fetch it from the driver's file server while the context lives)
and is gone after, so runs do not leave a directory each in the temporary directory."""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A context stand-in that records what it is given: ship_code needs no JVM to build the zip.
PROBE = """
import os, sys, zipfile
from spark import launch
class Context:
    def __init__(self): self.files = []
    def addPyFile(self, p): self.files.append(p)
    def addFile(self, p): self.files.append(p)
sc = Context()
launch.ship_code(sc)
launch.ship_code(sc)
z = sc.files[0]
assert os.path.exists(z), z
names = zipfile.ZipFile(z).namelist()
assert "node/core/vclock.py" in names and "spark/jobs.py" in names, names[:5]
print(len([f for f in sc.files if f.endswith(".zip")]))
"""


def test_the_shipped_zip_lives_while_the_process_does_and_goes_with_it(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": ROOT}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=ROOT, check=True,
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["1"], out.stdout       # once per context
    assert os.listdir(tmp_path) == []
