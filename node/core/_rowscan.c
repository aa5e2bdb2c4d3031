/* node.core._rowscan: the applier's and the relay's hot paths over msgpack bytes.

The native twin of node.core.rowscan's reference (`ScanPy`, `relay_scan_py`); a differential
test holds them equal on generated and mutated input, refusals included.

scan_rows(message, replica_id_max, txn_ops_max, space_chars_max, key_bytes_max, lsn_max, timestamp_us_max,
          value_depth_max, value_bytes_max, txn_bytes_max)
    A ROWS message ([ROWS, {"frames": [[written_us, [txn, ...]], ...]}]) checked and indexed
    without a Python object per row, or None when it is not for this path. It is for this path
    when every part is written as replog's encoder writes it (canonical msgpack: the shortest
    header of each kind, non-negative ints unsigned, floats as float64) and every transaction is
    a plain one the exact decoder would accept (node.core.validate's rules, within the bounds
    passed in): group DEFAULT; puts, deletes and nops (these two nil-valued) into well-named spaces
    under non-empty keys; values of nil, bools, ints, finite floats, UTF-8 strings, arrays and maps
    with string keys (no duplicates), nested and sized within bounds; lsns and timestamps within
    bounds; each transaction small enough to travel alone; and each origin's transactions in the
    message follow one another without a gap. Nothing in it recurses: values are read with an
    explicit stack, so no input can exhaust the C stack. Canonical input is what makes splicing safe: the bytes of a transaction or a value
    are exactly what decoding and encoding again would give, so the WAL frames and store
    records built from them are those of the exact path, byte for byte. Anything else (space
    and `_cluster` rows, extension types, damage) returns None and takes the exact path, which
    gives its own answer or error.

relay_scan(buf, pos, sub, budget, frame_bytes_max, own_id, own_cut)
    WAL frames from buf[pos:], checksummed and filtered for a subscriber whose vclock is `sub`
    ({replica id: lsn}, the relay's ids) and whose own rows past `own_cut` stay here (own_id -1:
    none; node.core.replicaset.relay_wants), without unpacking any value: returns ([payload, ...],
    rows, pos after the last frame handled, status). A frame whose transactions are all
    wanted is sent whole; one with none is skipped; the scan stops (RS_STOP) before a frame it
    cannot decide alone (some wanted, a torn or damaged frame, an unexpected shape), and the
    caller's exact code handles that frame. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "crc.h"

#define ROWS_TYPE 30
#define GROUP_DEFAULT 0
#define GROUP_LOCAL 1
#define OP_PUT 1
#define OP_DELETE 2
#define OP_NOP 5
#define TXN_HEAD 0x95              /* a txn: [replica_id, lsn, group, timestamp, ops] (node.core.rows) */
/* A store record, node.core.record's layout: [value, origin id, lsn, hlc, deleted], canonical
   msgpack: RECORD_HEAD, the value, three shortest uints, then the flag, which is the last byte
   (node.core.apply reads it there). tests/unit/test_record.py holds these equal to record.py's. */
#define RECORD_FIELDS 5
#define RECORD_HEAD (0x90 | RECORD_FIELDS)
#define RECORD_DELETED_TRUE 0xc3
#define RECORD_DELETED_FALSE 0xc2
#define VALUE_DEPTH_CAP 128        /* the largest value_depth_max scan_rows takes (Levels on the stack) */
#define FRAME_OVERHEAD 12
static const uint8_t FRAME_MAGIC[4] = {0xd5, 0x1a, 0x7e, 0x01};
/* [ROWS, {"frames": ...}] as replog's encoder writes its head */
static const uint8_t ROWS_HEAD[] = {0x92, ROWS_TYPE, 0x81, 0xa6, 'f', 'r', 'a', 'm', 'e', 's'};

/* relay_scan status: every frame read; the budget is spent; stopped before a frame the caller's
   exact code must handle (some of its txns wanted, torn, damaged, or of an unexpected shape) */
enum { RS_END = 0, RS_BUDGET = 1, RS_STOP = 2 };

/* --- reading msgpack ----------------------------------------------------------------------
   Every reader takes (p, end), returns the position after what it read, or NULL when the bytes
   are not that thing written canonically (or run past end). */
static inline uint64_t be(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

/* A non-negative int as replog's encoder writes it: the shortest unsigned form. */
static const uint8_t *rd_uint(const uint8_t *p, const uint8_t *end, uint64_t *v) {
    if (p >= end)
        return NULL;
    uint8_t b = *p;
    if (b <= 0x7f) { *v = b; return p + 1; }
    int n;
    uint64_t min;
    switch (b) {
    case 0xcc: n = 1; min = 0x80; break;
    case 0xcd: n = 2; min = 0x100; break;
    case 0xce: n = 4; min = 0x10000; break;
    case 0xcf: n = 8; min = 0x100000000ull; break;
    default: return NULL;
    }
    if (end - p < 1 + n)
        return NULL;
    *v = be(p + 1, n);
    return *v >= min ? p + 1 + n : NULL;
}

/* Any int as the encoder writes it: non-negative ones unsigned, negative ones in the shortest
   signed form. */
static const uint8_t *rd_int(const uint8_t *p, const uint8_t *end) {
    uint64_t u;
    if (p >= end)
        return NULL;
    uint8_t b = *p;
    if (b <= 0x7f || (b >= 0xcc && b <= 0xcf))
        return rd_uint(p, end, &u);
    if (b >= 0xe0)
        return p + 1;                                   /* -32..-1 */
    int n;
    int64_t max;                                        /* the form is the shortest: below max */
    switch (b) {
    case 0xd0: n = 1; max = -33; break;
    case 0xd1: n = 2; max = -129; break;
    case 0xd2: n = 4; max = -32769; break;
    case 0xd3: n = 8; max = -2147483649ll; break;
    default: return NULL;
    }
    if (end - p < 1 + n)
        return NULL;
    u = be(p + 1, n);
    int64_t v = n == 8 ? (int64_t)u : (int64_t)(u | (~0ull << (8 * n)));   /* sign-extend */
    if (!(u >> (8 * n - 1) & 1))
        return NULL;                                    /* non-negative in a signed form */
    return v <= max ? p + 1 + n : NULL;
}

/* An array or map header written canonically (fix form up to 15, 16-bit up to 65535, then
   32-bit): fix = 0x90 / 0x80, h16 = 0xdc / 0xde (h16 + 1 is the 32-bit form). */
static const uint8_t *rd_head(const uint8_t *p, const uint8_t *end, uint64_t *n, uint8_t fix, uint8_t h16) {
    if (p >= end)
        return NULL;
    uint8_t b = *p;
    if ((b & 0xf0) == fix) { *n = b & 0x0f; return p + 1; }
    if (b == h16 && end - p >= 3) { *n = be(p + 1, 2); return *n >= 16 ? p + 3 : NULL; }
    if (b == h16 + 1 && end - p >= 5) { *n = be(p + 1, 4); return *n >= 0x10000 ? p + 5 : NULL; }
    return NULL;
}

static const uint8_t *rd_array(const uint8_t *p, const uint8_t *end, uint64_t *n) {
    return rd_head(p, end, n, 0x90, 0xdc);
}

static const uint8_t *rd_map(const uint8_t *p, const uint8_t *end, uint64_t *n) {
    return rd_head(p, end, n, 0x80, 0xde);
}

/* Strict UTF-8 (no surrogates, no overlong forms, at most U+10FFFF), as Python decodes it.
   Returns the number of code points, or -1. */
static Py_ssize_t utf8_chars(const uint8_t *s, size_t n) {
    Py_ssize_t chars = 0;
    size_t i = 0;
    while (i < n) {
        if (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & 0x8080808080808080ull)) { i += 8; chars += 8; continue; }
        }
        uint8_t c = s[i];
        if (c < 0x80) { i++; chars++; continue; }
        size_t k;
        uint8_t lo = 0x80, hi = 0xbf;                   /* bounds of the second byte */
        if (c >= 0xc2 && c <= 0xdf) k = 1;
        else if (c >= 0xe0 && c <= 0xef) {
            k = 2;
            if (c == 0xe0) lo = 0xa0;                   /* overlong */
            else if (c == 0xed) hi = 0x9f;              /* surrogates */
        } else if (c >= 0xf0 && c <= 0xf4) {
            k = 3;
            if (c == 0xf0) lo = 0x90;                   /* overlong */
            else if (c == 0xf4) hi = 0x8f;              /* above U+10FFFF */
        } else
            return -1;
        if (n - i <= k)
            return -1;                                  /* the sequence runs past the end */
        if (s[i + 1] < lo || s[i + 1] > hi)
            return -1;
        for (size_t j = 2; j <= k; j++)
            if ((s[i + j] & 0xc0) != 0x80)
                return -1;
        i += k + 1;
        chars++;
    }
    return chars;
}

/* A str written canonically with valid UTF-8; its payload in (*s, *len). */
static const uint8_t *rd_str(const uint8_t *p, const uint8_t *end, const uint8_t **s, size_t *len,
                             Py_ssize_t *chars) {
    if (p >= end)
        return NULL;
    uint8_t b = *p;
    size_t h;
    uint64_t n;
    if ((b & 0xe0) == 0xa0) { n = b & 0x1f; h = 1; }
    else if (b == 0xd9 && end - p >= 2) { n = p[1]; h = 2; if (n < 32) return NULL; }
    else if (b == 0xda && end - p >= 3) { n = be(p + 1, 2); h = 3; if (n < 0x100) return NULL; }
    else if (b == 0xdb && end - p >= 5) { n = be(p + 1, 4); h = 5; if (n < 0x10000) return NULL; }
    else return NULL;
    if ((uint64_t)(end - p - h) < n)
        return NULL;
    Py_ssize_t c = utf8_chars(p + h, n);
    if (c < 0)
        return NULL;
    *s = p + h;
    *len = n;
    if (chars)
        *chars = c;
    return p + h + n;
}

typedef struct { const uint8_t *p; size_t n; } Span;

static int span_cmp(const void *a, const void *b) {
    const Span *x = a, *y = b;
    size_t n = x->n < y->n ? x->n : y->n;
    int c = memcmp(x->p, y->p, n);
    return c ? c : (x->n > y->n) - (x->n < y->n);
}

/* No two equal keys (canonical strs: equal strings are equal bytes). 0 or -1 (or -2: no memory). */
static int keys_distinct(Span *k, uint64_t n) {
    if (n <= 8) {
        for (uint64_t i = 0; i < n; i++)
            for (uint64_t j = i + 1; j < n; j++)
                if (k[i].n == k[j].n && memcmp(k[i].p, k[j].p, k[i].n) == 0)
                    return -1;
        return 0;
    }
    qsort(k, n, sizeof(Span), span_cmp);
    for (uint64_t i = 1; i < n; i++)
        if (span_cmp(&k[i - 1], &k[i]) == 0)
            return -1;
    return 0;
}

static int no_memory;              /* set by plain() when a large map's key list could not be kept */

/* One open container of plain(): items still to read (pairs for a map), and a map's keys so far. */
typedef struct { uint64_t left, nkeys; int map; Span *keys; Span small[8]; } Level;

static void levels_free(Level *lv, int d) {
    for (int i = 0; i < d; i++)
        if (lv[i].keys != lv[i].small)
            PyMem_Free(lv[i].keys);
}

/* validate.value_size (value_error), not legacy: nil, bools, ints, finite float64s, strs, arrays and
   maps with str keys (no duplicates), at most depth_max containers deep and value_max bytes, all
   canonical. Iterative (a Level per open container), so no input can recurse. */
static const uint8_t *plain(const uint8_t *p, const uint8_t *end, int depth_max, uint64_t value_max) {
    Level lv[VALUE_DEPTH_CAP];
    int d = 0;                                      /* open containers */
    const uint8_t *start = p, *s;
    size_t len;
    uint64_t n;
    for (;;) {
        if (d > 0 && lv[d - 1].map) {               /* a map's item begins with its key */
            Level *L = &lv[d - 1];
            if ((p = rd_str(p, end, &L->keys[L->nkeys].p, &L->keys[L->nkeys].n, NULL)) == NULL)
                goto fail;
            L->nkeys++;
        }
        if (p >= end)
            goto fail;
        uint8_t b = *p;
        if (b <= 0x7f || b >= 0xe0 || (b >= 0xcc && b <= 0xcf) || (b >= 0xd0 && b <= 0xd3))
            p = rd_int(p, end);
        else if (b == 0xc0 || b == 0xc2 || b == 0xc3)
            p = p + 1;
        else if (b == 0xcb) {                       /* float64, finite (NaN and infinities: all-ones exponent) */
            if (end - p < 9 || ((be(p + 1, 8) >> 52) & 0x7ff) == 0x7ff)
                goto fail;
            p = p + 9;
        } else if ((b & 0xe0) == 0xa0 || (b >= 0xd9 && b <= 0xdb))
            p = rd_str(p, end, &s, &len, NULL);
        else if ((b & 0xf0) == 0x90 || b == 0xdc || b == 0xdd || (b & 0xf0) == 0x80 || b == 0xde || b == 0xdf) {
            int map = (b & 0xf0) == 0x80 || b == 0xde || b == 0xdf;
            p = map ? rd_map(p, end, &n) : rd_array(p, end, &n);
            if (p == NULL || d >= depth_max || n > (uint64_t)(end - p) / (map ? 2 : 1))
                goto fail;
            if (n > 0) {
                Level *L = &lv[d];
                L->left = n;
                L->nkeys = 0;
                L->map = map;
                L->keys = L->small;
                if (map && n > 8 && (L->keys = PyMem_Malloc(n * sizeof(Span))) == NULL) {
                    no_memory = 1;
                    goto fail;
                }
                d++;
                continue;                           /* read its first item */
            }
        } else
            goto fail;                              /* 0xc1, bin, float32, extension types */
        if (p == NULL)
            goto fail;
        for (;;) {                                  /* a value is complete: close what it completes */
            if (d == 0)
                return (uint64_t)(p - start) <= value_max ? p : NULL;
            Level *L = &lv[d - 1];
            if (--L->left > 0)
                break;
            if (L->map && keys_distinct(L->keys, L->nkeys) < 0) {
                levels_free(lv, d);
                return NULL;
            }
            if (L->keys != L->small)
                PyMem_Free(L->keys);
            d--;
        }
    }
fail:
    levels_free(lv, d);
    return NULL;
}

/* Skip any one msgpack value, canonical or not (WAL frames this node wrote and checksummed).
   Iterative: it only counts the values still to skip. */
static const uint8_t *skip_any(const uint8_t *p, const uint8_t *end) {
    uint64_t pending = 1;
    while (pending) {
        if (p >= end)
            return NULL;
        pending--;
        uint8_t b = *p;
        uint64_t n, items = 0;
        size_t h = 1;
        if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) { p++; continue; }
        if ((b & 0xe0) == 0xa0) { n = b & 0x1f; goto bytes; }
        if ((b & 0xf0) == 0x90) { items = b & 0x0f; goto seq; }
        if ((b & 0xf0) == 0x80) { items = 2 * (uint64_t)(b & 0x0f); goto seq; }
        switch (b) {
        case 0xcc: case 0xd0: case 0xd4: n = b == 0xd4 ? 2 : 1; goto fixed;
        case 0xcd: case 0xd1: case 0xd5: n = b == 0xd5 ? 3 : 2; goto fixed;
        case 0xce: case 0xd2: case 0xca: case 0xd6: n = b == 0xd6 ? 5 : 4; goto fixed;
        case 0xcf: case 0xd3: case 0xcb: n = 8; goto fixed;
        case 0xd7: n = 9; goto fixed;
        case 0xd8: n = 17; goto fixed;
        case 0xc4: case 0xd9: h = 2; if (end - p < 2) return NULL; n = p[1]; goto bytes;
        case 0xc5: case 0xda: h = 3; if (end - p < 3) return NULL; n = be(p + 1, 2); goto bytes;
        case 0xc6: case 0xdb: h = 5; if (end - p < 5) return NULL; n = be(p + 1, 4); goto bytes;
        case 0xc7: h = 3; if (end - p < 3) return NULL; n = p[1]; goto bytes;         /* ext 8 */
        case 0xc8: h = 4; if (end - p < 4) return NULL; n = be(p + 1, 2); goto bytes; /* ext 16 */
        case 0xc9: h = 6; if (end - p < 6) return NULL; n = be(p + 1, 4); goto bytes; /* ext 32 */
        case 0xdc: h = 3; if (end - p < 3) return NULL; items = be(p + 1, 2); goto seq;
        case 0xdd: h = 5; if (end - p < 5) return NULL; items = be(p + 1, 4); goto seq;
        case 0xde: h = 3; if (end - p < 3) return NULL; items = 2 * be(p + 1, 2); goto seq;
        case 0xdf: h = 5; if (end - p < 5) return NULL; items = 2 * be(p + 1, 4); goto seq;
        default: return NULL;          /* 0xc1 */
        }
    fixed:
        if ((uint64_t)(end - p) < 1 + n)
            return NULL;
        p += 1 + n;
        continue;
    bytes:
        if ((uint64_t)(end - p) < h + n)
            return NULL;
        p += h + n;
        continue;
    seq:
        p += h;
        if (p > end || items > (uint64_t)(end - p))
            return NULL;                /* every item takes at least a byte */
        pending += items;
    }
    return p;
}

/* validate.space_name_error: [A-Za-z_][A-Za-z0-9_]{0,max-1} (validate.SPACE_RE). */
static int space_ok(const uint8_t *s, size_t n, size_t max) {
    if (n < 1 || n > max)
        return 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t c = s[i], l = c | 0x20;
        if (!(c == '_' || (l >= 'a' && l <= 'z') || (i > 0 && c >= '0' && c <= '9')))
            return 0;
    }
    return 1;
}

/* --- writing msgpack --------------------------------------------------------------------- */
static size_t wr_uint(uint8_t *o, uint64_t v) {
    if (v <= 0x7f) { o[0] = (uint8_t)v; return 1; }
    int n;
    if (v <= 0xff) { o[0] = 0xcc; n = 1; }
    else if (v <= 0xffff) { o[0] = 0xcd; n = 2; }
    else if (v <= 0xffffffffull) { o[0] = 0xce; n = 4; }
    else { o[0] = 0xcf; n = 8; }
    for (int i = 0; i < n; i++)
        o[1 + i] = (uint8_t)(v >> (8 * (n - 1 - i)));
    return 1 + n;
}

/* --- growable arrays ------------------------------------------------------------------- */
typedef struct { int64_t *v; Py_ssize_t n, cap; } Vec;

static int vec_push(Vec *a, int64_t x) {
    if (a->n == a->cap) {
        Py_ssize_t cap = a->cap ? 2 * a->cap : 1024;
        int64_t *v = PyMem_Realloc(a->v, cap * sizeof(int64_t));
        if (v == NULL)
            return -1;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return 0;
}

/* --- the scan of one ROWS message ------------------------------------------------------- */
enum { T_RID, T_LSN, T_LAST, T_TS, T_START, T_BODY, T_END, T_OP, T_FIELDS };   /* per txn */
enum { O_KIND, O_SPACE, O_SPACE_LEN, O_KEY, O_KEY_LEN, O_VAL, O_VAL_LEN, O_FIELDS };  /* per op */

typedef struct {
    PyObject_HEAD
    PyObject *data;                /* the message (bytes): every offset points into it */
    Py_ssize_t ntxn, nop;
    Vec t[T_FIELDS];               /* T_BODY: offset after the replica id; T_OP: first op */
    Vec o[O_FIELDS];
    Vec runs;                      /* first txn of each run of one replica id, then ntxn */
} Scan;

static void scan_dealloc(Scan *s) {
    for (int i = 0; i < T_FIELDS; i++)
        PyMem_Free(s->t[i].v);
    for (int i = 0; i < O_FIELDS; i++)
        PyMem_Free(s->o[i].v);
    PyMem_Free(s->runs.v);
    Py_XDECREF(s->data);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyTypeObject ScanType;

/* The bounds scan_rows checks (node/limits.py's, passed in by node.core.rowscan). */
typedef struct {
    uint64_t rid_max, ops_max, space_max, key_max, lsn_max, ts_max, value_max, txn_max;
    int depth_max;
} Bounds;

/* 1: indexed; 0: not for this path; -1: out of memory. */
static int scan_parse(Scan *s, const uint8_t *base, size_t size, const Bounds *bd) {
    const uint8_t *p = base, *end = base + size;
    uint64_t nframes, ntx;
    if (size < sizeof(ROWS_HEAD) || memcmp(p, ROWS_HEAD, sizeof(ROWS_HEAD)) != 0)
        return 0;
    p += sizeof(ROWS_HEAD);
    if ((p = rd_array(p, end, &nframes)) == NULL)
        return 0;
    for (uint64_t f = 0; f < nframes; f++) {
        if (p >= end || *p++ != 0x92 || (p = rd_int(p, end)) == NULL || (p = rd_array(p, end, &ntx)) == NULL)
            return 0;
        for (uint64_t i = 0; i < ntx; i++) {
            uint64_t rid, lsn, ts, nops;
            const uint8_t *start = p;
            /* validate.txn_envelope_error: replica id, lsn, timestamp, rows and the last lsn in bounds;
               the group DEFAULT only (validate.txn_group_error holds: no _cluster row can follow) */
            if (p >= end || *p++ != TXN_HEAD || (p = rd_uint(p, end, &rid)) == NULL || rid > bd->rid_max)
                return 0;
            const uint8_t *body = p;
            if ((p = rd_uint(p, end, &lsn)) == NULL || lsn < 1 || lsn > bd->lsn_max)
                return 0;
            if (p >= end || *p++ != GROUP_DEFAULT)
                return 0;
            if ((p = rd_uint(p, end, &ts)) == NULL || ts > bd->ts_max)
                return 0;
            /* lsn <= lsn_max < 2^62 and nops <= ops_max: the sum cannot wrap */
            if ((p = rd_array(p, end, &nops)) == NULL || nops < 1 || nops > bd->ops_max || lsn + nops - 1 > bd->lsn_max)
                return 0;
            Py_ssize_t first_op = s->nop;
            for (uint64_t k = 0; k < nops; k++) {
                const uint8_t *sp, *key, *val;
                size_t sp_len, key_len;
                if (p >= end || *p++ != 0x94 || p >= end)
                    return 0;
                /* validate.op_error for puts, deletes and nops (other kinds: the exact path) */
                uint8_t kind = *p++;
                if (kind != OP_PUT && kind != OP_DELETE && kind != OP_NOP)
                    return 0;
                if ((p = rd_str(p, end, &sp, &sp_len, NULL)) == NULL || !space_ok(sp, sp_len, bd->space_max))
                    return 0;
                /* validate.key_error: 1..key_max bytes of UTF-8 (a nop's may be empty) */
                if ((p = rd_str(p, end, &key, &key_len, NULL)) == NULL || key_len > bd->key_max
                    || (key_len == 0 && kind != OP_NOP))
                    return 0;
                val = p;
                if (kind != OP_PUT && (p >= end || *p != 0xc0))
                    return 0;              /* op_error: deletes and nops carry nil (resolvers see a delete's nil) */
                no_memory = 0;
                if ((p = plain(p, end, bd->depth_max, bd->value_max)) == NULL)
                    return no_memory ? -1 : 0;
                if (vec_push(&s->o[O_KIND], kind) || vec_push(&s->o[O_SPACE], sp - base)
                    || vec_push(&s->o[O_SPACE_LEN], sp_len) || vec_push(&s->o[O_KEY], key - base)
                    || vec_push(&s->o[O_KEY_LEN], key_len) || vec_push(&s->o[O_VAL], val - base)
                    || vec_push(&s->o[O_VAL_LEN], p - val))
                    return -1;
                s->nop++;
            }
            if ((uint64_t)(p - start) > bd->txn_max)
                return 0;                  /* validate.txn_bytes_error: the exact path refuses it */
            Py_ssize_t n = s->ntxn;
            int64_t last = (int64_t)(lsn + nops - 1);
            if (n > 0 && s->t[T_RID].v[n - 1] == (int64_t)rid) {
                if (s->t[T_LAST].v[n - 1] + 1 != (int64_t)lsn)
                    return 0;              /* one origin's rows with a gap: the exact path */
            } else if (vec_push(&s->runs, n))
                return -1;
            if (vec_push(&s->t[T_RID], rid) || vec_push(&s->t[T_LSN], lsn) || vec_push(&s->t[T_LAST], last)
                || vec_push(&s->t[T_TS], ts) || vec_push(&s->t[T_START], start - base)
                || vec_push(&s->t[T_BODY], body - base) || vec_push(&s->t[T_END], p - base)
                || vec_push(&s->t[T_OP], first_op))
                return -1;
            s->ntxn++;
        }
    }
    if (p != end)
        return 0;
    if (vec_push(&s->runs, s->ntxn) || vec_push(&s->t[T_OP], s->nop))
        return -1;
    return 1;
}

static PyObject *scan_rows(PyObject *mod, PyObject *args) {
    PyObject *data;
    Bounds bd;
    unsigned long long rid_max, ops_max, space_max, key_max, lsn_max, ts_max, value_max, txn_max;
    int depth_max;
    if (!PyArg_ParseTuple(args, "O!KKKKKKiKK", &PyBytes_Type, &data, &rid_max, &ops_max, &space_max, &key_max,
                          &lsn_max, &ts_max, &depth_max, &value_max, &txn_max))
        return NULL;
    if (depth_max < 0 || depth_max > VALUE_DEPTH_CAP || lsn_max > (1ull << 62) || ops_max > (1ull << 32)
        || ts_max > (uint64_t)INT64_MAX) {
        PyErr_SetString(PyExc_ValueError, "scan_rows: a bound is beyond what the scanner can hold");
        return NULL;
    }
    bd = (Bounds){rid_max, ops_max, space_max, key_max, lsn_max, ts_max, value_max, txn_max, depth_max};
    Scan *s = PyObject_New(Scan, &ScanType);
    if (s == NULL)
        return NULL;
    s->data = Py_NewRef(data);
    s->ntxn = s->nop = 0;
    memset(s->t, 0, sizeof(s->t));
    memset(s->o, 0, sizeof(s->o));
    memset(&s->runs, 0, sizeof(s->runs));
    int r = scan_parse(s, (const uint8_t *)PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data), &bd);
    if (r == 1)
        return (PyObject *)s;
    Py_DECREF(s);
    if (r < 0)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static const uint8_t *scan_base(Scan *s) { return (const uint8_t *)PyBytes_AS_STRING(s->data); }

static int txn_index(Scan *s, PyObject *arg, Py_ssize_t *i) {
    *i = PyLong_AsSsize_t(arg);
    if (*i == -1 && PyErr_Occurred())
        return -1;
    if (*i < 0 || *i >= s->ntxn) {
        PyErr_SetString(PyExc_IndexError, "transaction index out of range");
        return -1;
    }
    return 0;
}

/* runs() -> [(replica_id, first txn, end txn), ...] */
static PyObject *scan_runs(Scan *s, PyObject *unused) {
    Py_ssize_t nr = s->runs.n - 1;
    PyObject *out = PyList_New(nr);
    for (Py_ssize_t r = 0; out && r < nr; r++) {
        int64_t a = s->runs.v[r], b = s->runs.v[r + 1];
        PyObject *t = Py_BuildValue("(LLL)", (long long)s->t[T_RID].v[a], (long long)a, (long long)b);
        if (t == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, r, t);
    }
    return out;
}

/* lasts() -> bytes of int64 (native order): each txn's last lsn, for bisect over a memoryview. */
static PyObject *scan_lasts(Scan *s, PyObject *unused) {
    return PyBytes_FromStringAndSize((const char *)s->t[T_LAST].v, s->ntxn * (Py_ssize_t)sizeof(int64_t));
}

static PyObject *scan_lsn(Scan *s, PyObject *arg) {
    Py_ssize_t i;
    if (txn_index(s, arg, &i))
        return NULL;
    return PyLong_FromLongLong(s->t[T_LSN].v[i]);
}

static PyObject *scan_txn_bytes(Scan *s, PyObject *arg) {
    Py_ssize_t i;
    if (txn_index(s, arg, &i))
        return NULL;
    return PyBytes_FromStringAndSize((const char *)scan_base(s) + s->t[T_START].v[i],
                                     s->t[T_END].v[i] - s->t[T_START].v[i]);
}

static int range_args(Scan *s, PyObject *args, Py_ssize_t *a, Py_ssize_t *b) {
    if (!PyArg_ParseTuple(args, "nn", a, b))
        return -1;
    if (*a < 0 || *a >= *b || *b > s->ntxn) {
        PyErr_SetString(PyExc_IndexError, "transaction range out of bounds");
        return -1;
    }
    return 0;
}

/* ts_max(a, b) -> the largest timestamp of txns [a, b) */
static PyObject *scan_ts_max(Scan *s, PyObject *args) {
    Py_ssize_t a, b;
    if (range_args(s, args, &a, &b))
        return NULL;
    int64_t m = 0;
    for (Py_ssize_t i = a; i < b; i++)
        if (s->t[T_TS].v[i] > m)
            m = s->t[T_TS].v[i];
    return PyLong_FromLongLong(m);
}

/* spaces() -> the spaces of the puts and deletes, in order, each change of space once: the core
   checks that they exist here before it claims anything (node.core.replicaset). */
static PyObject *scan_spaces(Scan *s, PyObject *unused) {
    const uint8_t *base = scan_base(s), *prev = NULL;
    size_t prev_len = 0;
    PyObject *out = PyList_New(0);
    for (Py_ssize_t j = 0; out && j < s->nop; j++) {
        if (s->o[O_KIND].v[j] == OP_NOP)
            continue;
        const uint8_t *sp = base + s->o[O_SPACE].v[j];
        size_t n = (size_t)s->o[O_SPACE_LEN].v[j];
        if (prev != NULL && n == prev_len && memcmp(sp, prev, n) == 0)
            continue;
        PyObject *name = PyUnicode_DecodeUTF8((const char *)sp, n, "strict");
        if (name == NULL || PyList_Append(out, name) < 0)
            Py_CLEAR(out);
        Py_XDECREF(name);
        prev = sp;
        prev_len = n;
    }
    return out;
}

/* Accepted ranges: a list of (first txn, end txn, this node's id for their origin). */
typedef struct { Py_ssize_t a, b; uint64_t rid; } Range;

static Range *ranges_from(Scan *s, PyObject *seq, Py_ssize_t *nr) {
    PyObject *fast = PySequence_Fast(seq, "ranges must be a sequence");
    if (fast == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    Range *r = PyMem_Malloc((n ? n : 1) * sizeof(Range));
    if (r == NULL) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned long long rid;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "nnK", &r[i].a, &r[i].b, &rid)) {
            PyMem_Free(r);
            Py_DECREF(fast);
            return NULL;
        }
        r[i].rid = rid;
        if (r[i].a < 0 || r[i].a >= r[i].b || r[i].b > s->ntxn) {
            PyErr_SetString(PyExc_IndexError, "transaction range out of bounds");
            PyMem_Free(r);
            Py_DECREF(fast);
            return NULL;
        }
    }
    Py_DECREF(fast);
    *nr = n;
    return r;
}

/* frame_txns(ranges) -> the txns of the ranges as msgpack, one after another (no array
   header), each with its replica id replaced by the range's. */
static PyObject *scan_frame_txns(Scan *s, PyObject *seq) {
    Py_ssize_t nr, size = 0;
    Range *r = ranges_from(s, seq, &nr);
    if (r == NULL)
        return NULL;
    Vec *start = &s->t[T_START], *body = &s->t[T_BODY], *end = &s->t[T_END];
    for (Py_ssize_t k = 0; k < nr; k++)
        size += (end->v[r[k].b - 1] - start->v[r[k].a]) + (r[k].b - r[k].a) * 9;
    PyObject *out = PyBytes_FromStringAndSize(NULL, size);
    if (out == NULL) {
        PyMem_Free(r);
        return NULL;
    }
    uint8_t *o = (uint8_t *)PyBytes_AS_STRING(out), *o0 = o, rid[9];
    const uint8_t *base = scan_base(s);
    for (Py_ssize_t k = 0; k < nr; k++) {
        size_t rn = wr_uint(rid, r[k].rid);
        for (Py_ssize_t i = r[k].a; i < r[k].b; i++) {
            *o++ = TXN_HEAD;
            memcpy(o, rid, rn);
            o += rn;
            size_t n = end->v[i] - body->v[i];
            memcpy(o, base + body->v[i], n);
            o += n;
        }
    }
    PyMem_Free(r);
    if (_PyBytes_Resize(&out, o - o0) < 0)
        return NULL;
    return out;
}

/* records(ranges) -> [(space, [(key, record), ...]), ...]: the store records of the ranges'
   puts and deletes in order, grouped by runs of one space. A record is node.core.record's
   [value, origin id, lsn, hlc = the txn's timestamp, deleted] (a delete's value is nil). */
static PyObject *scan_records(Scan *s, PyObject *seq) {
    Py_ssize_t nr;
    Range *r = ranges_from(s, seq, &nr);
    if (r == NULL)
        return NULL;
    const uint8_t *base = scan_base(s);
    PyObject *out = PyList_New(0), *items = NULL;
    const uint8_t *sp_prev = NULL;
    size_t sp_prev_len = 0;
    uint8_t tail[30];
    if (out == NULL)
        goto fail;
    for (Py_ssize_t k = 0; k < nr; k++) {
        for (Py_ssize_t i = r[k].a; i < r[k].b; i++) {
            int64_t lsn = s->t[T_LSN].v[i], ts = s->t[T_TS].v[i];
            for (int64_t j = s->t[T_OP].v[i]; j < s->t[T_OP].v[i + 1]; j++, lsn++) {
                int kind = (int)s->o[O_KIND].v[j];
                if (kind == OP_NOP)
                    continue;
                const uint8_t *sp = base + s->o[O_SPACE].v[j];
                size_t sp_len = (size_t)s->o[O_SPACE_LEN].v[j];
                if (items == NULL || sp_len != sp_prev_len || memcmp(sp, sp_prev, sp_len) != 0) {
                    PyObject *name = PyUnicode_DecodeUTF8((const char *)sp, sp_len, "strict");
                    items = PyList_New(0);
                    PyObject *pair = (name && items) ? PyTuple_Pack(2, name, items) : NULL;
                    Py_XDECREF(name);
                    Py_XDECREF(items);          /* the pair holds it */
                    if (pair == NULL || PyList_Append(out, pair) < 0) {
                        Py_XDECREF(pair);
                        goto fail;
                    }
                    Py_DECREF(pair);
                    sp_prev = sp;
                    sp_prev_len = sp_len;
                }
                const uint8_t *val = base + s->o[O_VAL].v[j];
                size_t val_len = kind == OP_DELETE ? 1 : (size_t)s->o[O_VAL_LEN].v[j];
                size_t tn = wr_uint(tail, r[k].rid);
                tn += wr_uint(tail + tn, (uint64_t)lsn);
                tn += wr_uint(tail + tn, (uint64_t)ts);
                tail[tn++] = kind == OP_DELETE ? RECORD_DELETED_TRUE : RECORD_DELETED_FALSE;
                PyObject *rec = PyBytes_FromStringAndSize(NULL, 1 + val_len + tn);
                PyObject *key = PyBytes_FromStringAndSize((const char *)base + s->o[O_KEY].v[j],
                                                          s->o[O_KEY_LEN].v[j]);
                if (rec == NULL || key == NULL) {
                    Py_XDECREF(rec);
                    Py_XDECREF(key);
                    goto fail;
                }
                uint8_t *o = (uint8_t *)PyBytes_AS_STRING(rec);
                o[0] = RECORD_HEAD;
                if (kind == OP_DELETE)
                    o[1] = 0xc0;
                else
                    memcpy(o + 1, val, val_len);
                memcpy(o + 1 + val_len, tail, tn);
                PyObject *pair = PyTuple_New(2);
                if (pair == NULL) {
                    Py_DECREF(rec);
                    Py_DECREF(key);
                    goto fail;
                }
                PyTuple_SET_ITEM(pair, 0, key);
                PyTuple_SET_ITEM(pair, 1, rec);
                int rc = PyList_Append(items, pair);
                Py_DECREF(pair);
                if (rc < 0)
                    goto fail;
            }
        }
    }
    PyMem_Free(r);
    return out;
fail:
    PyMem_Free(r);
    Py_XDECREF(out);
    return NULL;
}

static PyObject *scan_get_ntxn(Scan *s, void *c) { return PyLong_FromSsize_t(s->ntxn); }
static PyObject *scan_get_nops(Scan *s, void *c) { return PyLong_FromSsize_t(s->nop); }

static PyMethodDef scan_methods[] = {
    {"runs", (PyCFunction)scan_runs, METH_NOARGS, "[(replica_id, first txn, end txn), ...]"},
    {"lasts", (PyCFunction)scan_lasts, METH_NOARGS, "each txn's last lsn as int64 bytes"},
    {"lsn", (PyCFunction)scan_lsn, METH_O, "txn i's first lsn"},
    {"txn_bytes", (PyCFunction)scan_txn_bytes, METH_O, "txn i as it came"},
    {"ts_max", (PyCFunction)scan_ts_max, METH_VARARGS, "largest timestamp of txns [a, b)"},
    {"spaces", (PyCFunction)scan_spaces, METH_NOARGS, "spaces of the puts and deletes, each change once"},
    {"frame_txns", (PyCFunction)scan_frame_txns, METH_O, "the ranges' txns as msgpack, ids replaced"},
    {"records", (PyCFunction)scan_records, METH_O, "the ranges' store records by space"},
    {NULL}
};

static PyGetSetDef scan_getset[] = {
    {"ntxn", (getter)scan_get_ntxn, NULL, "transactions", NULL},
    {"nops", (getter)scan_get_nops, NULL, "rows", NULL},
    {NULL}
};

static PyTypeObject ScanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "node.core._rowscan.Scan",
    .tp_basicsize = sizeof(Scan),
    .tp_dealloc = (destructor)scan_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An indexed ROWS message (scan_rows).",
    .tp_methods = scan_methods,
    .tp_getset = scan_getset,
};

/* --- the relay's scan of WAL frames ------------------------------------------------------- */
/* A subscriber's vclock as sorted (id, lsn) pairs: a few entries, looked up per transaction. */
typedef struct { int64_t *id, *lsn; Py_ssize_t n; Py_ssize_t last; } SubVec;

static int id_cmp(const void *a, const void *b) {
    int64_t x = ((const int64_t *)a)[0], y = ((const int64_t *)b)[0];
    return (x > y) - (x < y);
}

/* sub: {replica id: lsn}. Ids and lsns beyond int64 cannot match a WAL row: an id is left
   out, an lsn is taken as the largest (the subscriber has everything). */
static int sub_from(PyObject *d, SubVec *sv) {
    PyObject *k, *v;
    Py_ssize_t pos = 0, n = 0;
    int64_t *pairs = PyMem_Malloc((PyDict_GET_SIZE(d) ? PyDict_GET_SIZE(d) : 1) * 2 * sizeof(int64_t));
    if (pairs == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    while (PyDict_Next(d, &pos, &k, &v)) {
        int over;
        long long id = PyLong_AsLongLongAndOverflow(k, &over);
        if (id == -1 && PyErr_Occurred())
            goto fail;
        if (over || id < 0)
            continue;
        long long lsn = PyLong_AsLongLongAndOverflow(v, &over);
        if (lsn == -1 && PyErr_Occurred())
            goto fail;
        pairs[2 * n] = id;
        pairs[2 * n + 1] = over > 0 ? INT64_MAX : over < 0 ? 0 : lsn;
        n++;
    }
    qsort(pairs, n, 2 * sizeof(int64_t), id_cmp);
    sv->id = pairs;
    sv->lsn = NULL;
    sv->n = n;
    sv->last = 0;
    return 0;
fail:
    PyMem_Free(pairs);
    return -1;
}

static int64_t sub_get(SubVec *sv, uint64_t rid) {
    int64_t *p = sv->id;
    if (sv->n && (uint64_t)p[2 * sv->last] == rid)
        return p[2 * sv->last + 1];
    Py_ssize_t lo = 0, hi = sv->n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if ((uint64_t)p[2 * mid] < rid)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < sv->n && (uint64_t)p[2 * lo] == rid) {
        sv->last = lo;
        return p[2 * lo + 1];
    }
    return 0;
}

/* Decide one frame payload: 1 all wanted, 0 none, 2 some, -1 not the expected shape. */
static int frame_wanted(const uint8_t *p, const uint8_t *end, SubVec *sub, int64_t own_id, int64_t own_cut,
                        int64_t *rows) {
    uint64_t ntx, rid, lsn, group, nops;
    int some = 0, all = 1;
    *rows = 0;
    if (p >= end || *p++ != 0x92 || (p = skip_any(p, end)) == NULL)
        return -1;
    if ((p = rd_array(p, end, &ntx)) == NULL)          /* canonical as this node writes it */
        return -1;
    for (uint64_t i = 0; i < ntx; i++) {
        if (p >= end || *p++ != TXN_HEAD || (p = rd_uint(p, end, &rid)) == NULL
            || (p = rd_uint(p, end, &lsn)) == NULL || (p = rd_uint(p, end, &group)) == NULL
            || (p = skip_any(p, end)) == NULL || (p = rd_array(p, end, &nops)) == NULL)
            return -1;
        for (uint64_t k = 0; k < nops && p; k++)
            p = skip_any(p, end);
        if (p == NULL || nops == 0 || lsn > INT64_MAX || nops > (uint64_t)INT64_MAX - lsn)
            return -1;
        int64_t have = sub_get(sub, rid);
        int wanted = group != GROUP_LOCAL && (int64_t)(lsn + nops - 1) > have
                     && !((int64_t)rid == own_id && (int64_t)lsn > own_cut);   /* relay_wants' own cut */
        if (wanted) {
            some = 1;
            *rows += (int64_t)nops;
        } else
            all = 0;
    }
    if (p != end)
        return -1;
    return !some ? 0 : all ? 1 : 2;
}

static PyObject *relay_scan(PyObject *mod, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t pos, budget;
    unsigned long long frame_max;
    long long own_id, own_cut;
    PyObject *subd;
    if (!PyArg_ParseTuple(args, "y*nO!nKLL", &buf, &pos, &PyDict_Type, &subd, &budget, &frame_max, &own_id,
                          &own_cut))
        return NULL;
    SubVec sub = {NULL, NULL, 0, 0};
    PyObject *out = NULL, *payloads = NULL;
    if (pos < 0 || pos > buf.len) {
        PyErr_SetString(PyExc_IndexError, "pos out of range");
        goto done;
    }
    if (sub_from(subd, &sub) < 0 || (payloads = PyList_New(0)) == NULL)
        goto done;
    const uint8_t *b = buf.buf, *end = b + buf.len;
    int64_t rows = 0;
    int status = RS_END;
    while (pos < buf.len) {
        const uint8_t *f = b + pos;
        if (end - f < FRAME_OVERHEAD || memcmp(f, FRAME_MAGIC, 4) != 0) { status = RS_STOP; break; }
        uint32_t len = (uint32_t)f[4] | (uint32_t)f[5] << 8 | (uint32_t)f[6] << 16 | (uint32_t)f[7] << 24;
        uint32_t crc = (uint32_t)f[8] | (uint32_t)f[9] << 8 | (uint32_t)f[10] << 16 | (uint32_t)f[11] << 24;
        if (len > frame_max || (size_t)(end - f - FRAME_OVERHEAD) < len) { status = RS_STOP; break; }
        const uint8_t *body = f + FRAME_OVERHEAD;
        if (crc32c(body, len) != crc) { status = RS_STOP; break; }
        int64_t frows;
        int w = frame_wanted(body, body + len, &sub, own_id, own_cut, &frows);
        if (w < 0 || w == 2) { status = RS_STOP; break; }
        if (w == 1) {
            PyObject *p = PyBytes_FromStringAndSize((const char *)body, len);
            if (p == NULL || PyList_Append(payloads, p) < 0) {
                Py_XDECREF(p);
                goto done;
            }
            Py_DECREF(p);
            rows += frows;
            budget -= len;
        }
        pos += FRAME_OVERHEAD + len;
        if (w == 1 && budget <= 0) { status = RS_BUDGET; break; }
    }
    out = Py_BuildValue("(OLni)", payloads, (long long)rows, pos, status);
done:
    Py_XDECREF(payloads);
    PyMem_Free(sub.id);
    PyBuffer_Release(&buf);
    return out;
}

static PyObject *py_crc32c(PyObject *mod, PyObject *arg) {
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0)
        return NULL;
    uint32_t c = crc32c(b.buf, b.len);
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLong(c);
}

static PyMethodDef methods[] = {
    {"scan_rows", scan_rows, METH_VARARGS, "index a ROWS message for the applier, or None"},
    {"relay_scan", relay_scan, METH_VARARGS, "checksummed, filtered WAL frames for a relay"},
    {"crc32c", py_crc32c, METH_O, "crc32c of a buffer (for tests)"},
    {NULL}
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "node.core._rowscan", NULL, -1, methods};

PyMODINIT_FUNC PyInit__rowscan(void) {
    crc_module_init();
    if (PyType_Ready(&ScanType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "RS_END", RS_END) || PyModule_AddIntConstant(m, "RS_BUDGET", RS_BUDGET)
        || PyModule_AddIntConstant(m, "RS_STOP", RS_STOP) || PyModule_AddIntConstant(m, "VALUE_DEPTH_CAP", VALUE_DEPTH_CAP)
        || PyModule_AddIntConstant(m, "TXN_HEAD", TXN_HEAD)
        || PyModule_AddIntConstant(m, "RECORD_FIELDS", RECORD_FIELDS)
        || PyModule_AddIntConstant(m, "RECORD_HEAD", RECORD_HEAD)
        || PyModule_AddIntConstant(m, "RECORD_DELETED_TRUE", RECORD_DELETED_TRUE)
        || PyModule_AddIntConstant(m, "RECORD_DELETED_FALSE", RECORD_DELETED_FALSE)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
