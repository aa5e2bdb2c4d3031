"""A bare binary-protocol client for tests: blocking sockets, frames as node/clientproto/wire.py
defines them, nothing of the SDK (so the tests see what the node itself sends)."""
from __future__ import annotations

import socket
import ssl
from typing import Any

from node.clientproto import wire
from tests.integration.harness import ReplogProcess, request


def client_port(node: ReplogProcess) -> int:
    s, d = node.get("/v1/client")
    assert s == 200 and d["port"], (s, d)
    return d["port"]


class Raw:
    def __init__(self, node: ReplogProcess, timeout: float = 20.0, ca_file: str | None = None):
        sock = socket.create_connection(("127.0.0.1", client_port(node)), timeout=timeout)
        if ca_file:
            sock = ssl.create_default_context(cafile=ca_file).wrap_socket(sock, server_hostname="127.0.0.1")
        self.sock = sock
        self.buf = b""
        self.answers: dict[Any, tuple[int, Any]] = {}
        self.order: list[Any] = []          # ids in the order their answers arrived
        self.vclocks: list[dict | None] = []

    def send(self, reqs: list) -> None:
        self.sock.sendall(wire.encode_requests(reqs))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_frame(self) -> tuple[Any, list] | None:
        """One answer frame, or None when the node closed the connection."""
        while True:
            if len(self.buf) >= 4:
                n = wire.HEAD.unpack_from(self.buf)[0]
                if len(self.buf) >= 4 + n:
                    payload, self.buf = self.buf[4:4 + n], self.buf[4 + n:]
                    vclock, answers = wire.decode_answers(payload)
                    self.vclocks.append(vclock)
                    for rid, status, body in answers:
                        self.answers[rid] = (status, body)
                        self.order.append(rid)
                    return vclock, answers
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                return None
            self.buf += chunk

    def wait(self, *ids: Any) -> list[tuple[int, Any]]:
        while not all(i in self.answers for i in ids):
            if self.read_frame() is None:
                raise ConnectionError(f"closed before answering {[i for i in ids if i not in self.answers]}")
        return [self.answers[i] for i in ids]

    def call(self, *req: Any) -> tuple[int, Any]:
        self._next_id = getattr(self, "_next_id", 1_000_000) + 1      # apart from the ids tests choose
        rid = self._next_id
        self.send([[rid, *req]])
        return self.wait(rid)[0]

    def closed_by_node(self) -> bool:
        """Read until the node closes; True if it did (answers read meanwhile are kept)."""
        try:
            while self.read_frame() is not None:
                pass
        except (ConnectionResetError, socket.timeout):
            return False
        return True

    def close(self) -> None:
        self.sock.close()


def http_error(node: ReplogProcess, method: str, path: str, body: Any = None) -> tuple[int, str]:
    s, d = request(method, node.url + path, body, token=node.token)
    return s, (d or {}).get("error", {}).get("code") if isinstance(d, dict) else None
