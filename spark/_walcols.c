/* spark._walcols: one split of a replog WAL segment decoded straight into column buffers.

The native twin of spark.walcols.read_split_columns_py (the reference; a differential test
holds them equal, errors included). For the byte range [start, end) of whole frames
(FRAME_MAGIC(4) | length u32 LE | crc32c u32 LE | msgpack [written_us, [txn, ...]], with
txn = [replica_id, lsn, group, timestamp, [[kind, space, key, value], ...]]) it checks every
frame's crc32c, parses the msgpack without building Python objects, and fills columns:

  per transaction: frame offset, written_us, replica_id, lsn, group, timestamp, index in its
                   frame of its first row, rows;
  per row:         kind, space and key (Arrow string layout: int32 offsets + UTF-8 data),
                   content_hash = ((crc32c(b) >> 1) << 32) | crc32(b) over the op's msgpack
                   bytes as stored (what replog's own Packer wrote: equal to pack(op));
  for CLUSTER transactions: (transaction index, byte start, byte end) of the transaction, so
                   Python moves the node's `_cluster` table in order (they are rare).

Rules kept here:
- no Python object per row; both CRCs are computed here, no zlib: crc32 (zlib's) table-driven
  (slicing by 8), crc32c with the CPU's CRC32 instruction where it has one (x86-64 SSE4.2,
  checked at import; ~20% of the decode was the tables), else its table;
- the same checks as the reference, in the same order: a frame's header and checksum, then
  the whole payload's msgpack (structure, UTF-8 of every str), its shape, then transaction by
  transaction. The first failure stops the read: the columns and CLUSTER spans before it are
  returned with the message (the reference applies a frame's earlier `_cluster` rows before it
  fails on a later transaction, so the caller does the same, then raises);
- integers must fit int64 (Arrow's columns); bool is not an integer. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "crc.h"   /* node/core/crc.h, shared with node.core._rowscan */

#define FRAME_OVERHEAD 12
#define DEPTH_MAX 1024            /* nesting of one msgpack value: msgpack-python's own stack */
static const uint8_t FRAME_MAGIC[4] = {0xd5, 0x1a, 0x7e, 0x01};

static uint32_t crc32_t[8][256];   /* zlib's crc32; crc32c and its tables are in crc.h */

/* --- growable column buffers ------------------------------------------------------------ */
typedef struct { char *p; size_t len, cap; } Col;

static int col_grow(Col *c, size_t n) {
    size_t cap = c->cap ? c->cap : 4096;
    while (cap < c->len + n)
        cap *= 2;
    char *p = PyMem_Realloc(c->p, cap);
    if (p == NULL)
        return -1;
    c->p = p;
    c->cap = cap;
    return 0;
}

/* Inline, so that a fixed-width value (PUT) is one store, not a call and a memcpy. */
static inline int col_put(Col *c, const void *v, size_t n) {
    if (c->len + n > c->cap && col_grow(c, n))
        return -1;
    memcpy(c->p + c->len, v, n);
    c->len += n;
    return 0;
}

#define PUT(c, type, v) do { type v_ = (type)(v); if (col_put((c), &v_, sizeof v_)) goto nomem; } while (0)

/* --- msgpack, read without objects ---------------------------------------------------------- */
typedef struct { const uint8_t *p, *end; } Cur;

enum { OK = 0, BAD = 1, WRONG = 2 };   /* BAD: not msgpack at all; WRONG: msgpack, wrong shape */

static uint64_t be(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

static int need(Cur *c, size_t n) { return (size_t)(c->end - c->p) >= n; }

static int utf8_ok(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (n - i >= 8) {                /* ASCII, 8 bytes at a time (keys and values mostly are) */
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & 0x8080808080808080ull)) {
                i += 8;
                continue;
            }
        }
        uint8_t b = s[i];
        if (b < 0x80) { i++; continue; }
        size_t k;
        uint32_t cp, min;
        if ((b & 0xe0) == 0xc0) { k = 1; cp = b & 0x1f; min = 0x80; }
        else if ((b & 0xf0) == 0xe0) { k = 2; cp = b & 0x0f; min = 0x800; }
        else if ((b & 0xf8) == 0xf0) { k = 3; cp = b & 0x07; min = 0x10000; }
        else return 0;
        if (n - i - 1 < k) return 0;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xc0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + j] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
        i += k + 1;
    }
    return 1;
}

/* Skip one value, checking what msgpack-python's unpackb checks (str is UTF-8, timestamps).
   A loop over a stack of "values still to read" per open container, not a call per value: the
   recursive form spent most of its time entering and leaving itself (it was ~40% of the decode).
   `depth` is the nesting of the value itself; one nested deeper than DEPTH_MAX is refused. */
static int skip(Cur *c, int depth) {
    uint64_t left[DEPTH_MAX + 2];      /* left[d]: values still to read at depth d */
    int base = depth;
    /* The cursor in locals (registers), written back once: through `c` every value loaded it
       again from memory. */
    const uint8_t *p = c->p, *end = c->end;
#define NEED(k) ((size_t)(end - p) >= (size_t)(k))
    left[depth] = 1;
    for (;;) {
        while (left[depth] == 0) {
            if (depth == base) {
                c->p = p;
                return OK;
            }
            depth--;
        }
        left[depth]--;
        if (depth > DEPTH_MAX || !NEED(1)) return BAD;
        uint8_t b = *p++;
        uint64_t n = 0, items = 0;
        int str = 0;
        if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) continue;
        if (b >= 0xa0 && b <= 0xbf) { n = b & 0x1f; str = 1; goto bytes; }
        if (b >= 0x80 && b <= 0x8f) { items = 2 * (uint64_t)(b & 0x0f); goto container; }
        if (b >= 0x90 && b <= 0x9f) { items = b & 0x0f; goto container; }
        switch (b) {
        case 0xc4: case 0xd9: if (!NEED(1)) return BAD; n = be(p, 1); p += 1; str = b == 0xd9; goto bytes;
        case 0xc5: case 0xda: if (!NEED(2)) return BAD; n = be(p, 2); p += 2; str = b == 0xda; goto bytes;
        case 0xc6: case 0xdb: if (!NEED(4)) return BAD; n = be(p, 4); p += 4; str = b == 0xdb; goto bytes;
        case 0xca: n = 4; goto bytes;
        case 0xcb: n = 8; goto bytes;
        case 0xcc: case 0xd0: n = 1; goto bytes;
        case 0xcd: case 0xd1: n = 2; goto bytes;
        case 0xce: case 0xd2: n = 4; goto bytes;
        case 0xcf: case 0xd3: n = 8; goto bytes;
        case 0xd4: n = 1; goto ext;
        case 0xd5: n = 2; goto ext;
        case 0xd6: n = 4; goto ext;
        case 0xd7: n = 8; goto ext;
        case 0xd8: n = 16; goto ext;
        case 0xc7: if (!NEED(1)) return BAD; n = be(p, 1); p += 1; goto ext;
        case 0xc8: if (!NEED(2)) return BAD; n = be(p, 2); p += 2; goto ext;
        case 0xc9: if (!NEED(4)) return BAD; n = be(p, 4); p += 4; goto ext;
        case 0xdc: if (!NEED(2)) return BAD; items = be(p, 2); p += 2; goto container;
        case 0xdd: if (!NEED(4)) return BAD; items = be(p, 4); p += 4; goto container;
        case 0xde: if (!NEED(2)) return BAD; items = 2 * be(p, 2); p += 2; goto container;
        case 0xdf: if (!NEED(4)) return BAD; items = 2 * be(p, 4); p += 4; goto container;
        default: return BAD;               /* 0xc1: never used */
        }
    ext:
        if (!NEED(1 + n)) return BAD;
        if ((int8_t)p[0] == -1 && n != 4 && n != 8 && n != 12) return BAD;   /* a timestamp */
        p += 1 + n;
        continue;
    bytes:
        if (!NEED(n)) return BAD;
        if (str && !utf8_ok(p, n)) return BAD;
        p += n;
        continue;
    container:
        if (items) {                       /* its values, one level deeper */
            depth++;
            left[depth] = items;
        }
    }
#undef NEED
}

/* The typed readers: WRONG if the next value is another type (nothing consumed then). */
static int read_int(Cur *c, int64_t *v) {
    if (!need(c, 1)) return BAD;
    uint8_t b = c->p[0];
    int n;
    if (b <= 0x7f) { *v = b; c->p++; return OK; }
    if (b >= 0xe0) { *v = (int8_t)b; c->p++; return OK; }
    switch (b) {
    case 0xcc: case 0xd0: n = 1; break;
    case 0xcd: case 0xd1: n = 2; break;
    case 0xce: case 0xd2: n = 4; break;
    case 0xcf: case 0xd3: n = 8; break;
    default: return WRONG;
    }
    if (!need(c, 1 + n)) return BAD;
    uint64_t u = be(c->p + 1, n);
    if (b >= 0xd0) {                               /* signed: sign-extend */
        if (n < 8 && (u >> (8 * n - 1)) & 1) u |= ~0ull << (8 * n);
        *v = (int64_t)u;
    } else {
        if (u > INT64_MAX) return WRONG;           /* does not fit a column */
        *v = (int64_t)u;
    }
    c->p += 1 + n;
    return OK;
}

static int read_array(Cur *c, uint64_t *items) {
    if (!need(c, 1)) return BAD;
    uint8_t b = c->p[0];
    if (b >= 0x90 && b <= 0x9f) { *items = b & 0x0f; c->p++; return OK; }
    if (b == 0xdc || b == 0xdd) {
        int n = b == 0xdc ? 2 : 4;
        if (!need(c, 1 + n)) return BAD;
        *items = be(c->p + 1, n);
        c->p += 1 + n;
        return OK;
    }
    return WRONG;
}

static int read_str(Cur *c, const uint8_t **s, uint64_t *len) {
    if (!need(c, 1)) return BAD;
    uint8_t b = c->p[0];
    int n;
    if (b >= 0xa0 && b <= 0xbf) { n = 0; *len = b & 0x1f; }
    else if (b == 0xd9) n = 1;
    else if (b == 0xda) n = 2;
    else if (b == 0xdb) n = 4;
    else return WRONG;
    if (!need(c, 1 + n)) return BAD;
    if (n) *len = be(c->p + 1, n);
    if (!need(c, 1 + n + *len)) return BAD;
    *s = c->p + 1 + n;
    c->p += 1 + n + *len;
    return OK;
}

/* --- the split ------------------------------------------------------------------------------ */
enum { T_OFFSET, T_WRITTEN_US, T_RID, T_LSN, T_GROUP, T_TS, T_FIRST, T_ROWS,
       R_KIND, R_SPACE_OFF, R_SPACE, R_KEY_OFF, R_KEY, R_HASH, CLUSTER, NCOLS };

typedef struct {
    Col col[NCOLS];
    uint64_t kinds, groups;        /* bit k set: k is a valid op kind / group */
    int64_t group_cluster;
    int64_t ntxn;
    const uint8_t *base;           /* the buffer: CLUSTER spans are offsets into it */
} Split;

/* One transaction at c (payload shape checked already): WRONG leaves the columns as they were
   before it (the reference appends a transaction only once it passed every check). */
static int read_txn(Split *s, Cur *c, int64_t offset, int64_t written_us, int64_t *index) {
    Col *col = s->col;
    const uint8_t *txn_start = c->p;
    size_t undo[NCOLS];
    for (int k = 0; k < NCOLS; k++) undo[k] = col[k].len;
    uint64_t n;
    int64_t rid, lsn, group, ts;
    int r;
    if ((r = read_array(c, &n)) != OK) return r;
    if (n != 5) return WRONG;
    if ((r = read_int(c, &rid)) != OK || (r = read_int(c, &lsn)) != OK
        || (r = read_int(c, &group)) != OK || (r = read_int(c, &ts)) != OK)
        return r;
    if ((r = read_array(c, &n)) != OK) return r;
    if (n == 0 || group < 0 || group > 63 || !((s->groups >> group) & 1)) return WRONG;
    for (uint64_t i = 0; i < n; i++) {
        const uint8_t *op = c->p, *sp, *key;
        uint64_t m, sp_len, key_len;
        int64_t kind;
        if ((r = read_array(c, &m)) != OK) goto wrong;
        if (m != 4) { r = WRONG; goto wrong; }
        if ((r = read_int(c, &kind)) != OK) goto wrong;
        if ((r = read_str(c, &sp, &sp_len)) != OK || (r = read_str(c, &key, &key_len)) != OK) goto wrong;
        if (kind < 0 || kind > 63 || !((s->kinds >> kind) & 1)) { r = WRONG; goto wrong; }
        if ((r = skip(c, 2)) != OK) goto wrong;
        size_t len = (size_t)(c->p - op);
        uint64_t h = ((uint64_t)(crc32c(op, len) >> 1) << 32) | crc_sliced(crc32_t, op, len);
        if (col[R_SPACE].len + sp_len > INT32_MAX || col[R_KEY].len + key_len > INT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "a split's space or key bytes exceed 2 GiB: use smaller splits");
            return -1;
        }
        PUT(&col[R_KIND], int8_t, kind);
        if (col_put(&col[R_SPACE], sp, sp_len) || col_put(&col[R_KEY], key, key_len)) goto nomem;
        PUT(&col[R_SPACE_OFF], int32_t, col[R_SPACE].len);
        PUT(&col[R_KEY_OFF], int32_t, col[R_KEY].len);
        PUT(&col[R_HASH], int64_t, h);
    }
    PUT(&col[T_OFFSET], int64_t, offset);
    PUT(&col[T_WRITTEN_US], int64_t, written_us);
    PUT(&col[T_RID], int64_t, rid);
    PUT(&col[T_LSN], int64_t, lsn);
    PUT(&col[T_GROUP], int8_t, group);
    PUT(&col[T_TS], int64_t, ts);
    PUT(&col[T_FIRST], int32_t, *index);
    PUT(&col[T_ROWS], int32_t, n);
    if (group == s->group_cluster) {
        PUT(&col[CLUSTER], int64_t, s->ntxn);
        PUT(&col[CLUSTER], int64_t, txn_start - s->base);
        PUT(&col[CLUSTER], int64_t, c->p - s->base);
    }
    *index += (int64_t)n;
    s->ntxn++;
    return OK;
wrong:
    for (int k = 0; k < NCOLS; k++) col[k].len = undo[k];
    return r;
nomem:
    PyErr_NoMemory();
    return -1;
}

/* The frames of [start, end): NULL with an exception (no memory), else the error message (a
   str) or None. */
static PyObject *read_frames(Split *s, const uint8_t *buf, Py_ssize_t size, Py_ssize_t start,
                             Py_ssize_t end, Py_ssize_t frame_bytes_max) {
    Py_ssize_t off = start;
    while (off < end) {
        if (size - off < FRAME_OVERHEAD)
            return PyUnicode_FromFormat("frame header truncated at byte %zd (see `replog wal verify`)", off);
        if (memcmp(buf + off, FRAME_MAGIC, 4) != 0)
            return PyUnicode_FromFormat("bad frame magic at byte %zd (see `replog wal verify`)", off);
        uint32_t length = (uint32_t)buf[off + 4] | (uint32_t)buf[off + 5] << 8 | (uint32_t)buf[off + 6] << 16
                        | (uint32_t)buf[off + 7] << 24;
        uint32_t want = (uint32_t)buf[off + 8] | (uint32_t)buf[off + 9] << 8 | (uint32_t)buf[off + 10] << 16
                      | (uint32_t)buf[off + 11] << 24;
        if ((Py_ssize_t)length > frame_bytes_max)
            return PyUnicode_FromFormat("impossible frame length %lu at byte %zd (see `replog wal verify`)",
                                        (unsigned long)length, off);
        Py_ssize_t body = off + FRAME_OVERHEAD, nxt = body + (Py_ssize_t)length;
        if (size - body < (Py_ssize_t)length)
            return PyUnicode_FromFormat("frame at byte %zd truncated (%zd of %lu bytes) (see `replog wal verify`)",
                                        off, size - body, (unsigned long)length);
        if (crc32c(buf + body, length) != want)
            return PyUnicode_FromFormat("frame checksum mismatch at byte %zd (see `replog wal verify`)", off);

        /* The whole payload is msgpack first (unpackb reads it all before any check). */
        Cur c = {buf + body, buf + nxt};
        uint64_t n;
        int64_t written_us;
        if (skip(&c, 0) != OK || c.p != c.end) goto payload;
        c.p = buf + body;
        if (read_array(&c, &n) != OK || n != 2 || read_int(&c, &written_us) != OK || read_array(&c, &n) != OK)
            goto payload;
        int64_t index = 0;
        for (uint64_t i = 0; i < n; i++) {
            int r = read_txn(s, &c, off, written_us, &index);
            if (r < 0)
                return NULL;
            if (r != OK)
                return PyUnicode_FromFormat("malformed transaction in frame at byte %zd", off);
        }
        if (index >= nxt - off) {     /* unique positions: every row owns a byte of its frame */
            PyErr_Format(PyExc_AssertionError, "rows outnumber the bytes of the frame at byte %zd", off);
            return NULL;
        }
        off = nxt;
        continue;
payload:
        return PyUnicode_FromFormat("frame payload at byte %zd is not [written_us, txns] (see `replog wal verify`)", off);
    }
    Py_RETURN_NONE;
}

static PyObject *decode_split(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t start, end, frame_bytes_max;
    unsigned long long kinds, groups;
    long long group_cluster;
    if (!PyArg_ParseTuple(args, "y*nnnKKL", &view, &start, &end, &frame_bytes_max, &kinds, &groups, &group_cluster))
        return NULL;
    PyObject *out = NULL, *err = NULL;
    Split s;
    memset(&s, 0, sizeof s);
    s.kinds = kinds;
    s.groups = groups;
    s.group_cluster = group_cluster;
    s.base = view.buf;
    if (start < 0 || start > end) {     /* end may pass the buffer's: a file cut short since planning */
        PyErr_SetString(PyExc_ValueError, "split range is not start <= end");
        goto done;
    }
    int32_t zero = 0;
    if (col_put(&s.col[R_SPACE_OFF], &zero, 4) || col_put(&s.col[R_KEY_OFF], &zero, 4)) {
        PyErr_NoMemory();
        goto done;
    }
    err = read_frames(&s, view.buf, view.len, start, end, frame_bytes_max);
    if (err == NULL)
        goto done;
    out = PyTuple_New(NCOLS + 1);
    if (out == NULL)
        goto done;
    for (int k = 0; k < NCOLS; k++) {
        PyObject *b = PyBytes_FromStringAndSize(s.col[k].p ? s.col[k].p : "", (Py_ssize_t)s.col[k].len);
        if (b == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        PyTuple_SET_ITEM(out, k, b);
    }
    PyTuple_SET_ITEM(out, NCOLS, err);
    err = NULL;
done:
    Py_XDECREF(err);
    for (int k = 0; k < NCOLS; k++)
        PyMem_Free(s.col[k].p);
    PyBuffer_Release(&view);
    return out;
}

static PyObject *py_crc(PyObject *args, const uint32_t t[8][256]) {
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "y*", &view))
        return NULL;
    uint32_t v = crc_sliced(t, view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(v);
}

static PyObject *py_crc32c(PyObject *self, PyObject *args) {
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "y*", &view))
        return NULL;
    uint32_t v = crc32c(view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(v);
}
static PyObject *py_crc32(PyObject *self, PyObject *args) { return py_crc(args, crc32_t); }
static PyObject *py_crc32c_table(PyObject *self, PyObject *args) { return py_crc(args, crc32c_t); }

static PyMethodDef methods[] = {
    {"decode_split", decode_split, METH_VARARGS,
     "decode_split(buf, start, end, frame_bytes_max, kinds_mask, groups_mask, group_cluster) -> "
     "(15 column buffers, error message or None); see spark.walcols"},
    {"crc32c", py_crc32c, METH_VARARGS, "crc32c(data) -> int (Castagnoli), as the crc32c package"},
    {"crc32", py_crc32, METH_VARARGS, "crc32(data) -> int, as zlib.crc32"},
    {"crc32c_table", py_crc32c_table, METH_VARARGS, "crc32c(data) from the tables alone (the fallback), for tests"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "spark._walcols", NULL, -1, methods};

PyMODINIT_FUNC PyInit__walcols(void) {
    crc_module_init();
    crc_tables(crc32_t, CRC32_POLY);
    return PyModule_Create(&module);
}
