"""Every bound replog keeps, in one place, each with its unit last and a line on why.

Modules import these names instead of writing numbers inline, so a reviewer can see
every queue, frame and retry limit at a glance (TigerBeetle's habit).

The data bounds come first and are derived from one another: what the API accepts, the WAL
holds, a replication message carries, a snapshot chunk carries and LMDB stores is one number
per quantity, so whatever is acknowledged can be replicated, recovered and read back. The
assertions at the end of that section keep the derivations honest when a number changes.
docs/limits.md lists them with what happens to input past each."""

# --- data: one bound per quantity, checked at every edge (node/core/validate.py) ------------
key_bytes_max = 511                  # LMDB's largest key (mdb_env_get_maxkeysize); Store refuses to
                                     # open with an LMDB built with a smaller one
value_bytes_max = 1024 * 1024        # one value, as canonical msgpack (SPEC: values up to 1 MiB)
value_depth_max = 64                 # containers nested in one value ([] is 1, [[]] 2): deeper than
                                     # real documents go (MongoDB allows 100, Elasticsearch maps 20),
                                     # shallow enough for every recursive reader (Python's json at its
                                     # default limit, msgspec, a client's msgpack) to read it back
space_name_chars_max = 64            # SPEC: [A-Za-z_][A-Za-z0-9_]{0,63}
address_bytes_max = 255              # a member's host:port (a DNS name is at most 253 characters)
uuid_chars = 36                      # a member or cluster uuid, canonical 8-4-4-4-12 lowercase hex
lsn_max = 1 << 62                    # the largest lsn (and vclock component) anywhere: a row's lsns
                                     # plus its op count stay within int64 arithmetic (node/core/
                                     # _rowscan.c), and at a million rows a second it lasts 146k years
timestamp_us_max = 1 << 62           # the largest row timestamp (µs): the HLC never passes it, so it
                                     # can always add 1 within int64 and uint64 (year ~148,000)
hlc_offset_max_s = 60.0              # a remote row may be ahead of this node's wall clock by at most
                                     # this (CockroachDB's --max-offset, Tarantool's replication
                                     # clock checks): a row further ahead is refused, never absorbed
                                     # into the HLC, where it would make every later local write lose
                                     # last-writer-wins. Generous: a refused row stalls its origin's
                                     # link until the clocks agree again, which NTP keeps within ms
message_bytes_max = 16 * 1024 * 1024 # one WebSocket message (a batch of txns, a snapshot chunk, a
                                     # greeting with the whole _cluster)
message_margin_bytes = 64 * 1024     # a ROWS message's own framing around one txn (~40 bytes) and the
                                     # replica id a receiver rewrites (<= 8 bytes), with ample room
txn_bytes_max = message_bytes_max - message_margin_bytes  # one transaction's encoding: it must fit,
                                     # alone, in one ROWS message, or its origin could never replicate
txn_ops_max = 10_000                 # one transaction's rows; keeps one WAL frame bounded
record_bytes_max = key_bytes_max + value_bytes_max + 64    # one stored record (node/core/record.py)
                                     # with its key, as a snapshot row carries it
snapshot_chunk_rows_max = 4096       # rows per snapshot chunk during JOIN
snapshot_chunk_bytes_max = 4 * 1024 * 1024  # bytes of records per snapshot chunk: a chunk is sent
                                     # once it holds this much, so it stays below this plus one record
members_max = 4096                   # SPEC asks for at least 255; ids are plain ints
replica_id_max = 1 << 31             # ids fit msgpack's int32 comfortably
cluster_row_bytes_max = 2 * uuid_chars + address_bytes_max + 96   # one encoded _cluster row
spaces_max = 4096                    # spaces a client may create on one node
store_spaces_max = 2 * spaces_max    # the store's hard capacity (LMDB max_dbs): spaces created on
                                     # masters apart during a partition may add up past spaces_max;
                                     # a replicated create past this is refused before the WAL
store_system_dbs = 8                 # _meta, _spaces, _cluster, _cluster_ids, and room to grow
cluster_name_chars_max = 64          # option cluster_name, and a greeting's: a name a person reads in logs
greeting_field_chars_max = 64        # a greeting's status and options digest (a sha-256 in hex): longer is
                                     # not a replog peer, and would be copied into this node's logs and status
value_sure_items_max = 32            # the fast paths take a decoded map or array of at most this many
value_sure_str_chars_max = 4096      # scalars, its strings at most this long and its map keys at most
value_sure_key_chars_max = 256       # this long, without walking it (node/core/validate.py
                                     # decoded_flat_ok): it cannot pass value_bytes_max (checked below),
                                     # and it covers the usual small documents; anything else is walked
store_readers_max = 256              # LMDB reader slots: every thread that reads at once (the loop, the
                                     # executor, snapshot and backup readers) with ample room

# --- space: the store's map and the disk (node/storage/space.py) ------------------------
store_map_bytes_default = 1 << 36    # LMDB map (option map_size): address space, not disk; 64 GiB is
                                     # far more than one node's data and costs nothing until used
store_map_bytes_min = 1 << 20        # a map smaller than this cannot hold a bootstrapped store
store_map_bytes_max = 1 << 44        # 16 TiB: well inside a 64-bit process's address space (128 TiB)
store_map_warn_ratio = 0.9           # /v1/health warns when the map's high-water mark passes this
                                     # share of map_size: time to raise it before writes stop
disk_reserve_bytes_default = 32 * 1024 * 1024  # option disk_reserve_bytes: writes stop while the data
                                     # dir's file system has less free, so a group commit batch in
                                     # flight (<= 8 MiB) and its LMDB pages never meet a full disk
nospace_suspect_bytes = 64 * 1024 * 1024  # an LMDB commit that fails short of ENOSPC (a short write
                                     # reads as EIO) with less than this free is blamed on space, not on
                                     # a broken disk: one commit writes at most a few batches' pages
nospace_retry_s = 1.0                # a write that failed for lack of space is tried again this often
space_sample_reserve_parts = 8      # ...and again after every 1/8 of disk_reserve_bytes went to the WAL
space_check_interval_s = 1.0         # disk free space and map use are sampled this often (statvfs)

# --- backup (node/backup.py) ------------------------------------------------------------
backup_copy_chunk_bytes = 1024 * 1024  # WAL bytes copied per read: the copy runs on a thread and
                                     # holds the GIL only between chunks
backups_in_flight_max = 1            # one backup of a node at a time; another is refused (409 busy)
backup_stop_log_s = 5.0              # a stop waiting for a backup's store copy says how far it is this often
fault_stall_s = 3.0                  # the fault point stall_write blocks the event loop this long (tests)

# --- client API -------------------------------------------------------------
body_bytes_max = 8 * 1024 * 1024     # one HTTP body; a 1000-op txn of small values fits easily
range_limit_default = 100            # GET .../keys without limit
range_limit_max = 10_000             # one page of a range read
http_header_timeout_s = 10.0         # a connection must send a whole request head within this (from
                                     # connect, or from its previous answer), or it is closed
http_body_timeout_s = 30.0           # a request body must arrive within this: 8 MiB at ~300 KB/s
http_connections_max = 1024          # open client connections; past it new ones are closed at once,
                                     # so the fds the WAL, LMDB and links need stay free (the limit is
                                     # also lowered below the process's fd limit: node/http/listener.py)
http_fds_reserved = 128              # fds kept for everything but client connections
accept_error_log_interval_s = 60.0   # "out of fds" on accept is logged at most this often
client_request_timeout_s = 10.0      # one call of node/client.py (CLI, demo, benches, tests) waits this
peers_stop_wait_s = 5.0              # PUT /v1/admin/peers waits this for removed appliers to stop (a
                                     # link closes within link_close_timeout_s), then answers with those
                                     # still stopping: always within a client's request timeout
wait_timeout_ms_default = 5_000      # a read with after_vclock (or a wait) without a timeout waits this long
wait_timeout_ms_max = 60_000         # ... and at most this: a client that needs longer asks again, so no
                                     # request holds a connection (and a task) for ever

# --- binary client protocol (node/clientproto/) ------------------------------
client_frame_bytes_max = body_bytes_max   # one frame of requests: what one HTTP body may carry, so the
                                     # largest value and transaction HTTP accepts fit, and no more
client_frame_requests_max = 4096     # requests in one frame: bounds the work one read of a socket starts
client_pending_requests_max = 16_384 # requests of one connection not yet answered; past it the node stops
                                     # reading that connection until answers go out (back-pressure)
client_send_buffer_bytes_max = 16 * 1024 * 1024  # answers queued for a client that does not read;
                                     # past it the node stops reading its requests until it drains
client_hello_bytes_max = 4096        # bytes read before a connection is authenticated: a HELLO with a token
client_hello_timeout_s = http_header_timeout_s  # a connection must say HELLO within this of connecting
client_waits_max = 4096              # requests waiting for a vclock at once, node-wide (each holds a task)
client_port_offset = 1000            # the binary port defaults to the HTTP port + this (or - this when the
                                     # sum would pass 65535): derived, so a cluster's ports stay predictable
client_request_id_max = (1 << 63) - 1  # a request's id, echoed in its answer: any int64 a client counts with
client_accept_backlog = 1024         # connections the kernel queues for the binary port before accept: a
                                     # burst of SDK clients reconnecting after a restart is not refused

# --- WAL ----------------------------------------------------------------------
frame_bytes_max = 4 * message_bytes_max  # one WAL frame: a local txn, or what the applier took from
                                     # one received message, whose txns may each grow by the bytes
                                     # of a rewritten replica id (<= 8 per txn of >= 16 bytes)
segment_bytes_max = 64 * 1024 * 1024 # rotate a segment past this size
segment_bytes_max_max = 4 << 30      # the largest segment_bytes_max a node takes (config.py)
segment_header_bytes_max = 16 * 1024 * 1024  # header holds the whole _cluster table
group_commit_txns_max = 4096         # transactions that share one write (and one fsync)
group_commit_bytes_max = 8 * 1024 * 1024  # bytes that share one write
recovery_batch_txns_max = 2048       # WAL txns replayed per store transaction at start-up: few commits,
                                     # and a refused txn is found again by replaying its batch one by one
journal_drain_wait_s = 1.0           # waiting for queued entries to land, look again at least this often
journal_inline_rows_max = 256        # a batch this small is persisted on the event loop when it cannot
                                     # wait for the disk (no fsync, no rotation): write + apply cost
                                     # ~3 us/row, less than the thread hand-off and GIL wait they replace,
                                     # which were the largest share of replication lag under load

# --- replication --------------------------------------------------------------
relay_batch_txns_max = 1024          # txns per relay message
relay_batch_bytes_max = 1024 * 1024  # bytes per relay message (before framing); a frame larger than
                                     # this goes alone, split by whole txns if it must (each fits)
frame_head_bytes_max = 16            # a frame payload's own framing around its txns: [written_us, [...]]
                                     # (two array heads and a uint64)
relay_frame_alone_bytes_max = txn_bytes_max + frame_head_bytes_max  # a WAL frame this large still travels
                                     # in one ROWS message (the margin holds the message's own head);
                                     # a larger one is split by whole txns, each of which fits
relay_file_read_bytes_min = 1024 * 1024  # a relay behind reads the WAL file at least this much at a time
relay_tail_bytes_max = 4 * 1024 * 1024  # WAL frames the journal keeps in memory for caught-up relays
                                     # (a few seconds at 10k rows/s); a relay behind that reads the file
applier_pending_rows_max = 20_000    # rows queued to the journal before appliers stop reading; a few
                                     # group-commit batches keep the writer busy, more only grows the heap
heartbeat_interval_s = 1.0           # idle links send a heartbeat this often
peer_timeout_s = 10.0                # no message for this long: the link is dead
twin_live_s = 3.0                    # a subscriber that ACKed within this is a live process (node/core/link/twins.py)
twin_confirm_s = 2 * twin_live_s     # refused as a live subscriber's twin for this long: the younger stops
handshake_timeout_s = 10.0           # a peer must finish auth + greeting within this
snapshot_message_timeout_s = 60.0    # a joiner waits this long for each message of a snapshot (a chunk of
                                     # 4 MiB read off the donor's store, on a busy donor)
link_close_timeout_s = 2.0           # closing a link waits this long for the peer's CLOSE
reconnect_backoff_min_s = 0.1        # first retry after a broken link
reconnect_backoff_max_s = 1.0        # retries back off to at most this (a peer back is followed within ~1 s)
link_retry_log_interval_s = 30.0     # one line per interval for the same failure of one upstream, with a count
link_retry_lines_max = 8             # distinct failures of one upstream counted apart for that
refused_backoff_s = 10.0             # a peer that refused us (wrong secret, cluster) is retried this slowly
peer_error_chars_max = 1000          # a peer's ERROR code and message are cut to this before they reach
                                     # the log, an applier's status, /v1/info and the dashboard
wal_sync_interval_s = 1.0            # wal_mode write: the written WAL tail is fsync'd this often (so a
                                     # power cut loses at most about this much, and ACKs report what is
                                     # on disk without waiting for a checkpoint)
ack_interval_s = 0.05                # appliers send ACKs at most this often (batched)

# --- lifecycle ----------------------------------------------------------------
shutdown_deadline_s = 10.0           # orderly shutdown gives up waiting after this
http_drain_s = 5.0                   # requests still running at shutdown get this long, then are cancelled
checkpoint_interval_s = 60.0         # LMDB is synced and WAL collected this often
anon_ttl_s = 3600.0                  # an anonymous replica's position holds WAL this long
anon_acks_max = 1024                 # anonymous subscribers whose acknowledged position is kept (an ACK
                                     # comes from any uuid that holds the secret): past it, the one
                                     # heard from longest ago is forgotten
anon_followers_max = anon_acks_max   # anonymous replicas a node remembers beside its identity as its
                                     # followers (node/fence.py; a lost store waits for them): a peer
                                     # subscribing under made-up uuids cannot grow the file, or what a
                                     # fence waits for, past this
forgotten_followers_max = 4 * anon_followers_max   # anonymous replicas the operator had this node forget
                                     # (DELETE /v1/admin/followers), refused if they come back: past it
                                     # the one forgotten longest ago is dropped from the list
task_restart_s = 5.0                 # a supervised background task that failed is restarted after this
peer_poll_timeout_s = 5.0            # one status poll of one peer while a cluster forms (connect + auth +
                                     # greeting)
peer_poll_quick_timeout_s = 2.0      # ... when the node does not wait for its peers: a missing one is skipped
join_wait_backoff_s_max = 1.0        # a forming cluster polls its peers at most this far apart
catch_up_poll_s = 0.05               # how often a catching-up member compares vclocks
address_follow_s = 0.5               # how often appliers are checked against members' new addresses
join_retry_s = 0.5                   # a registration or anonymous snapshot that found no usable peer is
                                     # tried again after this

# --- orderly cluster shutdown (node/cluster_shutdown.py) ----------------------------------
shutdown_converge_s = 20.0           # quiesced members must reach one vclock by then
shutdown_converge_poll_s = 0.1       # ... compared this often
shutdown_call_timeout_s = 5.0        # one shutdown phase call to one member
quiesce_hold_s = 60.0                # a quiesced member that hears no final phase resumes serving

# --- membership data safety (node/fence.py, node/rejoin.py) --------------------------------
fence_poll_s = 0.1                   # how often a fenced node checks whether it may write again
rejoin_retry_s = 5.0                 # a node that needs a snapshot but holds rows no peer has asks again this often
rejoin_blocked_error_s = 30.0        # ... said as a WARNING until it has stood this long, then an ERROR
rejoin_recheck_s = 0.25              # a link told to rejoin looks this often whether other links brought the rows
rejoin_watch_s = 0.2                 # how often the rejoin watch looks at what its upstreams reported
rejoin_cover_wait_s = 10.0           # with writes paused, how long a rejoin waits for a donor to receive
                                     # this node's last rows before it gives up for now and serves again
rejoin_cover_poll_s = 0.2            # ... asking the donor this often
register_apply_attempts_max = 8      # applies of one registration per call; the transport's own timeout
                                     # spaces them (node/identity/identity_file.py)

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
handshake_uuid_chars_max = 64        # a uuid in HELLO/AUTH (canonical ones have 36 characters)

# --- leases (node/identity/) ---------------------------------------------------------
lease_duration_ms_min = 100          # below this, duration/3 is shorter than a store round trip
lease_duration_ms_max = 3_600_000    # a crashed node's slot must come back within an hour
lease_renew_divisor = 3              # SPEC: renew every duration/3
lease_safety_margin_divisor = 4      # stop serving duration/4 before expiry: clock skew + time to stop
lease_retry_divisor = 12             # after a failed renewal retry every duration/12: ~4 tries before the deadline
lease_body_bytes_max = 1024 * 1024   # known_versions for members_max slots fits easily; bigger is garbage
lease_task_id_chars_max = 256        # an ECS task ARN or host:pid fits
lease_cluster_size_max = members_max  # one slot per member
lease_int_max = lsn_max              # versions, serials, expiries: a body is read back from a file or S3,
                                     # and what it holds goes into greetings (msgpack int64) and arithmetic
lease_nonce_chars_max = 256          # ours are 32 hex digits
lease_own_nonces_max = 8             # our writes whose outcome a read-back may still reveal
lease_renew_writes_max = 2           # a renewal retries once after finding an older write of ours
lease_acquire_store_retry_s_max = 30.0  # a lease store unreachable this long at start-up is a setup error: exit
lease_acquire_retry_s_min = 0.1      # first retry after the store did not answer
lease_acquire_retry_s_max = 5.0      # backoff cap while the store does not answer
lease_acquire_poll_divisor = 6       # all slots held: look again every duration/6 (a freed slot is seen soon)
lease_acquire_log_s = 10.0           # "still waiting for a slot" at most this often
lease_peer_probe_s_min = 0.05        # re-probe a peer that answered but had not seen our version yet
lease_peer_probe_s_max = 1.0         # back-off cap for a peer that does not answer
lease_lost_grace_divisor = 3         # after a loss keep answering 503 for safety_margin/3 before exiting ...
lease_lost_grace_ms_max = 1000       # ... but at most this: the exit must come well before the expiry
lease_wind_down_step_s = 2.0         # stopping one applier after a loss; the exit must not wait on it
lease_handover_s = 10.0              # an orderly stop waits at most this for a peer to hold this node's rows
lease_handover_poll_s = 0.02         # ... looking at the peers' acknowledgements this often
lease_file_lock_wait_s_max = 5.0     # a lock held longer than this means a wedged writer: report, don't hang
lease_file_lock_poll_s = 0.002       # first poll of a busy lock; doubles up to the cap below
lease_file_lock_poll_s_max = 0.05    # keeps the worst extra wait after release small
lease_s3_timeout_s_default = 5.0     # connect and read timeout of one S3 request
lease_s3_attempts_max = 2            # one retry inside botocore; the runner retries again until the deadline

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

# --- health and metrics (node/http/health.py, node/http/metrics.py) -------------------
loop_watch_interval_s = 0.25         # the event-loop watch wakes this often: a stall shows in /livez and
                                     # replog_event_loop_lag_seconds within a quarter second of its end
loop_watch_window_s = 10.0           # /livez judges the loop by its worst lateness over this window, so a
                                     # probe every 10 s (Kubernetes' default) sees a stall between probes
status_request_timeout_s = 3.0       # `replog status`: one request to one member; slower is unreachable

# --- the derivations, checked -------------------------------------------------------
assert value_bytes_max + key_bytes_max + 64 <= txn_bytes_max, "a one-row txn of the largest value fits"
assert snapshot_chunk_bytes_max + record_bytes_max + message_margin_bytes <= message_bytes_max, \
    "a snapshot chunk (one record past its byte bound at most) fits in one message"
assert relay_batch_bytes_max + message_margin_bytes <= message_bytes_max
assert txn_bytes_max <= relay_frame_alone_bytes_max, "a frame split into single txns always travels"
assert relay_frame_alone_bytes_max + 64 <= message_bytes_max, "a frame that goes alone fits in its ROWS message"
assert members_max * cluster_row_bytes_max + message_margin_bytes <= segment_header_bytes_max, \
    "a segment header holds the whole _cluster"
assert members_max * cluster_row_bytes_max + message_margin_bytes <= message_bytes_max, \
    "a greeting and a snapshot carry the whole _cluster"
assert txn_bytes_max * 2 <= frame_bytes_max
assert 5 + value_sure_items_max * (5 + 4 * value_sure_key_chars_max + 5 + 4 * value_sure_str_chars_max) \
    <= value_bytes_max, "a value decoded_flat_ok takes without walking it is within value_bytes_max"
assert lsn_max + txn_ops_max < (1 << 63) and timestamp_us_max + (1 << 40) < (1 << 63)
assert hlc_offset_max_s * 1e6 < timestamp_us_max
assert link_close_timeout_s < peers_stop_wait_s < client_request_timeout_s, \
    "removing a peer answers after its link closed, and before a client gives up"
