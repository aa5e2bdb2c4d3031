"""Raising a WebSocket's message size limit once its peer has authenticated: the one place
that reaches into aiohttp's internals.

Before authentication a link reads nothing larger than `limits.preauth_message_bytes_max`
(HELLO, AUTH, AUTH_OK, ERROR are ~150 bytes): an unauthenticated peer must not make a node
buffer or decode megabytes. After it, ROWS and snapshot chunks need `message_bytes_max`.
aiohttp fixes a WebSocket's limit when the reader is built (`WebSocketResponse.prepare`,
`ClientSession.ws_connect`) and the compiled reader keeps it in a C field nobody can change,
so the reader is replaced by an identical one with the larger limit, feeding the same message
queue.

Rules kept here:
- Call it only at a message boundary while the peer is silent: the relay before it sends
  AUTH_OK (the applier waits for it), the applier right after reading AUTH_OK (the relay waits
  for its GREETING). A reader swapped then holds no partial frame; bytes a misbehaving peer
  sent early are lost and its link fails, which is its own fault.
- Links never negotiate compression (both sides pass compress off), so the new reader has
  none either.
- aiohttp refuses a message of exactly its max_msg_size; `reader_limit` gives the value that
  lets a message of exactly our limit through (every limit here is inclusive).
- tests/unit/test_ws_limit.py pins this to the installed aiohttp: a message of exactly the
  small limit passes before auth and one byte more is refused; after auth a message of exactly
  the large limit passes both ways.
"""
from __future__ import annotations

import aiohttp
from aiohttp import web
from aiohttp._websocket.reader import WebSocketReader


def reader_limit(max_bytes: int) -> int:
    """aiohttp's max_msg_size under which messages of up to max_bytes bytes are read."""
    return max_bytes + 1


def raise_message_limit(ws: web.WebSocketResponse | aiohttp.ClientWebSocketResponse, max_bytes: int) -> None:
    """From now on `ws` reads messages of up to max_bytes bytes."""
    if isinstance(ws, web.WebSocketResponse):
        proto = ws._req.protocol                          # aiohttp.web_protocol.RequestHandler
        assert proto._payload_parser is ws._parser, "the WebSocket reader is not the one prepare() made"
        parser = WebSocketReader(ws._reader, reader_limit(max_bytes), compress=False, decode_text=True)
        cb = proto._data_received_cb
        proto._payload_parser = None
        proto.set_parser(parser, data_received_cb=cb)
    else:
        proto = ws._conn.protocol                         # aiohttp.client_proto.ResponseHandler
        assert proto._payload_parser is ws._parser, "the WebSocket reader is not the one ws_connect() made"
        parser = WebSocketReader(ws._reader, reader_limit(max_bytes), compress=False, decode_text=True)
        proto.set_parser(parser, ws._reader, data_received_cb=proto._data_received_cb)
    ws._parser = parser                                   # the response owns its reader (a weakref elsewhere)
