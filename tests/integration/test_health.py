"""Health that tells the truth, on real processes: /readyz follows the upstreams, /v1/health
stays 200 while the node serves but says `degraded` with warnings, /livez answers with the loop's
lateness; and the event-loop watch itself on a real loop (node/http/health.py)."""
from __future__ import annotations

import asyncio
import signal
import time

from node import limits
from node.http.health import LoopWatch
from tests.integration.harness import ReplogProcess, mesh, wait_for


def test_readyz_flips_when_an_upstream_dies_and_back_when_it_returns(tmp_path, procs):
    a, b = mesh(tmp_path, 2)
    procs.extend([a, b])
    wait_for(lambda: a.get("/readyz")[0] == 200, 30, "A ready once it follows B")
    s, d = a.get("/readyz")
    assert d["status"] == "ready" and d["reasons"] == [] and d["upstreams"] == {
        "configured": 1, "following": 1, "down_max": 0}
    assert a.get("/v1/health") == (200, {"status": "ok", "warnings": []})

    b.kill9()
    wait_for(lambda: a.get("/readyz")[0] == 503, 30, "A not ready once its only upstream is gone")
    s, d = a.get("/readyz")
    assert d["status"] == "not_ready" and d["upstreams"]["following"] == 0
    assert any(b.address in r for r in d["reasons"]), d
    # /v1/health keeps its meaning (the node serves clients) and says what is wrong
    s, h = a.get("/v1/health")
    assert s == 200 and h["status"] == "degraded", h
    assert h["warnings"][0].startswith("every upstream is down") and any(b.address in w for w in h["warnings"])
    a.create_space("kv")                          # it still takes writes (multi-master)
    a.kv_put("kv", "still", "served")

    b.start()
    wait_for(lambda: a.get("/readyz")[0] == 200, 30, "A ready again once B is back")
    assert a.get("/v1/health") == (200, {"status": "ok", "warnings": []})


def test_ready_upstreams_down_max_lets_a_node_stay_ready_with_one_upstream_down(tmp_path, procs):
    nodes = mesh(tmp_path, 3, extra=["--ready-upstreams-down-max", "1"])
    procs.extend(nodes)
    a, b, c = nodes
    wait_for(lambda: a.get("/readyz")[1]["upstreams"]["following"] == 2, 30, "A follows B and C")
    c.kill9()
    wait_for(lambda: any(u["status"] != "follow" for u in a.info()["upstreams"]), 30, "A sees C down")
    s, d = a.get("/readyz")
    assert s == 200 and d["upstreams"] == {"configured": 2, "following": 1, "down_max": 1}, d
    s, h = a.get("/v1/health")
    assert h["status"] == "degraded" and len(h["warnings"]) == 1 and c.address in h["warnings"][0]
    b.kill9()
    wait_for(lambda: a.get("/readyz")[0] == 503, 30, "A not ready with both upstreams down")


def test_a_node_that_is_still_joining_is_neither_ready_nor_healthy_but_live(tmp_path, procs):
    """B lists a peer that never answers and waits for 2 initial members: it is live, not ready."""
    b = ReplogProcess(tmp_path, "b", peers=["127.0.0.1:9"], extra=["--cluster-wait-for", "2"]).start(wait=False)
    procs.append(b)
    wait_for(lambda: b.get("/livez")[0] == 200, 30, "B live")
    s, d = b.get("/readyz")
    assert s == 503 and d["reasons"][0].startswith("node is "), d
    s, h = b.get("/v1/health")
    assert s == 503 and h["status"] != "ok"
    s, live = b.get("/livez")
    assert live["status"] == "live" and live["reasons"] == [] and live["loop_lag_s"] < 5


def test_probes_need_no_token(tmp_path, procs):
    (tmp_path / "token").write_text("tok\n")
    n = ReplogProcess(tmp_path, "n", extra=["--token-file", str(tmp_path / "token")], token="tok").start()
    procs.append(n)
    for path in ("/livez", "/readyz", "/v1/health"):
        assert n.get(path, token=None)[0] == 200, path
    assert n.get("/v1/info", token=None)[0] == 401


def test_livez_fails_after_the_event_loop_stalled_and_recovers_after_the_window(tmp_path, procs):
    """SIGSTOP freezes the process (its loop too); after SIGCONT the watch's overdue wake-up
    shows the stall, /livez answers 503 naming it, and live again once it left the window."""
    n = ReplogProcess(tmp_path, "n", extra=["--live-loop-lag-max-s", "1"]).start()
    procs.append(n)
    assert n.get("/livez")[0] == 200
    n.proc.send_signal(signal.SIGSTOP)
    time.sleep(1.5)                              # the stall under test, not a synchronisation
    n.proc.send_signal(signal.SIGCONT)
    s, d = n.get("/livez")
    assert s == 503 and d["status"] == "not_live" and "event loop was" in d["reasons"][0], d
    assert d["loop_lag_s"] >= 1.5 - limits.loop_watch_interval_s - 0.1
    assert n.get("/v1/health")[0] == 200         # it serves: only liveness judges the loop
    wait_for(lambda: n.get("/livez")[0] == 200, limits.loop_watch_window_s + 10, "live again after the window")


async def test_the_loop_watch_sees_a_blocked_loop_and_forgets_it_after_its_window(monkeypatch):
    monkeypatch.setattr(limits, "loop_watch_window_s", 1.0)
    w = LoopWatch()
    w.start()
    try:
        await asyncio.sleep(limits.loop_watch_interval_s * 2)
        assert w.lag_s() < 0.2
        time.sleep(0.6)                          # the loop is blocked: its watch cannot wake
        assert w.lag_s() >= 0.6 - limits.loop_watch_interval_s - 0.05, "overdue right now"
        await asyncio.sleep(limits.loop_watch_interval_s * 2)
        assert w.lag_s() >= 0.5, "kept for the window"
        assert w.current_s() < 0.2, "the latest wake-up came on time"
        await asyncio.sleep(1.2)
        assert w.lag_s() < 0.2, "forgotten after the window"
    finally:
        await w.stop()
