// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * What the C passes over access rows share (the access pass, access_pass.c;
 * the report kinds' counters, madtrace/analysis/access_counters.c; both built
 * into libmtreplay.so): the row layout, dense ids, tallies and the allocator's
 * spans.
 */
#ifndef MADTRACE_ACCESS_PASS_H
#define MADTRACE_ACCESS_PASS_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {            /* numpy ACCESS_DTYPE (trace/format.py) */
    uint64_t seq, order, rip, addr;
    uint32_t block;
    uint16_t size;
    uint8_t kind, freed, ilen, first;
    uint8_t pad[6];
} access_t;

_Static_assert(sizeof(access_t) == 48, "ACCESS_DTYPE is 48 bytes");

enum { KIND_LOAD = 1, KIND_STORE = 2 };   /* access_t.kind (trace/format.py) */

/* ------------------------------------------------- compact records' decoding */
/* the decoder's carried state: the seq and the next order, block after block */
typedef struct {
    uint64_t seq;
    int64_t next_order;
} decode_state_t;

typedef struct {            /* a block of compact records and the instruction table */
    const uint8_t *data;    /* the records, as byte planes when ``planes`` */
    int64_t n;
    int planes;
    const uint64_t *rip;    /* by instruction id: rip, size, kind, ilen, first */
    const uint16_t *size;
    const uint8_t *kind, *ilen, *first;
    int64_t n_inst;
} compact_block_t;

/* what is done to each tile of decoded rows: 0, or an error that stops the block */
typedef int (*tile_use_t)(void *ctx, const access_t *rows, int64_t n);

/* a block's rows, a tile at a time, to ``use`` (access_pass.c says more) */
int ap_decode_tiles(const compact_block_t *b, decode_state_t *state, int64_t *bad_id,
                    tile_use_t use, void *ctx);

/* the data ids of access rows (the namer of access_pass.c) */
int ap_data_ids(void *namer, const access_t *rows, int64_t n, uint32_t *data_id);

/* ------------------------------------------------------------ dense ids */
typedef struct {
    uint64_t *keys;       /* slot -> key + 1 (0: empty) */
    uint32_t *ids;        /* slot -> dense id */
    uint64_t *order;      /* dense id -> key (the keys in the order first met) */
    int64_t cap, n, order_cap;
} dense_t;

static inline int dense_init(dense_t *d)
{
    d->cap = 1 << 12;
    d->n = 0;
    d->order_cap = 1 << 10;
    d->keys = calloc((size_t)d->cap, sizeof *d->keys);
    d->ids = malloc((size_t)d->cap * sizeof *d->ids);
    d->order = malloc((size_t)d->order_cap * sizeof *d->order);
    return d->keys && d->ids && d->order ? 0 : -1;
}

static inline void dense_free(dense_t *d)
{
    free(d->keys);
    free(d->ids);
    free(d->order);
}

static inline uint64_t mix(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    return k ^ (k >> 33);
}

static inline int dense_grow(dense_t *d)
{
    int64_t cap = d->cap * 2;
    uint64_t *keys = calloc((size_t)cap, sizeof *keys);
    uint32_t *ids = malloc((size_t)cap * sizeof *ids);
    if (!keys || !ids) {
        free(keys);
        free(ids);
        return -1;
    }
    for (int64_t s = 0; s < d->cap; s++) {
        if (!d->keys[s])
            continue;
        uint64_t h = mix(d->keys[s] - 1) & (uint64_t)(cap - 1);
        while (keys[h])
            h = (h + 1) & (uint64_t)(cap - 1);
        keys[h] = d->keys[s];
        ids[h] = d->ids[s];
    }
    free(d->keys);
    free(d->ids);
    d->keys = keys;
    d->ids = ids;
    d->cap = cap;
    return 0;
}

/* the dense id of ``key`` (a new one when first met); -1: no memory */
static inline int64_t dense_id(dense_t *d, uint64_t key)
{
    uint64_t h = mix(key) & (uint64_t)(d->cap - 1);
    while (d->keys[h]) {
        if (d->keys[h] == key + 1)
            return d->ids[h];
        h = (h + 1) & (uint64_t)(d->cap - 1);
    }
    if ((d->n + 1) * 2 > d->cap) {
        if (dense_grow(d))
            return -1;
        return dense_id(d, key);
    }
    if (d->n == d->order_cap) {
        uint64_t *o = realloc(d->order, (size_t)d->order_cap * 2 * sizeof *o);
        if (!o)
            return -1;
        d->order = o;
        d->order_cap *= 2;
    }
    d->keys[h] = key + 1;
    d->ids[h] = (uint32_t)d->n;
    d->order[d->n] = key;
    return d->n++;
}

/* ------------------------------------------------------------- tallies */
/*
 * A tally: per distinct u64 key, the sums of ``width`` int64 columns and the
 * position where the key was first met (the analyses' "group by key, sum" in
 * one hashed pass instead of numpy's sort).  access_pass.py's Tally makes
 * them (tl_new) and reads them (tl_dump); the C passes add to them.  The keys
 * met last are found through a small direct-mapped cache (a pass meets the same
 * few keys again and again: a loop's instructions, its pages): a compare
 * instead of a hash lookup.
 */
#define TALLY_CACHE 1024

typedef struct {
    dense_t keys;
    int64_t width;
    int64_t *sums;          /* width per key */
    int64_t *first;         /* the position where each key was first met */
    int64_t cap;
    uint64_t cache_key[TALLY_CACHE];
    int64_t cache_id1[TALLY_CACHE];     /* the key's id + 1 (0: empty) */
} tally_t;

static inline int64_t tally_grow(tally_t *t, int64_t id)
{
    int64_t cap = t->cap ? t->cap * 2 : 1024;
    while (cap <= id)
        cap *= 2;
    int64_t *s = realloc(t->sums, (size_t)(cap * t->width) * sizeof *s);
    if (!s)
        return -1;
    t->sums = s;
    int64_t *f = realloc(t->first, (size_t)cap * sizeof *f);
    if (!f)
        return -1;
    t->first = f;
    memset(s + t->cap * t->width, 0, (size_t)((cap - t->cap) * t->width) * sizeof *s);
    for (int64_t k = t->cap; k < cap; k++)
        f[k] = -1;
    t->cap = cap;
    return 0;
}

/* tally_row for a key not in the cache: its hashed lookup (a new row when first met) */
static int64_t *tally_row_lookup(tally_t *t, uint64_t key, int64_t pos, unsigned slot)
    __attribute__((noinline, unused));
static int64_t *tally_row_lookup(tally_t *t, uint64_t key, int64_t pos, unsigned slot)
{
    int64_t id = dense_id(&t->keys, key);
    if (id < 0 || (id >= t->cap && tally_grow(t, id)))
        return NULL;
    if (t->first[id] < 0)
        t->first[id] = pos;
    t->cache_key[slot] = key;
    t->cache_id1[slot] = id + 1;
    return t->sums + id * t->width;
}

/* the sums of ``key`` (``width`` of them), zeros first met at position ``pos``; NULL: no memory */
static inline __attribute__((always_inline)) int64_t *tally_row(tally_t *t, uint64_t key, int64_t pos)
{
    unsigned slot = (unsigned)(key ^ (key >> 10) ^ (key >> 20)) & (TALLY_CACHE - 1);
    if (t->cache_id1[slot] && t->cache_key[slot] == key)
        return t->sums + (t->cache_id1[slot] - 1) * t->width;
    return tally_row_lookup(t, key, pos, slot);
}

/* ---------------------------------------------------- allocator spans */
/* the allocator span holding ``order``: ``*span`` is one past the last span
 * beginning at or before the previous order (a cursor: orders mostly grow) */
static inline int in_span(const uint64_t *begin, const uint64_t *end, int64_t n, int64_t *span,
                          uint64_t order)
{
    if (!n)
        return 0;
    if (*span == 0 || begin[*span - 1] > order) {       /* a binary search */
        int64_t lo = 0, hi = n;
        while (lo < hi) {
            int64_t mid = (lo + hi) >> 1;
            if (begin[mid] <= order)
                lo = mid + 1;
            else
                hi = mid;
        }
        *span = lo;
    }
    while (*span < n && begin[*span] <= order)
        (*span)++;
    return *span > 0 && order <= end[*span - 1];
}

#endif
