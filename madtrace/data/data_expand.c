// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * Data records into the compact records of data/<tid>.dat (hybrid data
 * engine; the Python side is madtrace/data/records.py RingRecords, the
 * only caller; the format is madtrace/trace/compact.py's).
 *
 * A data record taken out of a ring (ring_drain.c struct mt_data_out:
 * address, seq, instruction id) becomes one 16-byte record: its address, its
 * instruction id (what it implies, written once: data/instructions.jsonl) and
 * the heap block it lies in and its freed bit (named by the allocation
 * tracker's block index beforehand: ``blocks`` and ``freed``, one each per
 * data record).  Seq
 * and order are implied: a marker gives the seq where it changes (call records
 * came in between) and the order of the first row of each batch; each record
 * stands for one row per kind it does (two for a read-modify-write), each row
 * the next order.  Records outside the traced byte ranges, of a kind not
 * recorded (--loads-only / --stores-only) or of a block not selected (--only
 * BLOCK) are dropped; every row kept is counted per (instruction id, kind).
 *
 * Built into build/native/libmtloop.so with the fault loop.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <emmintrin.h>

struct mt_data_out {
    uint64_t addr, seq;
    uint32_t id, pad;
};

/* one record of data/<tid>.dat (madtrace/trace/compact.py COMPACT_DTYPE):
 * id != 0: an access record: a = the address, b = heap block | freed << 31;
 * id == 0: a marker: b = MARK_SEQ: a = the seq of the records that follow,
 *          b = MARK_ORDER: a = the order of the next access row */
struct mt_compact {
    uint64_t a;
    uint32_t id, b;
};
enum { MARK_SEQ = 1, MARK_ORDER = 2 };

struct mt_id_table {
    const uint64_t *rip;
    const uint16_t *size;
    const uint8_t *kind, *ilen, *first, *path;
    uint64_t n;
};

struct mt_ranges {              /* sorted, disjoint [starts[i], ends[i]) */
    const uint64_t *starts, *ends;
    const uint32_t *ids;        /* block ids (NULL for the traced ranges) */
    uint64_t n;
};

enum { STAT_OUTSIDE, STAT_PROBE, STAT_FAULT, STAT_FREED, STAT_UNKNOWN_ID, STATS };

size_t mt_compact_size(void) { return sizeof(struct mt_compact); }

/* index of the range holding a, or -1 */
static int64_t find(const struct mt_ranges *r, uint64_t a) {
    uint64_t lo = 0, hi = r->n;
    while (lo < hi) {
        uint64_t mid = (lo + hi) / 2;
        if (r->starts[mid] <= a) lo = mid + 1;
        else hi = mid;
    }
    if (lo == 0) return -1;
    return a < r->ends[lo - 1] ? (int64_t)(lo - 1) : -1;
}

static int selected(const uint32_t *only, uint64_t n_only, uint32_t block) {
    for (uint64_t i = 0; i < n_only; i++)
        if (only[i] == block) return 1;
    return 0;
}

/*
 * Data records of one thread into compact records (out: room for 2 * n + 1).
 * blocks: NULL (no heap blocks), or per record its block id, and freed its
 * freed flag (0 or 1).
 * *order: the last order given (the next row gets *order + 1; updated);
 * *seq: the seq of the thread's last record written (UINT64_MAX: none yet;
 * updated).  Each access record stands for popcount(kind & kinds) rows.
 * Returns the compact records written.
 */
static uint64_t compact(const struct mt_data_out *in, uint64_t n, const struct mt_id_table *t,
                        const struct mt_ranges *traced, int kinds, uint64_t *order,
                        const uint32_t *blocks, const uint8_t *freed,
                        const uint32_t *only, uint64_t n_only, int only_on,
                        struct mt_compact *out, uint64_t *seq, uint64_t *id_counts,
                        uint64_t *stats, const uint64_t *gaps, uint64_t n_gaps,
                        uint64_t *gap_orders)
{
    uint64_t w = 0, g = 0;
    int marked = 0;
    for (uint64_t i = 0; i < n; i++) {
        /* an event between records i - 1 and i takes the next order: the records
         * after it start a new run of orders (MARK_ORDER again) */
        for (; g < n_gaps && gaps[g] <= i; g++) {
            gap_orders[g] = ++*order;
            marked = 0;
        }
        const struct mt_data_out *d = &in[i];
        uint32_t id = d->id;
        if (id == 0 || id >= t->n) {
            stats[STAT_UNKNOWN_ID]++;
            continue;
        }
        if (find(traced, d->addr) < 0) {
            stats[STAT_OUTSIDE]++;
            continue;
        }
        uint32_t block = 0, was_freed = 0;
        if (blocks) {
            block = blocks[i] & ~(1u << 31);
            was_freed = freed[i] & 1;
        }
        if (only_on && !selected(only, n_only, block))
            continue;
        uint8_t kind = t->kind[id] & kinds;
        if (!kind)
            continue;
        if (!marked) {
            out[w++] = (struct mt_compact){*order + 1, 0, MARK_ORDER};
            marked = 1;
        }
        if (d->seq != *seq) {
            out[w++] = (struct mt_compact){d->seq, 0, MARK_SEQ};
            *seq = d->seq;
        }
        out[w++] = (struct mt_compact){d->addr, id, block | was_freed << 31};
        for (int k = 1; k <= 2; k++) {
            if (!(kind & k))
                continue;
            ++*order;
            id_counts[2 * (uint64_t)id + (k - 1)]++;
            stats[t->path[id] ? STAT_FAULT : STAT_PROBE]++;
            stats[STAT_FREED] += was_freed;
        }
    }
    for (; g < n_gaps; g++)
        gap_orders[g] = ++*order;
    return w;
}

uint64_t mt_compact_data(const struct mt_data_out *in, uint64_t n, const struct mt_id_table *t,
                         const struct mt_ranges *traced, int kinds, uint64_t *order,
                         const uint32_t *blocks, const uint8_t *freed,
                         const uint32_t *only, uint64_t n_only, int only_on,
                         struct mt_compact *out, uint64_t *seq, uint64_t *id_counts,
                         uint64_t *stats)
{
    return compact(in, n, t, traced, kinds, order, blocks, freed, only, n_only, only_on, out,
                   seq, id_counts, stats, NULL, 0, NULL);
}

/*
 * The records' bytes as byte planes (trace/compact.py to_planes, the blocks
 * "MTZ2" of data/<tid>.dat): out[k * n + i] = byte k of record i.  Sixteen
 * records at a time are transposed in SSE2 registers (four rounds of
 * interleaving row i with row i + 8 make a 16x16 byte transpose) into a tile
 * on the stack, and each plane's piece of the tile is written whole: stores
 * straight to sixteen planes n bytes apart (n about a power of two: the
 * drain's batches) would all meet in one cache set.  The last records byte
 * by byte.
 */
void mt_compact_planes(const struct mt_compact *in, uint64_t n, uint8_t *out)
{
    enum { R = sizeof(struct mt_compact), TILE = 512 };
    _Alignas(16) uint8_t tile[R][TILE];
    const uint8_t *bytes = (const uint8_t *)in;
    uint64_t i = 0;
    while (i + 16 <= n) {
        uint64_t count = (n - i) / 16 * 16;
        if (count > TILE)
            count = TILE;
        for (uint64_t t = 0; t < count; t += 16) {
            __m128i x[16], z[16];
            for (int r = 0; r < 16; r++)
                x[r] = _mm_loadu_si128((const __m128i *)(bytes + (i + t + r) * R));
            for (int round = 0; round < 4; round++) {
                for (int r = 0; r < 8; r++) {
                    z[2 * r] = _mm_unpacklo_epi8(x[r], x[r + 8]);
                    z[2 * r + 1] = _mm_unpackhi_epi8(x[r], x[r + 8]);
                }
                memcpy(x, z, sizeof x);
            }
            for (int k = 0; k < R; k++)
                _mm_store_si128((__m128i *)(tile[k] + t), x[k]);
        }
        for (int k = 0; k < R; k++)
            memcpy(out + (uint64_t)k * n + i, tile[k], count);
        i += count;
    }
    for (; i < n; i++)
        for (int k = 0; k < R; k++)
            out[(uint64_t)k * n + i] = bytes[i * R + k];
}

/* A lookup of block_index.c (bi_lookup_cached, passed in by the tracer): for
 * each address whose id is still 0, the id of the interval holding it and flag */
typedef size_t (*mt_lookup_fn)(void *index, const uint64_t *addresses, size_t n, uint32_t *ids,
                               uint8_t *flags, uint8_t flag);

/* What every segment of one thread's batch shares (data_records.py SEGMENT), set
 * once a batch: the segments between the hook groups of a batch are many and
 * short (a malloc's own accesses), so each is one call with four integers. */
struct mt_segment {
    const struct mt_data_out *in;
    const uint64_t *addresses;      /* in[i].addr, contiguous */
    uint32_t *blocks;               /* per data record: its heap block, its freed flag */
    uint8_t *freed;
    const struct mt_id_table *t;
    const struct mt_ranges *traced;
    uint64_t kinds;
    uint64_t *order;
    const uint32_t *only;
    uint64_t n_only, only_on;
    struct mt_compact *out;
    uint64_t *seq, *id_counts, *stats;
    mt_lookup_fn lookup;            /* NULL: no heap block yet */
    void *live, *freed_index;       /* the allocation tracker's two indexes */
};

size_t mt_segment_size(void) { return sizeof(struct mt_segment); }

/* Data records [start, end) of the batch: their heap blocks named with the
 * indexes as they are now (live first, then freed), then compacted into
 * s->out + at (mt_compact_data).  Returns the compact records written.
 * Events among the records, which neither need nor change the heap's indexes
 * (a memcpy's block event): event g lies before record start + gaps[g] (gaps
 * sorted; end - start: after the last) and takes an order there, written into
 * gap_orders[g] (n_gaps 0: none).  One call for a span between two allocator
 * events, however many such events it holds. */
uint64_t mt_compact_segment(struct mt_segment *s, uint64_t start, uint64_t end, uint64_t at,
                            const uint64_t *gaps, uint64_t n_gaps, uint64_t *gap_orders)
{
    uint64_t n = end - start;
    const uint32_t *blocks = NULL;
    const uint8_t *freed = NULL;
    if (s->lookup) {
        memset(s->blocks + start, 0, n * sizeof *s->blocks);
        memset(s->freed + start, 0, n);
        s->lookup(s->live, s->addresses + start, n, s->blocks + start, s->freed + start, 0);
        s->lookup(s->freed_index, s->addresses + start, n, s->blocks + start, s->freed + start, 1);
        blocks = s->blocks + start;
        freed = s->freed + start;
    }
    return compact(s->in + start, n, s->t, s->traced, (int)s->kinds, s->order, blocks, freed,
                   s->only, s->n_only, (int)s->only_on, s->out + at, s->seq, s->id_counts,
                   s->stats, gaps, n_gaps, gap_orders);
}
