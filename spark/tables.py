"""The analysis tables: names, columns and what each row means. Pure (no pyspark), so the
oracle, the Spark jobs and the tests share one definition.

Rules every table keeps:
- ids never appear: members are uuids, translated by spark.walread through each node's own
  `_cluster` history; rows of group LOCAL have the node itself as origin and count in the
  node's component 0 (`local_lsn`), never in a uuid component, never in replication tables;
- a transaction is identified by its origin uuid and first lsn (`txn_id`); it is observed once
  per node whose WAL holds it;
- positions order one node's rows; they are not comparable across nodes."""
from __future__ import annotations

from spark.walread import ROW_COLUMNS

# rows: one row observation (a row of a transaction, as one node's WAL holds it).
ROWS = ROW_COLUMNS

# vclock_history: one per transaction observation: the node's vclock (uuid -> lsn, replicated
# components) and its local component right after that transaction, starting from the vclock in
# the node's first segment header (rows it got from a snapshot).
VCLOCK_HISTORY = ("node_uuid", "position", "segment", "offset", "written_us", "origin_uuid",
                  "txn_id", "group", "vclock", "local_lsn")

# origin_history: one per (replicated transaction, node that holds it): the origin's own sequence
# (txn_lsn .. txn_last_lsn) and when each node wrote it. delay_us is written_us on the node minus
# the origin's own written_us for that transaction (delay_basis "origin_wal"), or minus the
# transaction's hybrid-clock timestamp when the origin's WAL is not among the inputs ("timestamp").
ORIGIN_HISTORY = ("origin_uuid", "txn_lsn", "txn_last_lsn", "txn_id", "timestamp", "node_uuid",
                  "position", "written_us", "origin_written_us", "delay_us", "delay_basis")

# replication_delay: per (node, origin other than the node): transactions and their delay.
REPLICATION_DELAY = ("node_uuid", "origin_uuid", "txns", "delay_us_max", "delay_us_mean")

# divergence: every observation of a (origin uuid, lsn) whose content_hash differs between
# observations; `variants` counts the distinct contents.
DIVERGENCE = ("origin_uuid", "origin_lsn", "node_uuid", "content_hash", "op", "space", "key", "variants")

# concurrent_writes: pairs of put/delete rows to one (space, key) from two origins (origin_a <
# origin_b) whose origins' vclocks at write time (from the origins' own WALs) are concurrent:
# neither origin had seen the other's row when it wrote its own.
CONCURRENT_WRITES = ("space", "key", "origin_a", "lsn_a", "timestamp_a", "origin_b", "lsn_b", "timestamp_b")

TABLES = {
    "rows": ROWS,
    "vclock_history": VCLOCK_HISTORY,
    "origin_history": ORIGIN_HISTORY,
    "replication_delay": REPLICATION_DELAY,
    "divergence": DIVERGENCE,
    "concurrent_writes": CONCURRENT_WRITES,
}

WRITE_OPS = ("put", "delete")
