// SPDX-License-Identifier: GPL-2.0-or-later
/* The allocation tracker's block index (data/heap/block_index.py drives it
 * through ctypes): [start, end) -> block id, kept sorted by start and
 * updated in place at every allocation event.
 *
 * A sorted list of sorted chunks (at most CHUNK entries each) with the first
 * start of every chunk in an array beside it: an insert or a removal costs a
 * binary search and a move inside one chunk; a chunk that fills up splits
 * (moving the chunk pointers, N/CHUNK of them, once every CHUNK/2 inserts).
 * A lookup is two binary searches.  Nothing is rebuilt per event, so the cost
 * of an allocation, a free or the naming of an access does not grow with the
 * number of blocks.
 *
 * Lookup semantics (those of the tracker): the entry with the greatest start
 * at or below the address, when its end is above the address. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK 256

typedef struct { uint64_t start, end; uint32_t id; uint32_t pad; } entry_t;
typedef struct { size_t n; entry_t e[CHUNK]; } chunk_t;
/* A direct-mapped cache of lookups that found an entry: slot (address >> 4)
 * hashed; it answers id for [lo, hi) while gen is the index's (every insert
 * and removal makes a new generation, so nothing stale is ever answered). */
#define CACHE_SLOTS 8192
typedef struct { uint64_t lo, hi; uint32_t gen, id; } cache_t;

typedef struct {
    chunk_t **chunks;
    uint64_t *mins;          /* mins[c] = chunks[c]->e[0].start */
    size_t nchunks, cap, count;
    uint32_t gen;            /* changes with every insert and removal (never 0) */
    cache_t *cache;          /* CACHE_SLOTS, made at the first lookup */
} bi_t;

size_t bi_entry_size(void) { return sizeof(entry_t); }

bi_t *bi_new(void) {
    bi_t *bi = calloc(1, sizeof(bi_t));
    if (bi) bi->gen = 1;
    return bi;
}

/* a new generation: the cache's answers are void (a wrap-around to 0 clears it) */
static void changed(bi_t *bi) {
    if (++bi->gen == 0) {
        if (bi->cache) memset(bi->cache, 0, CACHE_SLOTS * sizeof(cache_t));
        bi->gen = 1;
    }
}

void bi_free(bi_t *bi) {
    if (!bi) return;
    for (size_t c = 0; c < bi->nchunks; c++) free(bi->chunks[c]);
    free(bi->chunks);
    free(bi->mins);
    free(bi->cache);
    free(bi);
}

size_t bi_count(const bi_t *bi) { return bi->count; }

/* the chunk whose range holds key: the last one with mins <= key, else 0 */
static size_t find_chunk(const bi_t *bi, uint64_t key) {
    size_t lo = 0, hi = bi->nchunks;      /* first chunk with min > key */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (bi->mins[mid] <= key) lo = mid + 1; else hi = mid;
    }
    return lo ? lo - 1 : 0;
}

/* first entry of the chunk with start >= key */
static size_t lower_bound(const chunk_t *ch, uint64_t key) {
    size_t lo = 0, hi = ch->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (ch->e[mid].start < key) lo = mid + 1; else hi = mid;
    }
    return lo;
}

static int grow(bi_t *bi) {
    if (bi->nchunks < bi->cap) return 0;
    size_t cap = bi->cap ? bi->cap * 2 : 16;
    chunk_t **chunks = realloc(bi->chunks, cap * sizeof *chunks);
    if (!chunks) return -1;
    bi->chunks = chunks;
    uint64_t *mins = realloc(bi->mins, cap * sizeof *mins);
    if (!mins) return -1;
    bi->mins = mins;
    bi->cap = cap;
    return 0;
}

static int insert_chunk(bi_t *bi, size_t at, chunk_t *ch) {
    if (grow(bi)) return -1;
    memmove(bi->chunks + at + 1, bi->chunks + at, (bi->nchunks - at) * sizeof *bi->chunks);
    memmove(bi->mins + at + 1, bi->mins + at, (bi->nchunks - at) * sizeof *bi->mins);
    bi->chunks[at] = ch;
    bi->mins[at] = ch->n ? ch->e[0].start : 0;
    bi->nchunks++;
    return 0;
}

static void remove_chunk(bi_t *bi, size_t at) {
    free(bi->chunks[at]);
    memmove(bi->chunks + at, bi->chunks + at + 1, (bi->nchunks - at - 1) * sizeof *bi->chunks);
    memmove(bi->mins + at, bi->mins + at + 1, (bi->nchunks - at - 1) * sizeof *bi->mins);
    bi->nchunks--;
}

/* Adds [start, end) -> id.  An entry with the same start is replaced: its id
 * goes to *old (0 when there was none).  Returns 0, or -1 out of memory. */
int bi_insert(bi_t *bi, uint64_t start, uint64_t end, uint32_t id, uint32_t *old) {
    *old = 0;
    changed(bi);
    if (bi->nchunks == 0) {
        chunk_t *ch = calloc(1, sizeof *ch);
        if (!ch || insert_chunk(bi, 0, ch)) { free(ch); return -1; }
    }
    size_t c = find_chunk(bi, start);
    chunk_t *ch = bi->chunks[c];
    size_t p = lower_bound(ch, start);
    if (p < ch->n && ch->e[p].start == start) {
        *old = ch->e[p].id;
        ch->e[p].end = end;
        ch->e[p].id = id;
        return 0;
    }
    if (ch->n == CHUNK) {                 /* split: the upper half to a new chunk */
        chunk_t *upper = calloc(1, sizeof *upper);
        if (!upper) return -1;
        upper->n = CHUNK / 2;
        memcpy(upper->e, ch->e + CHUNK / 2, (CHUNK / 2) * sizeof(entry_t));
        ch->n = CHUNK / 2;
        if (insert_chunk(bi, c + 1, upper)) { free(upper); ch->n = CHUNK; return -1; }
        if (p > CHUNK / 2 || (p == CHUNK / 2 && start >= upper->e[0].start)) {
            c++;
            ch = upper;
            p -= CHUNK / 2;
        }
    }
    memmove(ch->e + p + 1, ch->e + p, (ch->n - p) * sizeof(entry_t));
    ch->e[p].start = start;
    ch->e[p].end = end;
    ch->e[p].id = id;
    ch->e[p].pad = 0;
    ch->n++;
    bi->mins[c] = ch->e[0].start;
    bi->count++;
    return 0;
}

/* Removes the entry starting exactly at start: its id (0: none) and end. */
uint32_t bi_remove(bi_t *bi, uint64_t start, uint64_t *end) {
    if (bi->nchunks == 0) return 0;
    changed(bi);
    size_t c = find_chunk(bi, start);
    chunk_t *ch = bi->chunks[c];
    size_t p = lower_bound(ch, start);
    if (p >= ch->n || ch->e[p].start != start) return 0;
    uint32_t id = ch->e[p].id;
    if (end) *end = ch->e[p].end;
    memmove(ch->e + p, ch->e + p + 1, (ch->n - p - 1) * sizeof(entry_t));
    ch->n--;
    bi->count--;
    if (ch->n == 0) {
        if (bi->nchunks > 1) remove_chunk(bi, c);
    } else {
        bi->mins[c] = ch->e[0].start;
        /* a chunk that shrank far below half joins its neighbour */
        if (c + 1 < bi->nchunks && ch->n + bi->chunks[c + 1]->n <= CHUNK / 2) {
            chunk_t *next = bi->chunks[c + 1];
            memcpy(ch->e + ch->n, next->e, next->n * sizeof(entry_t));
            ch->n += next->n;
            remove_chunk(bi, c + 1);
        }
    }
    return id;
}

/* the chunk whose range holds key, without branches on the data: the last
 * one with mins <= key, else 0 (the lookups' version of find_chunk: a
 * shuffled pointer chase mispredicts every step of a branching search) */
static size_t find_chunk_flat(const bi_t *bi, uint64_t key) {
    const uint64_t *base = bi->mins;
    size_t len = bi->nchunks;
    while (len > 1) {
        size_t half = len / 2;
        base = base[half] <= key ? base + half : base;
        len -= half;
    }
    return (size_t)(base - bi->mins);
}

/* the last entry of ch with start <= key (ch->n > 0; e[0].start <= key) */
static const entry_t *last_at_or_below(const chunk_t *ch, uint64_t key) {
    const entry_t *base = ch->e;
    size_t len = ch->n;
    while (len > 1) {
        size_t half = len / 2;
        base = base[half].start <= key ? base + half : base;
        len -= half;
    }
    return base;
}

/* The entry holding address (the one with the greatest start at or below it,
 * when its end is above it), or NULL; *upto: the addresses from address up to
 * *upto (exclusive) get the same answer (the next entry's start, or that
 * entry's end, whichever comes first). */
static const entry_t *containing(const bi_t *bi, uint64_t address, uint64_t *upto) {
    *upto = address + 1;
    if (bi->nchunks == 0 || address < bi->mins[0]) return NULL;
    size_t c = find_chunk_flat(bi, address);
    const chunk_t *ch = bi->chunks[c];
    if (ch->n == 0 || ch->e[0].start > address) return NULL;
    const entry_t *e = last_at_or_below(ch, address);
    if (address >= e->end) return NULL;
    size_t p = (size_t)(e - ch->e);
    uint64_t next = p + 1 < ch->n ? ch->e[p + 1].start
                  : c + 1 < bi->nchunks ? bi->mins[c + 1] : UINT64_MAX;
    *upto = e->end < next ? e->end : next;
    return e;
}

/* For every address whose ids[i] is still 0: the id of the entry holding it,
 * and flags[i] = flag.  Returns how many were found.  The last entry found
 * answers again while the addresses stay within it (two fields of one heap
 * block, an array walked in order) without a search; with use_cache, else
 * the cache (a list walked again and again between allocations); else a
 * search.  Lookups with the cache must come from one thread at a time (the
 * hybrid engine's drain: data/heap/alloc.py blocks_into); the others do not
 * touch it. */
static size_t lookup(bi_t *bi, const uint64_t *addresses, size_t n, uint32_t *ids,
                     uint8_t *flags, uint8_t flag, int use_cache) {
    size_t found = 0;
    uint64_t lo = 0, hi = 0;          /* [lo, hi): addresses answered by last (none yet) */
    uint32_t last = 0, gen = bi->gen; /* an insert meanwhile voids what this call caches */
    if (use_cache && !bi->cache && bi->nchunks)
        bi->cache = calloc(CACHE_SLOTS, sizeof(cache_t));   /* NULL: no cache */
    cache_t *cache = use_cache ? bi->cache : NULL;
    for (size_t i = 0; i < n; i++) {
        if (ids[i]) continue;
        uint64_t a = addresses[i];
        if (a - lo >= hi - lo) {
            if (bi->nchunks == 0 || a < bi->mins[0]) { lo = hi = 0; continue; }
            cache_t *slot = cache ? &cache[((a >> 4) * 0x9E3779B97F4A7C15ULL) >> (64 - 13)] : NULL;
            if (slot && slot->gen == gen && a - slot->lo < slot->hi - slot->lo) {
                lo = slot->lo;
                hi = slot->hi;
                last = slot->id;
            } else {
                const entry_t *e = containing(bi, a, &hi);
                if (!e) { lo = hi = 0; continue; }
                lo = e->start;
                last = e->id;
                if (slot) *slot = (cache_t){lo, hi, gen, last};
            }
        }
        ids[i] = last;
        if (flags) flags[i] = flag;
        found++;
    }
    return found;
}

size_t bi_lookup(bi_t *bi, const uint64_t *addresses, size_t n, uint32_t *ids,
                 uint8_t *flags, uint8_t flag) {
    return lookup(bi, addresses, n, ids, flags, flag, 0);
}

size_t bi_lookup_cached(bi_t *bi, const uint64_t *addresses, size_t n, uint32_t *ids,
                        uint8_t *flags, uint8_t flag) {
    return lookup(bi, addresses, n, ids, flags, flag, 1);
}

/* The entries with lo <= start < hi, at most max of them, into out (starts,
 * ends, ids); returns how many there are in all. */
size_t bi_range(const bi_t *bi, uint64_t lo, uint64_t hi, uint64_t *starts, uint64_t *ends,
                uint32_t *ids, size_t max) {
    size_t total = 0;
    if (bi->nchunks == 0 || lo >= hi) return 0;
    for (size_t c = find_chunk(bi, lo); c < bi->nchunks; c++) {
        const chunk_t *ch = bi->chunks[c];
        if (ch->n && ch->e[0].start >= hi) break;
        for (size_t p = lower_bound(ch, lo); p < ch->n && ch->e[p].start < hi; p++) {
            if (total < max) {
                starts[total] = ch->e[p].start;
                ends[total] = ch->e[p].end;
                ids[total] = ch->e[p].id;
            }
            total++;
        }
    }
    return total;
}

/* The allocation tracker's two steps, one call each (data/heap/alloc.py): a block
 * comes (into the live index, out of the freed one at its start), or goes (out
 * of the live index, into the freed one: returns its id, 0 if there was none). */
int bi_block_added(bi_t *live, bi_t *freed, uint64_t start, uint64_t end, uint32_t id,
                   uint32_t *inner) {
    uint64_t ignored;
    if (bi_insert(live, start, end, id, inner)) return -1;
    bi_remove(freed, start, &ignored);
    return 0;
}

uint32_t bi_block_released(bi_t *live, bi_t *freed, uint64_t start, uint64_t *end) {
    uint32_t id = bi_remove(live, start, end), old;
    if (id && bi_insert(freed, start, *end, id, &old)) return 0;
    return id;
}
