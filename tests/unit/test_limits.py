"""Every bound lives in node/limits.py (docs/limits.md): no other module of node/ defines a number
named like a bound (a size, a count, a time, a retry, a backoff) at module level. A name derived from
limits (an alias, a quarter of one) is fine: its number is still limits'."""
import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
BOUND = re.compile(r"(_max|_min|_s|_ms|_us|_bytes|_chars|_rows|_txns|_attempts|_timeout|_backoff|_interval"
                   r"|_divisor|_default)$", re.IGNORECASE)


# Numbers named like bounds that are protocol or format facts, not bounds (they stay where they are).
NOT_BOUNDS = {
    "GROUP_DEFAULT": "a group number (node/core/kinds.py)",
    "PROTOCOL_VERSION_MIN": "a protocol version",
    "NONCE_BYTES": "a field of the link handshake", "TAG_BYTES": "the link's per-message tag",
    "register_code_bytes": "the length of a register code in the identity file and on the wire",
    "TXN_HEAD_BYTES_MAX": "the largest msgpack header of a txn: a fact of the encoding",
    "BUCKETS_S": "the latency histograms' buckets: what is measured, not a bound",
}


def _literal_number(v: ast.expr) -> bool:
    """A number written here: constants and arithmetic on them, nothing read from elsewhere."""
    return all(not isinstance(n, (ast.Name, ast.Attribute, ast.Call)) for n in ast.walk(v)) and \
        any(isinstance(n, ast.Constant) and type(n.value) in (int, float) for n in ast.walk(v))


def test_no_module_but_limits_defines_a_bound():
    found = []
    for path in sorted(ROOT.glob("node/**/*.py")):
        if path.name == "limits.py":
            continue
        for stmt in ast.parse(path.read_text()).body:
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                for t in targets:
                    if isinstance(t, ast.Name) and BOUND.search(t.id) and _literal_number(stmt.value) \
                            and t.id not in NOT_BOUNDS:
                        found.append(f"{path.relative_to(ROOT)}:{stmt.lineno} {t.id}")
    assert not found, "bounds outside node/limits.py: " + ", ".join(found)
