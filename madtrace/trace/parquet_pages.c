// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * The pages of the store's own Parquet writer (parquet_file.py): the body of one
 * data page (Parquet's DataPage, version 1) of an OPTIONAL integer column
 * without nulls, before compression:
 *
 *   definition levels   a 4-byte length, then one RLE run of n levels of 1
 *                       (bit width 1: the RLE/bit-packing hybrid)
 *   values              PLAIN (little-endian, 4 bytes for INT32, 8 for INT64)
 *                       or DELTA_BINARY_PACKED (blocks of 128 deltas in 4
 *                       miniblocks of 32, each bit-packed at its own width)
 *
 * The Thrift headers, the compression and the file around them are the
 * caller's.  What the store writes is integer columns only, most of them
 * sorted (positions, orders, call ids) or constant over long runs (a thread
 * without calls): a delta page of a run that grows by a constant step is a
 * few bytes per 128 values, and writing it is a compare per value.
 */

#include <stdint.h>
#include <string.h>

enum { BLOCK = 128, MINIBLOCKS = 4, MINI = BLOCK / MINIBLOCKS };

/* the value kinds of pq_page */
enum {
    PLAIN_I64 = 0,      /* int64 or uint64 as INT64 */
    PLAIN_I32 = 1,      /* int32 or uint32 as INT32 */
    PLAIN_U8 = 2,       /* uint8 as INT32 */
    PLAIN_U16 = 3,      /* uint16 as INT32 */
    DELTA_I64 = 4,      /* int64 or uint64 as INT64, DELTA_BINARY_PACKED */
    DELTA_I32 = 5,      /* int32 or uint32 as INT32, DELTA_BINARY_PACKED */
    DELTA_U8 = 6,       /* uint8 as INT32, DELTA_BINARY_PACKED */
};

static uint8_t *varint(uint8_t *o, uint64_t v)
{
    while (v >= 0x80) {
        *o++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *o++ = (uint8_t)v;
    return o;
}

static uint64_t zigzag(int64_t v)
{
    return ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
}

/* the definition levels of n values, none null */
static uint8_t *levels(uint8_t *o, int64_t n)
{
    uint8_t *start = o + 4;
    uint8_t *e = varint(start, (uint64_t)n << 1);      /* an RLE run of n ... */
    *e++ = 1;                                          /* ... levels of 1 */
    uint32_t size = (uint32_t)(e - start);
    memcpy(o, &size, 4);
    return e;
}

static int width_of(uint64_t v)
{
    return v ? 64 - __builtin_clzll(v) : 0;
}

/* 32 values of ``w`` bits each, the first in the lowest bits: 4w bytes */
static uint8_t *pack32(uint8_t *o, const uint64_t *r, int w)
{
    if (w == 0)
        return o;
    if (w <= 32) {          /* the usual widths: a 64-bit accumulator, 32 bits out at a time */
        uint64_t acc = 0;
        int bits = 0;
        for (int i = 0; i < MINI; i++) {
            acc |= r[i] << bits;
            bits += w;
            if (bits >= 32) {
                uint32_t word = (uint32_t)acc;
                memcpy(o, &word, 4);
                o += 4;
                acc >>= 32;
                bits -= 32;
            }
        }
        return o;           /* 32w bits: nothing is left over */
    }
    unsigned __int128 acc = 0;
    int bits = 0;
    for (int i = 0; i < MINI; i++) {
        acc |= (unsigned __int128)r[i] << bits;
        bits += w;
        if (bits >= 64) {
            uint64_t word = (uint64_t)acc;
            memcpy(o, &word, 8);
            o += 8;
            acc >>= 64;
            bits -= 64;
        }
    }
    if (bits) {             /* 32w bits in all: 32 bits are left, or none */
        uint32_t word = (uint32_t)acc;
        memcpy(o, &word, 4);
        o += 4;
    }
    return o;
}

/*
 * DELTA_BINARY_PACKED of n values (n >= 1) of type V, their deltas computed as
 * U and read as T (the column's width, unsigned and signed: an INT32 column's
 * deltas wrap at 32 bits, as its readers compute them).  A block whose deltas are all one step (a sorted
 * run of a position or an order, a constant column) is found first by a loop
 * the compiler vectorizes, and written as its step and four widths of 0.
 */
#define DELTA(name, V, T, U)                                                          \
__attribute__((optimize("tree-vectorize")))                                           \
static uint8_t *name(uint8_t *o, const V *v, int64_t n)                               \
{                                                                                     \
    o = varint(o, BLOCK);                                                             \
    o = varint(o, MINIBLOCKS);                                                        \
    o = varint(o, (uint64_t)n);                                                       \
    o = varint(o, zigzag((T)v[0]));                                                   \
    uint64_t r[BLOCK];                                                                \
    for (int64_t first = 1; first < n; first += BLOCK) {                              \
        int64_t m = n - first < BLOCK ? n - first : BLOCK;                            \
        const V *x = v + first;                                                       \
        U step = (U)((U)x[0] - (U)x[-1]);                                             \
        U other = 0;        /* any bit of any delta that is not the step */           \
        for (int64_t i = 1; i < m; i++)                                               \
            other |= (U)((U)x[i] - (U)x[i - 1]) ^ step;                               \
        if (!other) {                                                                 \
            o = varint(o, zigzag((T)step));                                           \
            memset(o, 0, MINIBLOCKS);                                                 \
            o += MINIBLOCKS;                                                          \
            continue;                                                                 \
        }                                                                             \
        T lo = (T)step;                                                               \
        for (int64_t i = 1; i < m; i++) {                                             \
            T d = (T)(U)((U)x[i] - (U)x[i - 1]);                                      \
            lo = d < lo ? d : lo;                                                     \
        }                                                                             \
        o = varint(o, zigzag(lo));                                                    \
        int used = (int)((m + MINI - 1) / MINI);                                      \
        for (int64_t i = 0; i < m; i++)                                               \
            r[i] = (U)((U)((U)x[i] - (U)x[i - 1]) - (U)lo);                           \
        for (int64_t i = m; i < used * MINI; i++)                                     \
            r[i] = 0;                                                                 \
        uint8_t *widths = o;                                                          \
        o += MINIBLOCKS;                                                              \
        for (int b = 0; b < MINIBLOCKS; b++) {                                        \
            if (b >= used) {                                                          \
                widths[b] = 0;                                                        \
                continue;                                                             \
            }                                                                         \
            uint64_t any = 0;                                                         \
            for (int i = 0; i < MINI; i++)                                            \
                any |= r[b * MINI + i];                                               \
            int w = width_of(any);                                                    \
            widths[b] = (uint8_t)w;                                                   \
            o = pack32(o, r + b * MINI, w);                                           \
        }                                                                             \
    }                                                                                 \
    return o;                                                                         \
}

DELTA(delta64, int64_t, int64_t, uint64_t)
DELTA(delta32, int32_t, int32_t, uint32_t)
DELTA(delta8, uint8_t, int32_t, uint32_t)

/* n unsigned values of type T as INT32, PLAIN */
#define WIDEN(name, T)                                                                \
static uint8_t *name(uint8_t *o, const T *v, int64_t n)                               \
{                                                                                     \
    for (int64_t i = 0; i < n; i++) {                                                 \
        uint32_t x = v[i];                                                            \
        memcpy(o + 4 * i, &x, 4);                                                     \
    }                                                                                 \
    return o + 4 * n;                                                                 \
}

WIDEN(widen_u8, uint8_t)
WIDEN(widen_u16, uint16_t)

/* the most bytes pq_page writes for n values */
int64_t pq_page_bound(int64_t n)
{
    return 16 + 40 + n * 8 + (n / BLOCK + 1) * (10 + MINIBLOCKS + 4 * 64);
}

/*
 * The body of a data page of ``n`` values (n >= 1) of ``kind`` into ``out``
 * (pq_page_bound(n) bytes); ``minmax`` (or NULL): the smallest and largest
 * value, compared as signed 64-bit integers (the statistics of the signed
 * columns that queries filter on).  Returns the bytes written, -1 for an
 * unknown kind.
 */
int64_t pq_page(int kind, const void *values, int64_t n, uint8_t *out, int64_t *minmax)
{
    uint8_t *o = levels(out, n);
    switch (kind) {
    case PLAIN_I64:
        memcpy(o, values, (size_t)n * 8);
        o += n * 8;
        break;
    case PLAIN_I32:
        memcpy(o, values, (size_t)n * 4);
        o += n * 4;
        break;
    case PLAIN_U8:
        o = widen_u8(o, values, n);
        break;
    case PLAIN_U16:
        o = widen_u16(o, values, n);
        break;
    case DELTA_I64:
        o = delta64(o, values, n);
        break;
    case DELTA_I32:
        o = delta32(o, values, n);
        break;
    case DELTA_U8:
        o = delta8(o, values, n);
        break;
    default:
        return -1;
    }
    if (minmax) {
        int64_t lo = INT64_MAX, hi = INT64_MIN;
        if (kind == PLAIN_I64 || kind == DELTA_I64) {
            const int64_t *v = values;
            for (int64_t i = 0; i < n; i++) {
                lo = v[i] < lo ? v[i] : lo;
                hi = v[i] > hi ? v[i] : hi;
            }
        } else if (kind == PLAIN_I32 || kind == DELTA_I32) {
            const int32_t *v = values;
            for (int64_t i = 0; i < n; i++) {
                lo = v[i] < lo ? v[i] : lo;
                hi = v[i] > hi ? v[i] : hi;
            }
        }
        minmax[0] = lo;
        minmax[1] = hi;
    }
    return o - out;
}
