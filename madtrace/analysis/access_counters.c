// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * The report kinds' counters over access rows, in C: what the heat map
 * (heatmap.py), the heap blocks' use (alloc_usage.py), the NUMA metrics
 * (numa.py) and the source lines (source_lines.py) do to each access, in one
 * loop over a tile of rows that feeds every kind asked for (ac_count; of a
 * block of compact records decoded a tile at a time: ac_count_compact, and
 * with the columns of the access stream: ac_stream_compact), so a report of
 * several kinds reads each access once (madtrace/analysis/shared_pass.py).  And
 * what the cache and the reuse distances tally per access after their
 * simulation (memory_sim.c): ac_cache, ac_reuse.
 *
 * The heat map, the heap blocks and NUMA are objects of their own (hm_*, al_*,
 * nu_*: made, fed and read by the kind's module through access_counters.py);
 * the arrays and tallies (access_pass.py's Tally) they fill belong to the
 * Python side, which keeps them alive.  Built into libmtreplay.so with the
 * access pass (access_pass.h).
 */
#include "../trace/access_pass.h"

#define PAGE_SHIFT 12                 /* trace/format.py PAGE_SHIFT */
#define UNPINNED (-1)                 /* numa.py: a thread or page bound to no node */

/* --------------------------------------------------------- the heat map */
/*
 * Regions sorted by start; an address is in the last region starting at or
 * before it when it lies before that region's end (numpy's searchsorted, as
 * the block events' pages are placed: heatmap.py).  Counts per page of each
 * region: loads, stores, block events.  An access counts on its first page
 * and, when it spans two, on its last too (in the region of its address);
 * accesses outside every region go to a tally by page.
 */
typedef struct {
    const uint64_t *start, *end;      /* the regions' exact bytes */
    const int64_t *row;               /* each region's first row in counts */
    const int64_t *pages;             /* each region's rows */
    int64_t n;
    int64_t *counts;                  /* 3 per row */
    tally_t *outside;                 /* page << 2 | column -> count */
    int64_t *once;                    /* loads, stores: each access once */
    uint64_t lo, hi;                  /* [lo, hi): the addresses of the last answer */
    int64_t found;
} heatmap_t;

void *hm_new(const uint64_t *start, const uint64_t *end, const int64_t *row,
             const int64_t *pages, int64_t n, int64_t *counts, void *outside, int64_t *once)
{
    heatmap_t *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    *h = (heatmap_t){start, end, row, pages, n, counts, outside, once, 0, 0, -1};
    return h;
}

void hm_free(void *p) { free(p); }

/* the index of the region of ``addr`` (-1: none) */
static inline int64_t hm_region(heatmap_t *h, uint64_t addr)
{
    if (addr >= h->lo && addr < h->hi)
        return h->found;
    int64_t lo = 0, hi = h->n;          /* first start > addr */
    while (lo < hi) {
        int64_t mid = (lo + hi) >> 1;
        if (h->start[mid] <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    int64_t j = lo - 1;
    uint64_t next = lo < h->n ? h->start[lo] : UINT64_MAX;
    if (j >= 0 && addr < h->end[j]) {
        h->found = j;
        h->lo = h->start[j];
        h->hi = h->end[j] < next ? h->end[j] : next;
    } else {
        h->found = -1;
        h->lo = j < 0 ? 0 : (h->end[j] > h->start[j] ? h->end[j] : h->start[j]);
        h->hi = next;
    }
    return h->found;
}

/* one count of ``column`` on ``page`` of region ``r`` (-1: outside every region) */
static inline int hm_page(heatmap_t *h, int64_t r, uint64_t page, int column)
{
    if (r < 0) {
        int64_t *sum = tally_row(h->outside, page << 2 | (uint64_t)column, 0);
        if (!sum)
            return -1;
        sum[0] += 1;
        return 0;
    }
    uint64_t rel = page - (h->start[r] >> PAGE_SHIFT);
    if (rel >= (uint64_t)h->pages[r])
        rel = (uint64_t)h->pages[r] - 1;
    h->counts[(h->row[r] + (int64_t)rel) * 3 + column] += 1;
    return 0;
}

static int hm_rows(heatmap_t *h, const access_t *rows, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        const access_t *a = &rows[i];
        int column = a->kind == KIND_STORE;
        int64_t r = hm_region(h, a->addr);
        uint64_t first = a->addr >> PAGE_SHIFT;
        uint64_t last = (a->addr + (a->size ? a->size : 1) - 1) >> PAGE_SHIFT;
        h->once[column] += 1;
        if (hm_page(h, r, first, column) || (last != first && hm_page(h, r, last, column)))
            return -1;
    }
    return 0;
}

/* a block event's range: a count of column 2 on each of its pages (each in the
 * region of its first byte in the range) */
int hm_block_range(void *p, uint64_t address, uint64_t size)
{
    heatmap_t *h = p;
    uint64_t last = (address + (size ? size : 1) - 1) >> PAGE_SHIFT;
    for (uint64_t page = address >> PAGE_SHIFT; page <= last; page++) {
        uint64_t at = page << PAGE_SHIFT;
        if (hm_page(h, hm_region(h, at > address ? at : address), page, 2))
            return -1;
    }
    return 0;
}

/* ------------------------------------------------------ the heap blocks */
/*
 * Per block id (0..size-1; an id past the table counts as 0): loads, stores,
 * bytes loaded, bytes stored, accesses after free by the program, accesses by
 * the allocator (its thread inside one of its calls: the spans), in the
 * columns of alloc_usage.py (ALLOC_COLUMNS wide); and the first access after
 * free of each block: the least (order, rip, address, tid).
 */
enum { AL_LOADS, AL_STORES, AL_BYTES_LOADED, AL_BYTES_STORED, AL_FREED = 7, AL_ALLOCATOR = 8,
       ALLOC_COLUMNS = 9 };

typedef struct {
    int64_t size;
    int64_t *table;                   /* size x ALLOC_COLUMNS */
    uint64_t *first_freed;            /* size x 4: order (UINT64_MAX: none), rip, addr, tid */
    const uint64_t *span_begin, *span_end;   /* the current thread's allocator calls */
    int64_t spans;
} alloc_t;

void *al_new(int64_t size, int64_t *table, uint64_t *first_freed)
{
    alloc_t *a = calloc(1, sizeof *a);
    if (!a)
        return NULL;
    a->size = size;
    a->table = table;
    a->first_freed = first_freed;
    return a;
}

void al_free(void *p) { free(p); }

/* the allocator calls of the thread whose rows come next (sorted begins and ends) */
void al_thread(void *p, const uint64_t *span_begin, const uint64_t *span_end, int64_t spans)
{
    alloc_t *a = p;
    a->span_begin = span_begin;
    a->span_end = span_end;
    a->spans = spans;
}

static inline int before(const uint64_t *x, const uint64_t *y)
{
    for (int k = 0; k < 4; k++)
        if (x[k] != y[k])
            return x[k] < y[k];
    return 0;
}

static void al_rows(alloc_t *a, const access_t *rows, int64_t n, uint64_t tid)
{
    int64_t span = 0;
    for (int64_t i = 0; i < n; i++) {
        const access_t *r = &rows[i];
        if (r->block == 0)
            continue;
        int64_t id = (int64_t)r->block < a->size ? (int64_t)r->block : 0;
        int64_t *row = a->table + id * ALLOC_COLUMNS;
        int store = r->kind == KIND_STORE;
        int allocator = in_span(a->span_begin, a->span_end, a->spans, &span, r->order);
        row[store ? AL_STORES : AL_LOADS] += 1;
        row[store ? AL_BYTES_STORED : AL_BYTES_LOADED] += r->size;
        row[AL_ALLOCATOR] += allocator;
        if (r->freed && !allocator) {
            row[AL_FREED] += 1;
            if ((int64_t)r->block < a->size) {
                uint64_t candidate[4] = {r->order, r->rip, r->addr, tid};
                uint64_t *first = a->first_freed + (int64_t)r->block * 4;
                if (before(candidate, first))
                    memcpy(first, candidate, sizeof candidate);
            }
        }
    }
}

/* ------------------------------------------------------------- NUMA */
/*
 * numa.py's metrics.  Pages get a dense index as first met; each keeps its
 * first touch (order, thread, the thread's node then) and its class (pinned,
 * node), which the topology gives from the first touch: a page range bound to
 * a node (the first range that holds it, in the topology's order), else pinned
 * when the first toucher was, on its node under the first-touch policy, else
 * on the node move_pages observed (observed: sorted pages, their nodes).
 *
 * The first touch of a page is its earliest access: with one thread, the
 * first one met (the count finds and classifies new pages as it goes); with
 * more, nu_first_touches over every thread first (each thread's first access
 * to the page; the earliest order, an earlier thread on a tie), then
 * nu_classify, then the count.
 *
 * Each access: its category (its index in numa.py's METRICS), whether it is
 * its page's first touch (and by an unpinned thread), tallied by rip, by
 * allocation group (the block, else -(page index + 1)) and by thread, key << 3
 * | category -> accesses, first touches, unpinned first touches; the accesses
 * per thread and node of the page (thread << 32 | node + 1).
 */
enum { LOCAL = 2, REMOTE, UNPINNED_PAGE, UNPINNED_THREAD, UNPINNED_BOTH, UNKNOWN_NODE };

typedef struct {
    const uint64_t *bound_start, *bound_end;
    const int64_t *bound_node;
    int64_t bounds;
    const uint64_t *observed_page;
    const int64_t *observed_node;
    int64_t observed;
    int first_touch_policy;
    dense_t pages;
    struct page_state {
        uint64_t first_order;
        int64_t first_tid, first_node, met_by, node;
        uint8_t pinned;
    } *state;
    int64_t cap;
    tally_t *by_rip, *by_group, *by_thread, *matrix;
    uint64_t last_page;              /* the page of the previous access, its index */
    int64_t last_index;
    /* the current thread: its binding changes (sorted orders, nodes) */
    int64_t tid;
    const uint64_t *binding_order;
    const int64_t *binding_node;
    int64_t bindings;
} numa_t;

void *nu_new(const uint64_t *bound_start, const uint64_t *bound_end, const int64_t *bound_node,
             int64_t bounds, const uint64_t *observed_page, const int64_t *observed_node,
             int64_t observed, int first_touch_policy, void *by_rip, void *by_group,
             void *by_thread, void *matrix)
{
    numa_t *u = calloc(1, sizeof *u);
    if (!u || dense_init(&u->pages)) {
        free(u);
        return NULL;
    }
    u->bound_start = bound_start;
    u->bound_end = bound_end;
    u->bound_node = bound_node;
    u->bounds = bounds;
    u->observed_page = observed_page;
    u->observed_node = observed_node;
    u->observed = observed;
    u->first_touch_policy = first_touch_policy;
    u->by_rip = by_rip;
    u->by_group = by_group;
    u->by_thread = by_thread;
    u->matrix = matrix;
    u->last_index = -1;
    return u;
}

void nu_free(void *p)
{
    numa_t *u = p;
    if (!u)
        return;
    dense_free(&u->pages);
    free(u->state);
    free(u);
}

/* the thread whose rows come next and its binding changes (its node from each order on) */
void nu_thread(void *p, int64_t tid, const uint64_t *order, const int64_t *node, int64_t n)
{
    numa_t *u = p;
    u->tid = tid;
    u->binding_order = order;
    u->binding_node = node;
    u->bindings = n;
}

/* the current thread's node at ``order`` (its first binding's before it) */
static inline int64_t thread_node(const numa_t *u, uint64_t order, int64_t *at)
{
    if (!u->bindings)
        return UNPINNED;
    const uint64_t *o = u->binding_order;
    if (order < o[0])
        return u->binding_node[0];
    int64_t j = *at;
    if (!(o[j] <= order && (j + 1 == u->bindings || o[j + 1] > order))) {
        int64_t lo = 0, hi = u->bindings;      /* first order > ``order`` (lo >= 1) */
        while (lo < hi) {
            int64_t mid = (lo + hi) >> 1;
            if (o[mid] <= order)
                lo = mid + 1;
            else
                hi = mid;
        }
        j = *at = lo - 1;
    }
    return u->binding_node[j];
}

/* the index of ``page``, with a new state when first met (*fresh); -1: no memory */
static inline int64_t nu_page(numa_t *u, uint64_t page, int *fresh)
{
    *fresh = 0;
    if (u->last_index >= 0 && page == u->last_page)
        return u->last_index;
    int64_t before_n = u->pages.n;
    int64_t i = dense_id(&u->pages, page);
    if (i < 0)
        return -1;
    *fresh = u->pages.n > before_n;
    u->last_page = page;
    u->last_index = i;
    if (!*fresh)
        return i;
    if (i >= u->cap) {
        int64_t cap = u->cap ? u->cap * 2 : 1024;
        struct page_state *s = realloc(u->state, (size_t)cap * sizeof *s);
        if (!s)
            return -1;
        u->state = s;
        u->cap = cap;
    }
    u->state[i] = (struct page_state){UINT64_MAX, 0, UNPINNED, -1, UNPINNED, 0};
    return i;
}

/* a page's class (pinned, node) from its first touch */
static void nu_place(numa_t *u, int64_t i)
{
    struct page_state *s = &u->state[i];
    uint64_t address = u->pages.order[i] << PAGE_SHIFT;
    for (int64_t k = 0; k < u->bounds; k++)
        if (u->bound_start[k] <= address && address < u->bound_end[k]) {
            s->pinned = 1;
            s->node = u->bound_node[k];
            return;
        }
    s->pinned = s->first_node != UNPINNED;
    if (u->first_touch_policy && s->first_node != UNPINNED) {
        s->node = s->first_node;
        return;
    }
    int64_t lo = 0, hi = u->observed;         /* the observed node of the page */
    uint64_t page = u->pages.order[i];
    while (lo < hi) {
        int64_t mid = (lo + hi) >> 1;
        if (u->observed_page[mid] < page)
            lo = mid + 1;
        else
            hi = mid;
    }
    s->node = lo < u->observed && u->observed_page[lo] == page ? u->observed_node[lo] : UNPINNED;
}

/* the first touches of the current thread's rows (see above) */
int nu_first_touches(void *p, const access_t *rows, int64_t n)
{
    numa_t *u = p;
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        int fresh;
        int64_t k = nu_page(u, rows[i].addr >> PAGE_SHIFT, &fresh);
        if (k < 0)
            return -1;
        struct page_state *s = &u->state[k];
        if (s->met_by == u->tid)
            continue;               /* not this thread's first access to the page */
        s->met_by = u->tid;
        if (rows[i].order < s->first_order) {
            s->first_order = rows[i].order;
            s->first_tid = u->tid;
            s->first_node = thread_node(u, rows[i].order, &at);
        }
    }
    return 0;
}

void nu_classify(void *p)
{
    numa_t *u = p;
    for (int64_t i = 0; i < u->pages.n; i++)
        nu_place(u, i);
}

static inline int category(int64_t node, const struct page_state *s)
{
    if (node != UNPINNED) {
        if (!s->pinned)
            return UNPINNED_PAGE;
        if (s->node == UNPINNED)
            return UNKNOWN_NODE;
        return s->node == node ? LOCAL : REMOTE;
    }
    return s->pinned ? UNPINNED_THREAD : UNPINNED_BOTH;
}

/* add to a tally: ``key`` << 3 | category -> accesses, first touches, unpinned first touches */
static inline int nu_tally(tally_t *t, int64_t key, int cat, int64_t accesses, int64_t first,
                           int64_t unpinned_first)
{
    int64_t *sums = tally_row(t, (uint64_t)key << 3 | (uint64_t)cat, 0);
    if (!sums)
        return -1;
    sums[0] += accesses;
    sums[1] += first;
    sums[2] += unpinned_first;
    return 0;
}

#define MATRIX_NODES 64               /* page nodes counted in an array before the tally */

static int nu_rows(numa_t *u, const access_t *rows, int64_t n)
{
    int64_t at = 0, tid = u->tid;
    /* the thread's own rows (by_thread, matrix) summed here, added once */
    int64_t by_category[8][3] = {{0}};
    int64_t by_node[MATRIX_NODES] = {0};
    for (int64_t i = 0; i < n; i++) {
        const access_t *r = &rows[i];
        int fresh;
        int64_t k = nu_page(u, r->addr >> PAGE_SHIFT, &fresh);
        if (k < 0)
            return -1;
        int64_t node = thread_node(u, r->order, &at);
        struct page_state *s = &u->state[k];
        if (fresh) {                 /* one thread: its first access is the first touch */
            s->first_order = r->order;
            s->first_tid = tid;
            s->first_node = node;
            nu_place(u, k);
        }
        int cat = category(node, s);
        int first = r->order == s->first_order && s->first_tid == tid;
        int unpinned_first = first && node == UNPINNED;
        int64_t group = r->block > 0 ? (int64_t)r->block : -(k + 1);
        if (nu_tally(u->by_rip, (int64_t)r->rip, cat, 1, first, unpinned_first)
            || nu_tally(u->by_group, group, cat, 1, first, unpinned_first))
            return -1;
        by_category[cat][0] += 1;
        by_category[cat][1] += first;
        by_category[cat][2] += unpinned_first;
        if (s->node + 1 < MATRIX_NODES) {
            by_node[s->node + 1] += 1;
        } else {
            int64_t *cell = tally_row(u->matrix, (uint64_t)tid << 32 | (uint64_t)(s->node + 1), 0);
            if (!cell)
                return -1;
            cell[0] += 1;
        }
    }
    for (int cat = 0; cat < 8; cat++)
        if (by_category[cat][0]
            && nu_tally(u->by_thread, tid, cat, by_category[cat][0], by_category[cat][1],
                        by_category[cat][2]))
            return -1;
    for (int k = 0; k < MATRIX_NODES; k++) {
        if (!by_node[k])
            continue;
        int64_t *cell = tally_row(u->matrix, (uint64_t)tid << 32 | (uint64_t)k, 0);
        if (!cell)
            return -1;
        cell[0] += by_node[k];
    }
    return 0;
}

/* the pages met so far, by index, into ``out`` (room for all); returns how many */
int64_t nu_pages(void *p, uint64_t *out)
{
    numa_t *u = p;
    if (out && u->pages.n)
        memcpy(out, u->pages.order, (size_t)u->pages.n * sizeof *out);
    return u->pages.n;
}

/* ------------------------------------------------------- source lines */
/* per instruction (a tally of width 2): rip << 1 | store -> accesses, bytes */
static int sl_rows(tally_t *t, const access_t *rows, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        int64_t *sums = tally_row(t, rows[i].rip << 1 | (rows[i].kind == KIND_STORE), 0);
        if (!sums)
            return -1;
        sums[0] += 1;
        sums[1] += rows[i].size;
    }
    return 0;
}

/* ------------------------------------------- the memory analyses' tallies */
/*
 * What cache.py and reuse.py tally per access after memory_sim.c's simulation,
 * on the stream's columns (access_stream.py: data id, function, call; a column
 * of the rows, rip, read with its stride in bytes).
 */

/* the cache: each access's demand misses (memory_sim.c's codes: two bits per
 * level) as columns 1..levels after a count, per data id and function
 * (did << 32 | fid + 1), per rip and, unless NULL, per call (call_id + 1) */
int ac_cache(void *by_data_function, void *by_rip, void *by_call, int levels,
             const uint32_t *did, const int32_t *fid, const uint64_t *rip, int64_t rip_stride,
             const int64_t *call_id, const uint8_t *codes, int64_t n)
{
    tally_t *tallies[3] = {by_data_function, by_rip, by_call};
    for (int64_t i = 0; i < n; i++) {
        uint64_t keys[3] = {(uint64_t)did[i] << 32 | (uint32_t)(fid[i] + 1),
                            *(const uint64_t *)((const char *)rip + i * rip_stride),
                            call_id ? (uint64_t)(call_id[i] + 1) : 0};
        for (int k = 0; k < 3; k++) {
            if (!tallies[k])
                continue;
            int64_t *sums = tally_row(tallies[k], keys[k], 0);
            if (!sums)
                return -1;
            sums[0] += 1;
            for (int level = 0; level < levels; level++)
                sums[1 + level] += (codes[i] >> (2 * level)) & 3;
        }
    }
    return 0;
}

#define REUSE_COLD 48                 /* reuse.py COLD: the bucket of first uses */

/* a reuse distance's histogram bucket: 0 for 0, b for 2^(b-1)..2^b - 1, COLD for -1 */
static inline uint64_t reuse_bucket(int64_t distance)
{
    if (distance < 0)
        return REUSE_COLD;
    return distance ? 64 - (uint64_t)__builtin_clzll((uint64_t)distance) : 0;
}

/* reuse: each use of a line (memory_sim.c's distances: ``first`` of each access,
 * then ``second`` of its next line, -2: none) by bucket in ``histogram`` (COLD +
 * 1), per data id (did << 8 | bucket) and per function (fid + 1 << 8 | bucket) */
int ac_reuse(void *by_data, void *by_function, int64_t *histogram, const uint32_t *did,
             const int32_t *fid, const int64_t *first, const int64_t *second, int64_t n)
{
    for (int line = 0; line < 2; line++)
        for (int64_t i = 0; i < n; i++) {
            int64_t distance = line ? second[i] : first[i];
            if (line && distance == -2)
                continue;
            uint64_t bucket = reuse_bucket(distance);
            int64_t *data = tally_row(by_data, (uint64_t)did[i] << 8 | bucket, 0);
            int64_t *function = tally_row(by_function,
                                          (uint64_t)(uint32_t)(fid[i] + 1) << 8 | bucket, 0);
            if (!data || !function)
                return -1;
            data[0] += 1;
            function[0] += 1;
            histogram[bucket] += 1;
        }
    return 0;
}

/* ------------------------------------------------------------ the pass */
/*
 * ``n`` rows of the current thread (``tid``) to each kind given (NULL: not
 * asked for), a tile at a time (the tile stays in the cache from one kind to
 * the next).  ``source``: a tally (access_pass.py) of width 2.  0, -1 when
 * memory ran out.
 */
int ac_count(const access_t *rows, int64_t n, int64_t tid, void *heatmap, void *alloc,
             void *numa, void *source)
{
    enum { TILE = 2048 };
    for (int64_t first = 0; first < n; first += TILE) {
        int64_t m = n - first < TILE ? n - first : TILE;
        const access_t *tile = rows + first;
        if (heatmap && hm_rows(heatmap, tile, m))
            return -1;
        if (alloc)
            al_rows(alloc, tile, m, (uint64_t)tid);
        if (numa && nu_rows(numa, tile, m))
            return -1;
        if (source && sl_rows(source, tile, m))
            return -1;
    }
    return 0;
}

struct pass_counters {        /* ac_count's arguments but the rows, and the rows counted */
    int64_t tid;
    void *heatmap, *alloc, *numa, *source;
    int64_t rows;
};

static int count_tile(void *ctx, const access_t *rows, int64_t n)
{
    struct pass_counters *c = ctx;
    c->rows += n;
    return ac_count(rows, n, c->tid, c->heatmap, c->alloc, c->numa, c->source);
}

/*
 * ac_count for the compact records of one block (ap_decode's arguments),
 * decoded a tile at a time (ap_decode_tiles): no row is made.  Returns the rows
 * counted, -1 when memory ran out, -2 with ``*bad_id`` for an unknown
 * instruction id (nothing counted, the state unchanged).
 */
int64_t ac_count_compact(const uint8_t *data, int64_t n, int planes, const uint64_t *i_rip,
                         const uint16_t *i_size, const uint8_t *i_kind, const uint8_t *i_ilen,
                         const uint8_t *i_first, int64_t n_inst, decode_state_t *state,
                         int64_t *bad_id, int64_t tid, void *heatmap, void *alloc, void *numa,
                         void *source)
{
    compact_block_t block = {data, n, planes, i_rip, i_size, i_kind, i_ilen, i_first, n_inst};
    struct pass_counters counters = {tid, heatmap, alloc, numa, source, 0};
    int rc = ap_decode_tiles(&block, state, bad_id, count_tile, &counters);
    return rc ? rc : counters.rows;
}

struct stream_columns {       /* ac_stream_compact's counters, namer and columns */
    struct pass_counters counters;
    void *namer;
    uint64_t *addr, *rip, *order;
    uint16_t *size;
    uint8_t *kind;
    uint32_t *did;
    int64_t done;
};

static int stream_tile(void *ctx, const access_t *rows, int64_t n)
{
    struct stream_columns *c = ctx;
    if (count_tile(&c->counters, rows, n) || ap_data_ids(c->namer, rows, n, c->did + c->done))
        return -1;
    for (int64_t i = 0; i < n; i++) {
        int64_t at = c->done + i;
        c->addr[at] = rows[i].addr;
        c->size[at] = rows[i].size;
        c->kind[at] = rows[i].kind;
        c->rip[at] = rows[i].rip;
        c->order[at] = rows[i].order;
    }
    c->done += n;
    return 0;
}

/*
 * The compact records of one block of a thread without call records (ap_decode's
 * arguments), decoded a tile at a time: each tile to the counters given (as
 * ac_count), then to the columns of access_stream.py (addr, size, kind, rip, the
 * data id by ``namer`` (access_pass.c), order) from their start (room for 2n
 * rows): no row is kept.  Returns the rows written, -1 when memory ran out, -2
 * with ``*bad_id`` for an unknown instruction id (nothing counted or written,
 * the state unchanged).
 */
int64_t ac_stream_compact(const uint8_t *data, int64_t n, int planes, const uint64_t *i_rip,
                          const uint16_t *i_size, const uint8_t *i_kind, const uint8_t *i_ilen,
                          const uint8_t *i_first, int64_t n_inst, decode_state_t *state,
                          int64_t *bad_id, int64_t tid, void *heatmap, void *alloc, void *numa,
                          void *source, void *namer, uint64_t *addr, uint16_t *size,
                          uint8_t *kind, uint64_t *rip, uint32_t *did, uint64_t *order)
{
    compact_block_t block = {data, n, planes, i_rip, i_size, i_kind, i_ilen, i_first, n_inst};
    struct stream_columns columns = {{tid, heatmap, alloc, numa, source, 0}, namer, addr, rip,
                                     order, size, kind, did, 0};
    int rc = ap_decode_tiles(&block, state, bad_id, stream_tile, &columns);
    return rc ? rc : columns.done;
}
