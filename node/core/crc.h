/* Reflected CRC-32 variants for replog's C extensions (node.core._rowscan, spark._walcols).

Header-only: every function is static, so each extension gets its own copy and its own tables.
Call crc_module_init() once from the module's init before any other function here.

- crc_sliced(t, p, n): any reflected CRC-32 from its tables (slicing by 8), init and final xor
  0xffffffff: with crc32c_t it is CRC-32C (Castagnoli, the WAL frames' checksum), with tables
  built for 0xedb88320 it is zlib's crc32.
- crc32c(p, n): CRC-32C with the CPU's CRC32 instruction where x86-64 has SSE 4.2 (checked at
  init), else crc_sliced(crc32c_t, ...). A test holds the two equal at every length and
  alignment. */
#ifndef REPLOG_CRC_H
#define REPLOG_CRC_H

#include <stdint.h>
#include <string.h>

#define CRC32C_POLY 0x82f63b78u
#define CRC32_POLY 0xedb88320u

static uint32_t crc32c_t[8][256];

static void crc_tables(uint32_t t[8][256], uint32_t poly) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ poly : c >> 1;
        t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int k = 1; k < 8; k++)
            t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xff];
}

static uint32_t crc_sliced(const uint32_t t[8][256], const uint8_t *p, size_t n) {
    uint32_t c = 0xffffffffu;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    while (n >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
        lo ^= c;
        c = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24]
          ^ t[3][hi & 0xff] ^ t[2][(hi >> 8) & 0xff] ^ t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
        p += 8;
        n -= 8;
    }
#endif
    while (n--)
        c = t[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    return ~c;
}

/* The Castagnoli polynomial is the one x86's CRC32 instruction computes (reflected, the same
   register convention as the tables), 8 bytes an instruction. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define REPLOG_HW_CRC32C 1
static int crc32c_hw_ok;           /* set at init: the CPU has the instruction */

__attribute__((target("sse4.2")))
static uint32_t crc32c_hw(const uint8_t *p, size_t n) {
    uint64_t c = 0xffffffffu;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = __builtin_ia32_crc32di(c, v);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--)
        c32 = __builtin_ia32_crc32qi(c32, *p++);
    return ~c32;
}
#endif

static uint32_t crc32c(const uint8_t *p, size_t n) {
#ifdef REPLOG_HW_CRC32C
    if (crc32c_hw_ok)
        return crc32c_hw(p, n);
#endif
    return crc_sliced(crc32c_t, p, n);
}

static void crc_module_init(void) {
    crc_tables(crc32c_t, CRC32C_POLY);
#ifdef REPLOG_HW_CRC32C
    __builtin_cpu_init();
    crc32c_hw_ok = __builtin_cpu_supports("sse4.2");
#endif
}

#endif
