"""The binary client protocol: its wire format (wire.py), a connection's session (session.py),
the write fast path into the journal (writes.py) and the TCP listener (listener.py).
docs/client.md describes it for clients; replog/ is the SDK that speaks it."""
