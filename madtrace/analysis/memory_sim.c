// SPDX-License-Identifier: GPL-2.0-or-later
// The memory analyses' inner loops (loaded with ctypes by cache_sim.py,
// sharing.py and reuse.py): a cache hierarchy simulated access by access, the
// coherence traffic of cache lines shared by threads, and exact reuse
// distances.  Each takes arrays of accesses (address, size, kind) in the order
// they happened and writes one small result per access; the Python side says
// what they are for and attributes them to data and calls.  The cache and the
// reuse distances read their columns with a stride (bytes from one element to
// the next): a column of the access rows themselves, or an array of its own.

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define EMPTY UINT64_MAX

// element i of a column of ``type`` whose elements are ``stride`` bytes apart
#define AT(type, column, stride, i) (*(const type *)((const char *)(column) + (i) * (stride)))

// --------------------------------------------------------------- line table
// An open-addressing map from a cache line number to a slot index (dense,
// in the order lines were first met), grown by doubling; each entry's key and
// slot side by side (one cache miss per lookup).
typedef struct {
    uint64_t key;      // EMPTY: a free entry
    int64_t slot;
} line_entry_t;

typedef struct {
    line_entry_t *entries;
    int64_t cap, used;
} linemap_t;

static int lm_init(linemap_t *m, int64_t cap) {
    m->cap = cap;
    m->used = 0;
    m->entries = malloc(cap * sizeof(line_entry_t));
    if (!m->entries) return -1;
    for (int64_t i = 0; i < cap; i++) m->entries[i].key = EMPTY;
    return 0;
}

static void lm_free(linemap_t *m) {
    free(m->entries);
    m->entries = NULL;
}

static inline uint64_t lm_hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return k;
}

static int lm_grow(linemap_t *m) {
    linemap_t bigger;
    if (lm_init(&bigger, m->cap * 2)) return -1;
    for (int64_t i = 0; i < m->cap; i++) {
        if (m->entries[i].key == EMPTY) continue;
        uint64_t h = lm_hash(m->entries[i].key) & (bigger.cap - 1);
        while (bigger.entries[h].key != EMPTY) h = (h + 1) & (bigger.cap - 1);
        bigger.entries[h] = m->entries[i];
    }
    bigger.used = m->used;
    lm_free(m);
    *m = bigger;
    return 0;
}

// The slot of ``line``; a new line gets slot ``m->used`` (*fresh = 1).  -1: no memory.
static inline int64_t lm_get(linemap_t *m, uint64_t line, int *fresh) {
    if (2 * (m->used + 1) > m->cap && lm_grow(m)) return -1;
    uint64_t h = lm_hash(line) & (m->cap - 1);
    while (m->entries[h].key != EMPTY) {
        if (m->entries[h].key == line) {
            *fresh = 0;
            return m->entries[h].slot;
        }
        h = (h + 1) & (m->cap - 1);
    }
    m->entries[h].key = line;
    m->entries[h].slot = m->used;
    *fresh = 1;
    return m->used++;
}

// ===================================================================== caches
// Set-associative, LRU (each set's ways kept most recent first), write-back,
// write-allocate; a miss fills the line from the next level first, then
// evicts the set's least recent line, a dirty one written to the next level
// (a store there: it may miss and fill in turn).  Counters per level and per
// cause: 0 a load, 1 a store (the access that led here), 2 a write-back from
// the level above.

enum { CAUSE_LOAD, CAUSE_STORE, CAUSE_WRITEBACK };
#define MAX_LEVELS 4

typedef struct {
    uint64_t *tag;      // sets * ways, EMPTY: invalid
    uint8_t *dirty;
    uint64_t sets, set_mask;   // set_mask: sets - 1 when a power of two, else 0
    uint32_t ways;
    int64_t lookups[3], misses[3], writebacks, invalidations;
} level_t;

typedef struct {
    int levels, private_levels, line_shift, coherent;
    uint64_t size[MAX_LEVELS], ways[MAX_LEVELS];
    level_t shared[MAX_LEVELS];      // the levels from private_levels on
    level_t **private;               // per thread: private_levels levels
    uint64_t *last_line;             // per thread: its L1's most recent line
    int threads, thread_cap;
    // the threads that filled each line into a private level (a bit per thread
    // index mod 64; cleared when a store takes their copies away)
    linemap_t filled;
    uint64_t *filled_by;
    int64_t filled_cap;
} cachesim_t;

static int level_init(level_t *l, uint64_t size, uint32_t ways, int line_shift) {
    memset(l, 0, sizeof(*l));
    l->ways = ways;
    l->sets = (size >> line_shift) / ways;
    if (l->sets == 0) return -1;
    l->set_mask = (l->sets & (l->sets - 1)) == 0 ? l->sets - 1 : 0;
    l->tag = malloc(l->sets * ways * sizeof(uint64_t));
    l->dirty = calloc(l->sets * ways, 1);
    if (!l->tag || !l->dirty) return -1;
    memset(l->tag, 0xff, l->sets * ways * sizeof(uint64_t));
    return 0;
}

static void level_free(level_t *l) {
    free(l->tag);
    free(l->dirty);
}

void *cs_new(int levels, int private_levels, int line_shift, const uint64_t *size,
             const uint64_t *ways, int coherent) {
    if (levels < 1 || levels > MAX_LEVELS || private_levels < 0 || private_levels > levels)
        return NULL;
    cachesim_t *c = calloc(1, sizeof(*c));
    if (!c) return NULL;
    c->levels = levels;
    c->private_levels = private_levels;
    c->line_shift = line_shift;
    c->coherent = coherent && private_levels > 0;
    for (int k = 0; k < levels; k++) {
        c->size[k] = size[k];
        c->ways[k] = ways[k];
    }
    for (int k = private_levels; k < levels; k++) {
        if (level_init(&c->shared[k], size[k], (uint32_t)ways[k], line_shift)) return NULL;
    }
    if (lm_init(&c->filled, 1 << 12)) return NULL;
    return c;
}

void cs_free(void *ctx) {
    cachesim_t *c = ctx;
    if (!c) return;
    for (int k = c->private_levels; k < c->levels; k++) level_free(&c->shared[k]);
    for (int t = 0; t < c->threads; t++) {
        for (int k = 0; k < c->private_levels; k++) level_free(&c->private[t][k]);
        free(c->private[t]);
    }
    free(c->private);
    free(c->last_line);
    lm_free(&c->filled);
    free(c->filled_by);
    free(c);
}

// the threads that filled ``line`` into a private level (NULL: no memory)
static uint64_t *filled_of(cachesim_t *c, uint64_t line) {
    int fresh;
    int64_t slot = lm_get(&c->filled, line, &fresh);
    if (slot < 0) return NULL;
    if (slot >= c->filled_cap) {
        int64_t cap = c->filled_cap ? 2 * c->filled_cap : 1 << 12;
        uint64_t *p = realloc(c->filled_by, cap * sizeof(uint64_t));
        if (!p) return NULL;
        c->filled_by = p;
        c->filled_cap = cap;
    }
    if (fresh) c->filled_by[slot] = 0;
    return &c->filled_by[slot];
}

// A store of thread t takes ``line`` out of the other threads' private levels
// (what a coherent cache does); a modified copy is written to the first
// shared level.  -1: no memory.
static void cs_store_line(cachesim_t *c, int t, int k, uint64_t line, int cause,
                          uint32_t *demand);

static int invalidate_others(cachesim_t *c, int t, uint64_t line) {
    uint64_t *mask = filled_of(c, line);
    if (!mask) return -1;
    uint64_t mine = 1ULL << (t & 63);
    if (!(*mask & ~mine)) return 0;
    for (int u = 0; u < c->threads; u++) {
        if (u == t || !(*mask & (1ULL << (u & 63)))) continue;
        for (int k = 0; k < c->private_levels; k++) {
            level_t *l = &c->private[u][k];
            uint64_t base = (l->set_mask ? (line & l->set_mask) : (line % l->sets)) * l->ways;
            for (uint32_t w = 0; w < l->ways; w++) {
                if (l->tag[base + w] != line) continue;
                int dirty = l->dirty[base + w];
                memmove(l->tag + base + w, l->tag + base + w + 1, (l->ways - 1 - w) * sizeof(uint64_t));
                memmove(l->dirty + base + w, l->dirty + base + w + 1, l->ways - 1 - w);
                l->tag[base + l->ways - 1] = EMPTY;
                l->dirty[base + l->ways - 1] = 0;
                l->invalidations++;
                if (dirty && c->private_levels < c->levels)
                    cs_store_line(c, u, c->private_levels, line, CAUSE_WRITEBACK, NULL);
                break;
            }
        }
        if (c->last_line[u] == line) c->last_line[u] = EMPTY;
    }
    *mask &= mine;
    return 0;
}

// make threads 0..t exist
static int cs_threads(cachesim_t *c, int t) {
    if (t < c->threads) return 0;
    if (t >= c->thread_cap) {
        int cap = c->thread_cap ? c->thread_cap : 4;
        while (cap <= t) cap *= 2;
        level_t **p = realloc(c->private, cap * sizeof(*p));
        if (!p) return -1;
        c->private = p;
        uint64_t *ll = realloc(c->last_line, cap * sizeof(*ll));
        if (!ll) return -1;
        c->last_line = ll;
        c->thread_cap = cap;
    }
    while (c->threads <= t) {
        level_t *mine = calloc(c->private_levels ? c->private_levels : 1, sizeof(level_t));
        if (!mine) return -1;
        for (int k = 0; k < c->private_levels; k++)
            if (level_init(&mine[k], c->size[k], (uint32_t)c->ways[k], c->line_shift)) return -1;
        c->private[c->threads] = mine;
        c->last_line[c->threads] = EMPTY;
        c->threads++;
    }
    return 0;
}

static inline level_t *level_of(cachesim_t *c, int t, int k) {
    return k < c->private_levels ? &c->private[t][k] : &c->shared[k];
}

static inline uint64_t set_of(const level_t *l, uint64_t line) {
    return l->set_mask ? (line & l->set_mask) : (line % l->sets);
}

// the way of ``line`` in its set, or -1
static inline int find_way(const level_t *l, uint64_t base, uint64_t line) {
    const uint64_t *tags = l->tag + base;
    for (uint32_t w = 0; w < l->ways; w++)
        if (tags[w] == line) return (int)w;
    return -1;
}

// move way ``w`` of the set at ``base`` to the front (most recent)
static inline void to_front(level_t *l, uint64_t base, int w) {
    if (w == 0) return;
    uint64_t tag = l->tag[base + w];
    uint8_t dirty = l->dirty[base + w];
    memmove(l->tag + base + 1, l->tag + base, w * sizeof(uint64_t));
    memmove(l->dirty + base + 1, l->dirty + base, w);
    l->tag[base] = tag;
    l->dirty[base] = dirty;
}

// ``line`` brought to the front of level k's set; returns 1 when it missed
static int cs_load_line(cachesim_t *c, int t, int k, uint64_t line, int cause,
                        uint32_t *demand) {
    level_t *l = level_of(c, t, k);
    uint64_t base = set_of(l, line) * l->ways;
    l->lookups[cause]++;
    int w = find_way(l, base, line);
    if (w >= 0) {
        to_front(l, base, w);
        return 0;
    }
    l->misses[cause]++;
    if (demand && cause != CAUSE_WRITEBACK) *demand += 1u << (2 * k);
    if (c->coherent && k < c->private_levels) {
        uint64_t *mask = filled_of(c, line);
        if (mask) *mask |= 1ULL << (t & 63);
    }
    if (k + 1 < c->levels) cs_load_line(c, t, k + 1, line, cause, demand);
    // evict the least recent line, then place this one first
    uint32_t last = l->ways - 1;
    uint64_t victim = l->tag[base + last];
    uint8_t victim_dirty = l->dirty[base + last];
    memmove(l->tag + base + 1, l->tag + base, last * sizeof(uint64_t));
    memmove(l->dirty + base + 1, l->dirty + base, last);
    l->tag[base] = line;
    l->dirty[base] = 0;
    if (victim != EMPTY && victim_dirty) {
        l->writebacks++;
        if (k + 1 < c->levels) cs_store_line(c, t, k + 1, victim, CAUSE_WRITEBACK, NULL);
    }
    return 1;
}

// a store of ``line`` at level k: allocated there on a miss, marked dirty
static void cs_store_line(cachesim_t *c, int t, int k, uint64_t line, int cause,
                          uint32_t *demand) {
    level_t *l = level_of(c, t, k);
    uint64_t base = set_of(l, line) * l->ways;
    int w = find_way(l, base, line);
    if (w < 0) {
        cs_load_line(c, t, k, line, cause, demand);     // counts the lookup and the miss
        w = 0;
    } else {
        l->lookups[cause]++;
        if (cause != CAUSE_WRITEBACK) {        // a write-back is not a use of the line
            to_front(l, base, w);
            w = 0;
        }
    }
    l->dirty[base + w] = 1;
}

// Simulates n accesses: thread index ``thread[i]`` (NULL: all of thread
// ``one_thread``), address, size, kind (2: a store, else a load), each column
// with its stride.  ``out[i]``:
// the demand misses of access i, two bits per level (an access over two
// lines can miss twice at a level).  0, or -1 when out of memory.
int cs_run(void *ctx, const uint64_t *addr, int64_t addr_stride, const uint16_t *size,
           int64_t size_stride, const uint8_t *kind, int64_t kind_stride, const int32_t *thread,
           int one_thread, int64_t n, uint8_t *out) {
    cachesim_t *c = ctx;
    int shift = c->line_shift;
    if (cs_threads(c, one_thread)) return -1;
    for (int64_t i = 0; i < n; i++) {
        int t = thread ? thread[i] : one_thread;
        if (t >= c->threads && cs_threads(c, t)) return -1;
        uint64_t a = AT(uint64_t, addr, addr_stride, i);
        uint16_t s = AT(uint16_t, size, size_stride, i);
        uint64_t first = a >> shift;
        uint64_t last = (a + (s ? s : 1) - 1) >> shift;
        int cause = AT(uint8_t, kind, kind_stride, i) == 2 ? CAUSE_STORE : CAUSE_LOAD;
        uint32_t demand = 0;
        for (uint64_t line = first; line <= last; line++) {
            if (cause == CAUSE_STORE && c->coherent && invalidate_others(c, t, line)) return -1;
            if (line == c->last_line[t] && c->private_levels > 0) {
                // the thread's last line: first in its L1 set, nothing else changes
                level_t *l1 = level_of(c, t, 0);
                l1->lookups[cause]++;
                if (cause == CAUSE_STORE) l1->dirty[set_of(l1, line) * l1->ways] = 1;
                continue;
            }
            if (cause == CAUSE_STORE)
                cs_store_line(c, t, 0, line, cause, &demand);
            else
                cs_load_line(c, t, 0, line, cause, &demand);
            c->last_line[t] = line;
        }
        out[i] = (uint8_t)(demand > 255 ? 255 : demand);
    }
    return 0;
}

// Per level (summed over threads for the private ones): lookups[3], misses[3],
// writebacks, invalidations: 8 int64 per level.
void cs_stats(void *ctx, int64_t *out) {
    cachesim_t *c = ctx;
    memset(out, 0, 8 * sizeof(int64_t) * c->levels);
    for (int k = 0; k < c->levels; k++) {
        int n = k < c->private_levels ? c->threads : 1;
        for (int t = 0; t < n; t++) {
            level_t *l = k < c->private_levels ? &c->private[t][k] : &c->shared[k];
            for (int j = 0; j < 3; j++) {
                out[8 * k + j] += l->lookups[j];
                out[8 * k + 3 + j] += l->misses[j];
            }
            out[8 * k + 6] += l->writebacks;
            out[8 * k + 7] += l->invalidations;
        }
    }
}

// ================================================================== sharing
// Per cache line, who holds it (MSI as a coherent cache would): a store by a
// thread that is not the line's only holder invalidates the others' copies,
// a load by a thread without a copy while another holds it modified fetches
// it from that thread.  Each of those is a transfer.  Also: the threads that
// touched the line (a bit per thread index mod 64) and whether any stored.

typedef struct {
    uint64_t holders;       // threads with a copy (bit: index mod 64)
    int32_t modified_by;    // thread index holding it modified, -1
    int32_t first_thread;
    uint8_t many, stored;
    int64_t transfers;
} line_state_t;

typedef struct {
    linemap_t map;
    line_state_t *lines;
    int64_t cap;
    int line_shift;
} sharing_t;

void *sh_new(int line_shift) {
    sharing_t *s = calloc(1, sizeof(*s));
    if (!s || lm_init(&s->map, 1 << 16)) return NULL;
    s->line_shift = line_shift;
    return s;
}

void sh_free(void *ctx) {
    sharing_t *s = ctx;
    if (!s) return;
    lm_free(&s->map);
    free(s->lines);
    free(s);
}

static line_state_t *sh_line(sharing_t *s, uint64_t line) {
    int fresh;
    int64_t slot = lm_get(&s->map, line, &fresh);
    if (slot < 0) return NULL;
    if (slot >= s->cap) {
        int64_t cap = s->cap ? 2 * s->cap : 1 << 16;
        line_state_t *p = realloc(s->lines, cap * sizeof(*p));
        if (!p) return NULL;
        s->lines = p;
        s->cap = cap;
    }
    line_state_t *st = &s->lines[slot];
    if (fresh) {
        memset(st, 0, sizeof(*st));
        st->modified_by = -1;
        st->first_thread = -1;
    }
    return st;
}

// n accesses of threads ``thread`` in the order they happened.  0, -1: memory.
int sh_run(void *ctx, const uint64_t *addr, const uint16_t *size, const uint8_t *kind,
           const int32_t *thread, int64_t n) {
    sharing_t *s = ctx;
    for (int64_t i = 0; i < n; i++) {
        int32_t t = thread[i];
        uint64_t bit = 1ULL << (t & 63);
        uint64_t first = addr[i] >> s->line_shift;
        uint64_t last = (addr[i] + (size[i] ? size[i] : 1) - 1) >> s->line_shift;
        for (uint64_t line = first; line <= last; line++) {
            line_state_t *st = sh_line(s, line);
            if (!st) return -1;
            if (st->first_thread < 0) st->first_thread = t;
            else if (st->first_thread != t) st->many = 1;
            if (kind[i] == 2) {
                st->stored = 1;
                if (st->holders & ~bit) st->transfers++;    // the others' copies invalidated
                st->holders = bit;
                st->modified_by = t;
            } else {
                if (!(st->holders & bit) && st->modified_by >= 0 && st->modified_by != t)
                    st->transfers++;                       // fetched from the modified copy
                if (st->modified_by != t) st->modified_by = -1;
                st->holders |= bit;
            }
        }
    }
    return 0;
}

// The lines touched by more than one thread with at least one store: their
// numbers and transfers, sorted by line.  Returns how many (call with out
// NULL for the count).
int64_t sh_shared(void *ctx, uint64_t *lines, int64_t *transfers) {
    sharing_t *s = ctx;
    int64_t n = 0;
    for (int64_t h = 0; h < s->map.cap; h++) {
        if (s->map.entries[h].key == EMPTY) continue;
        line_state_t *st = &s->lines[s->map.entries[h].slot];
        if (!st->many || !st->stored) continue;
        if (lines) {
            lines[n] = s->map.entries[h].key;
            transfers[n] = st->transfers;
        }
        n++;
    }
    return n;
}

// ==================================================================== reuse
// Exact reuse distance (distinct lines used between two uses of a line;
// -1: the line's first use).  The most recent lines are a short list in the
// order of their last use (RECENT of them): a line found there at position j
// has distance j, and moves to the front.  The others ("old" lines) are
// counted with Olken's method: a Fenwick tree over time slots holds a 1 for
// every old line at the time it left the list; lines leave it least recent
// first, so their times are in the order of their last use, and the distance
// of an old line is the list's length plus the ones after its time.  When the
// slots run out, the live ones are renumbered in order: memory stays
// proportional to the distinct lines.

#define RECENT 32

typedef struct {
    linemap_t map;
    int64_t *last;       // per line slot: the time it left the recent list
    int64_t last_cap;
    int32_t *tree;       // Fenwick tree over times 1..cap
    uint8_t *mark;       // the time slots of an old line
    uint64_t *owner;     // the line slot of each marked time
    int64_t cap, now, live;   // live: the old lines (the marks)
    uint64_t recent_line[RECENT];   // the recent lines, most recent first
    int64_t recent_slot[RECENT];
    int recent;                     // how many
    int line_shift;
} reuse_t;

static int ru_alloc(reuse_t *r, int64_t cap) {
    free(r->tree);
    free(r->mark);
    free(r->owner);
    r->cap = cap;
    r->tree = calloc(cap + 1, sizeof(int32_t));
    r->mark = calloc(cap + 1, 1);
    r->owner = malloc((cap + 1) * sizeof(uint64_t));
    return (r->tree && r->mark && r->owner) ? 0 : -1;
}

void *ru_new(int line_shift) {
    reuse_t *r = calloc(1, sizeof(*r));
    if (!r || lm_init(&r->map, 1 << 16) || ru_alloc(r, 1 << 16)) return NULL;
    r->line_shift = line_shift;
    return r;
}

void ru_free(void *ctx) {
    reuse_t *r = ctx;
    if (!r) return;
    lm_free(&r->map);
    free(r->last);
    free(r->tree);
    free(r->mark);
    free(r->owner);
    free(r);
}

static inline void fw_add(reuse_t *r, int64_t i, int32_t v) {
    for (; i <= r->cap; i += i & -i) r->tree[i] += v;
}

static inline int64_t fw_sum(const reuse_t *r, int64_t i) {
    int64_t s = 0;
    for (; i > 0; i -= i & -i) s += r->tree[i];
    return s;
}

// renumber the marked times 1..live, in order, into a tree of at least 2*live+2^16
static int ru_compact(reuse_t *r) {
    int64_t live = 0, old_cap = r->cap;
    uint8_t *mark = r->mark;
    uint64_t *owner = r->owner;
    r->mark = NULL;
    r->owner = NULL;
    uint64_t *kept = malloc((r->live + 1) * sizeof(uint64_t));
    if (!kept) return -1;
    for (int64_t i = 1; i <= old_cap; i++)
        if (mark[i]) kept[live++] = owner[i];
    free(mark);
    free(owner);
    if (ru_alloc(r, 2 * live + (1 << 16))) {
        free(kept);
        return -1;
    }
    for (int64_t j = 0; j < live; j++) {
        int64_t time = j + 1;
        r->mark[time] = 1;
        r->owner[time] = kept[j];
        r->last[kept[j]] = time;
        r->tree[time] = 1;
    }
    for (int64_t i = 1; i <= r->cap; i++) {       // the tree built in one pass
        int64_t up = i + (i & -i);
        if (up <= r->cap) r->tree[up] += r->tree[i];
    }
    free(kept);
    r->now = live;
    return 0;
}

// the least recent line of the full list becomes old: a mark at the next time
static inline int ru_retire(reuse_t *r, int64_t slot) {
    if (r->now == r->cap && ru_compact(r)) return -1;
    int64_t now = ++r->now;
    fw_add(r, now, 1);
    r->mark[now] = 1;
    r->owner[now] = (uint64_t)slot;
    r->last[slot] = now;
    r->live++;
    return 0;
}

static inline int64_t ru_use(reuse_t *r, uint64_t line) {
    int n = r->recent;
    int j = 0;
    while (j < n && r->recent_line[j] != line) j++;
    int64_t distance, slot;
    if (j < n) {                                // a recent line
        distance = j;
        slot = r->recent_slot[j];
    } else {
        int fresh;
        slot = lm_get(&r->map, line, &fresh);
        if (slot < 0) return -2;
        if (slot >= r->last_cap) {
            int64_t cap = r->last_cap ? 2 * r->last_cap : 1 << 16;
            int64_t *p = realloc(r->last, cap * sizeof(int64_t));
            if (!p) return -2;
            r->last = p;
            r->last_cap = cap;
        }
        distance = -1;
        if (!fresh) {                           // an old line: no longer old
            int64_t prev = r->last[slot];
            distance = n + r->live - fw_sum(r, prev);
            fw_add(r, prev, -1);
            r->mark[prev] = 0;
            r->live--;
        }
        if (n == RECENT) {
            if (ru_retire(r, r->recent_slot[RECENT - 1])) return -2;
            j = RECENT - 1;
        } else {
            j = r->recent++;
        }
    }
    for (; j > 0; j--) {        // a few entries, mostly: a loop, not a call to memmove
        __asm__("" ::: "memory");
        r->recent_line[j] = r->recent_line[j - 1];
        r->recent_slot[j] = r->recent_slot[j - 1];
    }
    r->recent_line[0] = line;
    r->recent_slot[0] = slot;
    return distance;
}

// n accesses of one thread in order (address and size, each column with its
// stride): ``first[i]`` the reuse distance of the first line access i touched,
// ``second[i]`` that of the next line when it spans two (else -2; an access
// over more lines counts its first two).  0, -1: out of memory.
int ru_run(void *ctx, const uint64_t *addr, int64_t addr_stride, const uint16_t *size,
           int64_t size_stride, int64_t n, int64_t *first, int64_t *second) {
    reuse_t *r = ctx;
    for (int64_t i = 0; i < n; i++) {
        uint64_t at = AT(uint64_t, addr, addr_stride, i);
        uint16_t s = AT(uint16_t, size, size_stride, i);
        uint64_t a = at >> r->line_shift;
        uint64_t b = (at + (s ? s : 1) - 1) >> r->line_shift;
        first[i] = ru_use(r, a);
        second[i] = b != a ? ru_use(r, a + 1) : -2;
        if (first[i] == -2 || (b != a && second[i] == -2)) return -1;
    }
    return 0;
}
