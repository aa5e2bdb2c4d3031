"""How the replication benchmarks' replog nodes link to each other: the `--links` variants
of bench/applier.py and bench/lag.py, run in alternation so their figures sit side by side.

  plain   the default: links authenticated by the cluster secret, every message sealed with
          its session tag (node/core/session.py), no TLS
  tls     the same inside TLS (node/tls.py): certificates from a throwaway CA made for the run
          (bench/throwaway_ca.py); the benchmark's own HTTP calls speak https too. A TLS node
          runs on asyncio's event loop (docs/operations.md: uvloop's TLS reset fault)
  asyncio plain, on asyncio's event loop instead of uvloop (`--event-loop asyncio`): beside
          plain, what the loop costs; beside tls, what TLS itself costs
  nomac   plain with the per-message tag neither computed nor checked (a prelude replaces
          Session.seal_parts/unseal in every node of the run): what the MAC costs, beside plain.
          A benchmark-only variant; no option of the node turns the MAC off.
  base    plain, with the nodes run from another checkout (`--baseline DIR`, a tree whose native
          extension is built: `python setup.py build_ext --inplace` there): a change's before and
          after, measured in one alternating run.

Each variant is one `system` in the benchmarks' tables: replog, replog+tls, replog-asyncio,
replog-nomac, replog-base."""
from __future__ import annotations

import os

LINKS = ("plain", "tls", "asyncio", "nomac", "base")
SYSTEM = {"plain": "replog", "tls": "replog+tls", "asyncio": "replog-asyncio", "nomac": "replog-nomac",
          "base": "replog-base"}
VARIANTS = ("replog+tls", "replog-asyncio", "replog-nomac", "replog-base")     # each printed beside plain

# Replaces the session tag by 16 zero bytes that nobody checks: the framing (and the slice the
# receiver takes) stay, the HMAC goes.
NO_MAC_PRELUDE = (
    "import node.core.session as _s\n"
    "_s.Session.seal_parts = lambda self, parts: b''.join([*parts, bytes(_s.TAG_BYTES)])\n"
    "_s.Session.unseal = lambda self, data: data[:-_s.TAG_BYTES]\n"
)


def parse(arg: str, baseline: str | None = None) -> list[str]:
    out = [x.strip() for x in arg.split(",") if x.strip()]
    bad = [x for x in out if x not in LINKS]
    if not out or bad:
        raise ValueError(f"--links takes {', '.join(LINKS)} (comma-separated), got {arg!r}")
    if ("base" in out) != bool(baseline):
        raise ValueError("--links base and --baseline DIR go together")
    if baseline and not os.path.isfile(os.path.join(baseline, "node", "__main__.py")):
        raise ValueError(f"--baseline {baseline}: not a replog checkout (no node/__main__.py)")
    return out


def baseline_prelude(tree: str) -> str:
    """Run the node from `tree` instead of this checkout (put first on sys.path)."""
    return f"import sys; sys.path.insert(0, {os.path.abspath(tree)!r}); sys.modules.pop('node', None)"


class LinkSetup:
    """Per benchmark run: the CA (made on first use) and each variant's node settings."""

    def __init__(self, directory: str, baseline: str | None = None):
        self.dir = directory
        self.baseline = baseline
        self._ca = None

    def node_kwargs(self, variant: str, name: str) -> dict:
        """ReplogNode keyword arguments for a node of this variant: tls (NodeTls), prelude and
        event_loop."""
        if variant == "tls":
            if self._ca is None:
                from bench.throwaway_ca import ThrowawayCA   # cryptography: the dev extra
                self._ca = ThrowawayCA(os.path.join(self.dir, "ca"), name="replog bench CA")
            return {"tls": self._ca.issue(name), "prelude": ""}
        if variant == "base":
            return {"tls": None, "prelude": baseline_prelude(self.baseline)}
        return {"tls": None, "prelude": NO_MAC_PRELUDE if variant == "nomac" else "",
                "event_loop": "asyncio" if variant == "asyncio" else ""}
