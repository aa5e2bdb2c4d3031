"""Every bound replog keeps, in one place, each with its unit last and a line on why.

Modules import these names instead of writing numbers inline, so a reviewer can see
every queue, frame and retry limit at a glance (TigerBeetle's habit)."""

# --- client API -------------------------------------------------------------
key_bytes_max = 1024                 # SPEC: keys are UTF-8 strings up to 1 KiB
value_bytes_max = 1024 * 1024        # SPEC: values up to 1 MiB (encoded size)
space_name_chars_max = 64            # SPEC: [A-Za-z_][A-Za-z0-9_]{0,63}
body_bytes_max = 8 * 1024 * 1024     # one HTTP body; a 1000-op txn of small values fits easily
txn_ops_max = 10_000                 # one client transaction; keeps one WAL frame bounded
range_limit_default = 100            # GET .../keys without limit
range_limit_max = 10_000             # one page of a range read
spaces_max = 4096                    # user + system spaces per node

# --- WAL ----------------------------------------------------------------------
frame_bytes_max = 64 * 1024 * 1024   # one WAL frame (one or a few transactions)
segment_bytes_max = 64 * 1024 * 1024 # rotate a segment past this size
segment_header_bytes_max = 16 * 1024 * 1024  # header holds the whole _cluster table
group_commit_txns_max = 4096         # transactions that share one write (and one fsync)
group_commit_bytes_max = 8 * 1024 * 1024  # bytes that share one write
journal_inline_rows_max = 256        # a batch this small is persisted on the event loop when it cannot
                                     # wait for the disk (no fsync, no rotation): write + apply cost
                                     # ~3 us/row, less than the thread hand-off and GIL wait they replace,
                                     # which were the largest share of replication lag under load

# --- cluster ------------------------------------------------------------------
members_max = 4096                   # SPEC asks for at least 255; ids are plain ints
replica_id_max = 1 << 31             # ids fit msgpack's int32 comfortably

# --- replication --------------------------------------------------------------
message_bytes_max = 16 * 1024 * 1024 # one WebSocket message (a batch of txns or a snapshot chunk)
relay_batch_txns_max = 1024          # txns per relay message
relay_batch_bytes_max = 1024 * 1024  # bytes per relay message (before framing)
relay_tail_bytes_max = 4 * 1024 * 1024  # WAL frames the journal keeps in memory for caught-up relays
                                     # (a few seconds at 10k rows/s); a relay behind that reads the file
snapshot_chunk_rows_max = 4096       # rows per snapshot chunk during JOIN
applier_pending_rows_max = 20_000    # rows queued to the journal before appliers stop reading; a few
                                     # group-commit batches keep the writer busy, more only grows the heap
heartbeat_interval_s = 1.0           # idle links send a heartbeat this often
peer_timeout_s = 10.0                # no message for this long: the link is dead
handshake_timeout_s = 10.0           # a peer must finish auth + greeting within this
link_close_timeout_s = 2.0           # closing a link waits this long for the peer's CLOSE
reconnect_backoff_min_s = 0.1        # first retry after a broken link
reconnect_backoff_max_s = 5.0        # retries back off to at most this
refused_backoff_s = 10.0             # a peer that refused us (wrong secret, cluster) is retried this slowly
ack_interval_s = 0.05                # appliers send ACKs at most this often (batched)

# --- lifecycle ----------------------------------------------------------------
shutdown_deadline_s = 10.0           # orderly shutdown gives up waiting after this
http_drain_s = 5.0                   # requests still running at shutdown get this long, then are cancelled
checkpoint_interval_s = 60.0         # LMDB is synced and WAL collected this often
anon_ttl_s = 3600.0                  # an anonymous replica's position holds WAL this long

# --- garbage collector ----------------------------------------------------------
# Start-up objects are frozen (never scanned again) and the young generation is large:
# the hot path allocates many short-lived acyclic tuples, and with the default 700 the
# cyclic GC took ~20% of a catching-up replica's CPU, with ~100 ms full collections;
# at 20,000 it still took 0.7 us a row (10%), at 100,000 0.23 us (bench.applier --gc-stats).
gc_gen0_objects = 100_000            # allocations (net) between young collections
gc_gen1_collections = 50             # young collections between middle ones
gc_gen2_collections = 100            # middle collections between full ones (CPython also waits
                                     # until 25% of long-lived objects are new)

# --- link security: before and around authentication ------------------------------
# Before a peer has proven the cluster secret only HELLO, AUTH, AUTH_OK and ERROR travel
# (each ~150 bytes): nothing larger is read, and nothing is inflated (no permessage-deflate).
preauth_message_bytes_max = 1024     # one WebSocket message before auth (node/applier/ws_limit.py)
handshakes_in_flight_max = 256       # unauthenticated inbound links at once: refused (503) beyond, before the upgrade
handshakes_per_address_max = 32      # ... from one address: a host runs a few nodes, each opens one link per peer
auth_failure_log_interval_s = 60.0   # failed handshakes from one address: one WARNING per interval, with a count
auth_failure_addresses_max = 1024    # addresses counted apart for that; beyond, they share one line
lease_verify_interval_s = 0.5        # a peer's claim of a newer lease version re-reads the lease store at most this often

# --- dashboard (node/http/events.py, node/http/browser.py) -----------------------
events_interval_s = 1.0              # one snapshot per node per second is live enough to read and
                                     # shows a killed node within a second or two
events_cpu_share_max = 0.05          # a snapshot that takes longer to build (a very large _cluster)
                                     # stretches the interval so the dashboard uses at most 5% of the loop
events_listeners_max = 32            # open /v1/events streams per node: a few operators' browsers,
                                     # not a fan-out service; the next one is refused with 503
events_queue_frames_max = 4          # snapshots waiting for one listener; a listener this far behind
                                     # is dropped (it reconnects), never buffered without bound
events_write_timeout_s = 10.0        # one snapshot must reach a listener's socket within this, or the
                                     # stream is cut: a stalled browser does not hold a connection
cors_max_age_s = 600                 # browsers may cache a preflight answer this long
