"""Writers for tests on real processes: each writes unique keys to one node from a thread of
its own and records what the node acknowledged (tests/integration/oracles.py Acked). A writer
pauses with no write in flight, so a test can wait for other nodes to hold everything it wrote
(tests/integration/nemesis.py, before a store goes)."""
from __future__ import annotations

import asyncio
import threading
import time

import replog
from tests.integration.harness import ReplogProcess
from tests.integration.oracles import Acked
from tests.waiting import wait_for


class Writer:
    """Acknowledged writes of unique keys to one node from a thread, one PUT at a time over
    HTTP; pausable."""

    def __init__(self, node: ReplogProcess, acked: Acked):
        self.node, self.acked = node, acked
        self.done, self.go = threading.Event(), threading.Event()
        self.go.set()
        self.idle = threading.Event()
        self._lock = threading.Lock()           # whether to write next, and `idle`, change together
        self.error: BaseException | None = None  # what ended the thread, if not `stop`
        self.thread = threading.Thread(target=self._run, name=f"writer-{node.name}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        i = 0
        try:
            while not self.done.is_set():
                with self._lock:
                    writing = self.go.is_set()
                    if writing:
                        self.idle.clear()
                    else:
                        self.idle.set()
                if not writing:
                    self.go.wait(0.1)
                    continue
                i = self._write(i)
        except BaseException as e:
            self.error = e
            raise
        finally:
            self._finish()

    def value(self, i: int) -> dict:
        return {"by": self.node.name, "i": i, "pad": "x" * 60}

    def _write(self, i: int) -> int:
        """Write key i; the next key's number."""
        try:
            self.acked.put(self.node, "kv", f"{self.node.name}-{i}", self.value(i))
        except (OSError, AssertionError, ValueError):
            time.sleep(0.05)                        # a client's retry pause, not synchronisation
        return i + 1

    def _finish(self) -> None:
        pass

    def pause(self) -> None:
        """Stop writing; returns once no write of this writer is in flight."""
        with self._lock:
            self.go.clear()
        wait_for(lambda: self.idle.is_set() or self.error is not None, 60, f"{self.node.name}'s writer idle")
        assert self.error is None, f"{self.node.name}'s writer failed: {self.error!r}"

    def stop(self) -> None:
        self.done.set()
        self.go.set()
        self.thread.join(60)


class BinaryWriter(Writer):
    """The same over the binary client protocol (the SDK's AsyncClient, this node only):
    `BATCH` puts at once, which the node takes from one frame into one journal entry. A put
    whose answer did not come (the node died, the link broke: OutcomeUnknown and the rest) is
    not counted; the client is opened again, at the node's address then, for the next batch."""
    BATCH = 8

    def __init__(self, node: ReplogProcess, acked: Acked):
        self.loop = asyncio.new_event_loop()
        self.client: replog.AsyncClient | None = None
        super().__init__(node, acked)

    def _write(self, i: int) -> int:
        keys = [f"{self.node.name}-{j}" for j in range(i, i + self.BATCH)]
        try:
            if self.client is None:
                self.acked.uuid_of(self.node)           # known before a write is counted
                n = self.node
                self.client = replog.AsyncClient([n.address], transport="binary", timeout=5, token=n.token,
                                                 ca_file=n.tls.ca_file if n.tls else None)
            got = self.loop.run_until_complete(self._puts(i, keys))
        except (replog.ReplogError, OSError, AssertionError, ValueError) as e:
            got = [e]
        for j, (k, r) in enumerate(zip(keys, got)):
            if isinstance(r, replog.WriteResult):
                self.acked.record(self.node, "kv", k, self.value(i + j), r.lsn)
        if any(isinstance(r, BaseException) for r in got):
            self._close()
            time.sleep(0.05)                        # a client's retry pause, not synchronisation
        return i + self.BATCH

    async def _puts(self, i: int, keys: list[str]) -> list:
        return await asyncio.gather(*(self.client.put("kv", k, self.value(i + j)) for j, k in enumerate(keys)),
                                    return_exceptions=True)

    def _close(self) -> None:
        if self.client is not None:
            self.loop.run_until_complete(self.client.close())
            self.client = None

    def _finish(self) -> None:
        self._close()
        self.loop.close()


def stop_all(writers) -> None:
    """Stop every writer; each must have ended by `stop`, not by an error of its own."""
    for w in writers:
        w.stop()
        assert w.error is None, f"{w.node.name}'s writer failed: {w.error!r}"
