"""replog's client SDK: `replog.Client` (blocking) and `replog.AsyncClient` (asyncio).

    import replog
    with replog.Client(["127.0.0.1:7301", "127.0.0.1:7302"], token="...") as c:
        c.create_space("kv")
        w = c.put("kv", "a", {"x": 1})
        print(c.get("kv", "a", after=w.vclock))

Both speak the node's binary client protocol (docs/client.md), or its HTTP API where that port
cannot be reached, fail over along the list of nodes by a documented retry rule, batch
concurrent calls into frames, and raise the typed exceptions of replog.errors."""
from replog.aio import AsyncClient, AsyncTxn, Item, WriteResult
from replog.errors import (BadRequest, Conflict, Forbidden, NotFound, OutcomeUnknown, ReplogError, ServerError,
                           Timeout, TooLarge, Unauthorized, Unavailable)
from replog.sync import Client, Txn

__all__ = ["AsyncClient", "AsyncTxn", "Client", "Txn", "Item", "WriteResult", "ReplogError", "BadRequest", "TooLarge",
           "Forbidden", "Unauthorized", "NotFound", "Conflict", "Timeout", "Unavailable", "OutcomeUnknown",
           "ServerError"]
