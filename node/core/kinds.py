"""The numbers a row carries: its transaction's group and its op kind, and the `_cluster` space's name.

They are protocol: the wire and the WAL hold them, so they never change meaning. They live below
both the data rules (node.core.validate, which says what each kind of row may hold) and the row
types and decoders (node.core.rows, which re-exports them: callers import them from there).

Groups (after Tarantool's replication groups):
- DEFAULT: replicated data and space definitions;
- LOCAL: rows of local spaces; never leave the node; counted in vclock component 0;
- CLUSTER: rows of `_cluster`; replicated and handled specially by appliers."""
from __future__ import annotations

GROUP_DEFAULT = 0
GROUP_LOCAL = 1
GROUP_CLUSTER = 2
GROUPS = (GROUP_DEFAULT, GROUP_LOCAL, GROUP_CLUSTER)
GROUP_NAMES = {GROUP_DEFAULT: "default", GROUP_LOCAL: "local", GROUP_CLUSTER: "cluster"}

OP_PUT = 1          # space, key, value
OP_DELETE = 2       # space, key
OP_SPACE = 3        # space (name), key unused, value: {"local": bool, "conflict": str}
OP_CLUSTER = 4      # space "_cluster", key: member uuid, value: {"id", "address", "state"}
OP_NOP = 5          # advances the vclock only
OPS = (OP_PUT, OP_DELETE, OP_SPACE, OP_CLUSTER, OP_NOP)
OP_NAMES = {OP_PUT: "put", OP_DELETE: "delete", OP_SPACE: "space", OP_CLUSTER: "cluster", OP_NOP: "nop"}

CLUSTER_SPACE = "_cluster"
