"""Start-up options for the embedded (local[*]) driver JVM. Here the JVM is driver and executor
at once but computes little (Python tasks read and write the files), so what it costs is its
start and its JIT compiler:
- `-XX:TieredStopAtLevel=1` (C1 only): JVM CPU on the 8 x 1M benchmark 14.8 -> 7.9 s, jobs no
  slower;
- `-XX:+UseSerialGC`: the heap holds little (results and broadcasts of tens of MiB), and G1's
  concurrent threads and barriers cost CPU on a small machine (8 x 1M on local[2], runs
  alternating with G1: JVM CPU 4.3-4.6 -> 3.7-4.5 s, end to end 0.1-0.9 s sooner);
- a dynamic class-data-sharing archive of the classes Spark loads (JDK 13+): session start
  ~7 -> ~4 s. A run without one has the JVM write one at exit under a temporary name; a later
  run checks it with `java -version` before it promotes it, because a truncated archive (a
  killed run) crashes the JVM that maps it.
Rules: only for local mode outside spark-submit (spark.launch); nothing here is needed
for a correct result, so every failure (no java found, no cache dir) means no archive."""
from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess

_C1_ONLY = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"   # a mismatched archive is skipped, not reported
check_timeout_s = 30


def _java() -> str | None:
    """The java that spark-submit runs (JAVA_HOME's, else the one on PATH)."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return os.path.realpath(java) if java and os.path.exists(java) else None


def _cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "replog")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _promote(archive: str, java: str) -> None:
    """Move a finished archive from a run that has ended into place, once java accepts it."""
    for tmp in glob.glob(archive + ".*.tmp"):
        try:
            pid = int(tmp.rsplit(".", 2)[1])
        except ValueError:
            continue
        if _alive(pid):
            continue                      # its JVM may still be writing it
        try:
            # A bad archive aborts this java: no crash report file, no core.
            ok = subprocess.run([java, f"-XX:SharedArchiveFile={tmp}", "-Xshare:auto", f"-XX:ErrorFile={os.devnull}",
                                 "-XX:-CreateCoredumpOnCrash", "-version"], cwd=os.path.dirname(archive),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                timeout=check_timeout_s).returncode == 0
            if ok and not os.path.exists(archive):
                os.replace(tmp, archive)
            else:
                os.remove(tmp)
        except (OSError, subprocess.SubprocessError):
            pass


def driver_java_options() -> str:
    """extraJavaOptions for a local-mode driver JVM."""
    java = _java()
    if java is None:
        return _C1_ONLY
    import pyspark
    st = os.stat(java)
    # The options are part of the key: an archive dumped under other flags (another collector)
    # may be refused or only partly used.
    key = hashlib.sha1(f"{pyspark.__version__}|{java}|{st.st_mtime_ns}|{st.st_size}|{_C1_ONLY}".encode()
                       ).hexdigest()[:16]
    archive = os.path.join(_cache_dir(), f"spark-cds-{key}.jsa")
    try:
        os.makedirs(_cache_dir(), exist_ok=True)
        _promote(archive, java)
    except OSError:
        return _C1_ONLY
    if os.path.exists(archive):
        return f"{_C1_ONLY} -XX:SharedArchiveFile={archive} {_QUIET}"
    return f"{_C1_ONLY} -XX:ArchiveClassesAtExit={archive}.{os.getpid()}.tmp {_QUIET}"
