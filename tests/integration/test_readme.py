"""The README's quick start, run as written: its commands are read from README.md (so the two
cannot drift), the ports it names are mapped to free ones, and the data dirs land in a temporary
directory. Between lines the test waits as a person would: for the nodes to be ready after
starting them, and for the new space to reach every node. A write on each node must reach every
other (the quick start forms a full mesh), and every client command must succeed."""
from __future__ import annotations

import json
import os
import pathlib
import re
import shlex
import signal
import subprocess

from tests.integration.harness import REPLOG, PortReservation, request, wait_for

REPO = pathlib.Path(__file__).resolve().parents[2]


def quick_start() -> list[list[str]]:
    """The first sh block under "## Running a node", one argv per command line."""
    text = (REPO / "README.md").read_text()
    section = text.split("## Running a node", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    return [shlex.split(line, comments=True) for line in block.splitlines() if shlex.split(line, comments=True)]


def test_the_readme_quick_start_forms_a_full_mesh_where_a_write_on_each_node_reaches_every_other(tmp_path):
    lines = quick_start()
    assert all(argv[0] == "replog" for argv in lines), lines
    ports = sorted({int(p) for argv in lines for a in argv for p in re.findall(r"127\.0\.0\.1:(\d+)", a)})
    held = {p: PortReservation() for p in ports}      # each node's ports, until the test ends
    mapped = {p: r.port for p, r in held.items()}

    def local(argv: list[str]) -> list[str]:
        out = [re.sub(r"127\.0\.0\.1:(\d+)", lambda m: f"127.0.0.1:{mapped[int(m.group(1))]}", a) for a in argv]
        return REPLOG + out[1:]

    servers, procs = [a for a in lines if a[1] == "serve"], []
    assert len(servers) == 3 and all(a[-1] == "&" for a in servers), "three nodes, started in the background"
    nodes = [f"http://127.0.0.1:{mapped[p]}" for p in ports]
    try:
        for i, argv in enumerate(servers):
            log = open(tmp_path / f"serve{i}.log", "wb")
            procs.append(subprocess.Popen(local(argv[:-1]), cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT))
            log.close()
        for url in nodes:
            wait_for(lambda: request("GET", url + "/readyz")[0] == 200, 60, f"{url} ready")
        writes = {}
        for argv in lines[len(servers):]:
            r = subprocess.run(local(argv), cwd=tmp_path, capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, (argv, r.stdout, r.stderr)
            if argv[1:3] == ["space", "create"]:
                space = argv[4]
                for url in nodes:
                    wait_for(lambda: request("GET", url + f"/v1/spaces/{space}/keys")[0] == 200, 30,
                             f"space {space} on {url}")
            if argv[1] == "put":
                writes[argv[4]] = (argv[2], json.loads(argv[5]))
        written_on = {addr for addr, _ in writes.values()}
        assert len(written_on) == 3, "a write on each node"
        for url in nodes:
            for key, (_, value) in writes.items():
                wait_for(lambda: request("GET", f"{url}/v1/spaces/{space}/keys/{key}")[0] == 200, 30,
                         f"{key} on {url}")
                assert request("GET", f"{url}/v1/spaces/{space}/keys/{key}")[1]["value"] == value
            assert len(request("GET", url + "/v1/info")[1]["upstreams"]) == 2, "each node follows both others"
        assert {"n1", "n2", "n3"} <= set(os.listdir(tmp_path)), "data dirs where the README puts them"
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                assert p.wait(30) == 0
            finally:
                if p.poll() is None:
                    p.kill()
        for r in held.values():
            r.close()
