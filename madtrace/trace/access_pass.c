// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * The access pass, in C: what every reader of a trace's data accesses does to
 * each access, done once per access in one loop instead of numpy passes.
 *
 *  - ap_decode: the compact access records of one block (data/<tid>.dat, the
 *    layout of madtrace/trace/format.py: COMPACT_DTYPE, the markers, byte
 *    planes) to access rows (ACCESS_DTYPE), a read-modify-write as two rows;
 *    ap_decode_tiles: a block a tile at a time, each tile of rows handed on
 *    while it is in the cache (to the report kinds' counters);
 *    ap_rows_compact, ap_count_compact: a block decoded, named and written as
 *    the store's columns, or counted, in one loop without access rows;
 *  - the namer (ap_rows, ap_count_*): each access row to the ids of the store (madtrace/trace/
 *    access_names.py): its instruction (rip and size) and its data (a heap
 *    block as live or freed, a static object and, for a DWARF variable, the
 *    offset in it, else the bare region), each a dense id given in the order
 *    first met, with per data id counts of loads, stores and bytes.
 *
 * Called through ctypes by madtrace/trace/access_pass.py, and in C by the
 * report kinds' counters (madtrace/analysis/access_counters.c: ap_decode_tiles,
 * ap_data_ids), built with them and replay.c into libmtreplay.so; what they
 * share is in access_pass.h.
 */
#include "access_pass.h"

enum { MARK_SEQ = 1, MARK_ORDER = 2 };
#define NCOUNT 4                          /* counts per data id */
#define FREED_BIT 0x80000000u
#define REC_SIZE 16                       /* COMPACT_DTYPE: u64 a, u32 id, u32 b */

size_t ap_access_size(void) { return sizeof(access_t); }

static inline uint64_t plane_bytes(const uint8_t *planes, int64_t n, int64_t i, int first, int count)
{
    uint64_t v = 0;
    for (int k = 0; k < count; k++)
        v |= (uint64_t)planes[(int64_t)(first + k) * n + i] << (8 * k);
    return v;
}

/* whether every record of a block names an instruction of the table (else
 * ``*bad_id``: the first that does not), checked before anything is counted */
static int ids_known(const uint8_t *data, int64_t n, int planes, int64_t n_inst, int64_t *bad_id)
{
    for (int64_t i = 0; i < n; i++) {
        uint32_t id;
        if (planes)
            id = (uint32_t)plane_bytes(data, n, i, 8, 4);
        else
            memcpy(&id, data + i * REC_SIZE + 8, 4);
        if ((int64_t)id >= n_inst) {
            *bad_id = id;
            return 0;
        }
    }
    return 1;
}

#ifdef __SSE2__
#include <emmintrin.h>

_Static_assert(REC_SIZE == 16, "a record is one SSE2 register");

/* records first..first+15 out of the byte planes into ``out``: a 16 x 16 byte
 * transpose, four rounds of interleaving (bytes, then pairs, fours, eights)
 * after which register v holds the record whose index is v's four bits
 * reversed */
static inline void planes_to_records16(const uint8_t *data, int64_t n, int64_t first, uint8_t *out)
{
    static const uint8_t record_of[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};
    __m128i a[16], b[16];
    for (int k = 0; k < 16; k++)
        a[k] = _mm_loadu_si128((const __m128i *)(data + (int64_t)k * n + first));
    for (int k = 0; k < 8; k++) {
        b[k] = _mm_unpacklo_epi8(a[2 * k], a[2 * k + 1]);
        b[k + 8] = _mm_unpackhi_epi8(a[2 * k], a[2 * k + 1]);
    }
    for (int k = 0; k < 8; k++) {
        a[k] = _mm_unpacklo_epi16(b[2 * k], b[2 * k + 1]);
        a[k + 8] = _mm_unpackhi_epi16(b[2 * k], b[2 * k + 1]);
    }
    for (int k = 0; k < 8; k++) {
        b[k] = _mm_unpacklo_epi32(a[2 * k], a[2 * k + 1]);
        b[k + 8] = _mm_unpackhi_epi32(a[2 * k], a[2 * k + 1]);
    }
    for (int k = 0; k < 8; k++) {
        a[k] = _mm_unpacklo_epi64(b[2 * k], b[2 * k + 1]);
        a[k + 8] = _mm_unpackhi_epi64(b[2 * k], b[2 * k + 1]);
    }
    for (int v = 0; v < 16; v++)
        _mm_storeu_si128((__m128i *)(out + REC_SIZE * record_of[v]), a[v]);
}
#endif

/* the records first..first+m-1 of a block as they are: in place, or copied out
 * of the byte planes into ``tile`` (room for m records) */
static const uint8_t *tile_records(const uint8_t *data, int64_t n, int planes, int64_t first,
                                   int64_t m, uint8_t *tile)
{
    if (!planes)
        return data + first * REC_SIZE;
    int64_t done = 0;
#ifdef __SSE2__
    for (; done + 16 <= m; done += 16) {
        /* sixteen streams, one per plane, which the hardware's prefetchers lose:
         * each plane's line four lines ahead asked for explicitly */
        if (((first + done) & 63) == 0)
            for (int k = 0; k < REC_SIZE; k++)
                __builtin_prefetch(data + (int64_t)k * n + first + done + 256);
        planes_to_records16(data, n, first + done, tile + done * REC_SIZE);
    }
#endif
    for (int k = 0; k < REC_SIZE; k++) {
        const uint8_t *plane = data + (int64_t)k * n + first;
        for (int64_t i = done; i < m; i++)
            tile[i * REC_SIZE + k] = plane[i];
    }
    return tile;
}

/* a marker record (instruction id 0) sets the seq or the next order: 1 when
 * (a, id, b) is one (the state updated), 0 for an access */
static inline int take_marker(uint64_t a, uint32_t id, uint32_t b, uint64_t *seq, int64_t *order)
{
    if (id != 0)
        return 0;
    if (b == MARK_SEQ)
        *seq = a;
    else if (b == MARK_ORDER)
        *order = (int64_t)a;
    return 1;
}

/* one compact record: a marker, taken into ``seq``/``order`` (0), or an access
 * of a kind recorded (1: its address, instruction id, block word and kind) */
static inline int read_access(const uint8_t *rec, const uint8_t *i_kind, uint64_t *seq,
                              int64_t *order, uint64_t *a, uint32_t *id, uint32_t *b,
                              uint8_t *kind)
{
    memcpy(a, rec, 8);
    memcpy(id, rec + 8, 4);
    memcpy(b, rec + 12, 4);
    if (take_marker(*a, *id, *b, seq, order))
        return 0;
    *kind = i_kind[*id];
    return *kind != 0;
}

/*
 * Decode ``n`` records: ``planes`` true: byte planes (byte k of every record,
 * then byte k + 1), else the records as they are.  Instruction columns by id:
 * rip, size, kind (1 load, 2 store, 3 both, already masked by the kinds
 * recorded), ilen, first.  Writes at most 2n rows to ``out``; returns how many,
 * or -1 with ``*bad_id`` = the first id not in the table (state unchanged).
 */
int64_t ap_decode(const uint8_t *data, int64_t n, int planes,
                  const uint64_t *i_rip, const uint16_t *i_size, const uint8_t *i_kind,
                  const uint8_t *i_ilen, const uint8_t *i_first, int64_t n_inst,
                  decode_state_t *state, access_t *out, int64_t *bad_id)
{
    uint64_t seq = state->seq;
    int64_t order = state->next_order;
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        uint64_t a;
        uint32_t id, b;
        if (planes) {
            a = plane_bytes(data, n, i, 0, 8);
            id = (uint32_t)plane_bytes(data, n, i, 8, 4);
            b = (uint32_t)plane_bytes(data, n, i, 12, 4);
        } else {
            const uint8_t *r = data + i * REC_SIZE;
            memcpy(&a, r, 8);
            memcpy(&id, r + 8, 4);
            memcpy(&b, r + 12, 4);
        }
        if (take_marker(a, id, b, &seq, &order))
            continue;
        if ((int64_t)id >= n_inst) {
            *bad_id = id;
            return -1;
        }
        uint8_t kind = i_kind[id];
        int rows = kind == 3 ? 2 : kind ? 1 : 0;
        for (int r = 0; r < rows; r++) {
            access_t *o = &out[m++];
            o->seq = seq;
            o->order = (uint64_t)order++;
            o->rip = i_rip[id];
            o->addr = a;
            o->block = b & (FREED_BIT - 1);
            o->freed = (uint8_t)(b >> 31);
            o->size = i_size[id];
            o->kind = kind == 3 ? (uint8_t)(r ? 2 : 1) : kind;
            o->ilen = i_ilen[id];
            o->first = r ? 0 : i_first[id];
            memset(o->pad, 0, sizeof o->pad);
        }
    }
    state->seq = seq;
    state->next_order = order;
    return m;
}

/* --------------------------------------------------------- the namer */
typedef struct {            /* sorted [start, end) intervals, payload per interval */
    const uint64_t *start, *end;
    const int64_t *payload;
    int64_t n;
    int64_t last;           /* the interval the previous lookup found (locality) */
    uint64_t gap_lo, gap_hi;   /* [lo, hi): where the previous lookup found none */
} intervals_t;

typedef struct {            /* versions of the traced regions, each for a span of orders */
    const uint64_t *start, *end, *from, *to, *max_end;   /* max_end: of start[0..j] */
    const int64_t *payload;
    int64_t n;
    int64_t last;
} history_t;

enum { INST_CACHE_BITS = 10, INST_CACHE = 1 << INST_CACHE_BITS };

typedef struct {
    intervals_t objects, sections, maps;
    history_t history;
    const uint64_t *block_address;   /* by block id - 1 */
    const uint64_t *block_order;     /* when it was allocated */
    int64_t *block_region;           /* its region, once found (-1: not yet) */
    int64_t n_blocks;
    const uint8_t *object_is_variable;   /* by object payload: a DWARF variable */
    int64_t unmapped;                /* the region id of an address in no region */
    dense_t data, instructions;
    /* the instruction keys met last, direct-mapped (key + 1, 0: empty): a loop's
     * few instructions cost a compare each, not a hash lookup */
    uint64_t inst_cache_key[INST_CACHE];
    uint32_t inst_cache_id[INST_CACHE];
    /* per data id: loads, stores, bytes, and accesses to a freed block not made by
     * the allocator (after_free; counted by ap_count only) */
    int64_t *counts;
    int64_t counts_cap;
    int whole_objects;               /* ap_whole_objects */
} namer_t;

/* the index of the interval holding ``addr`` (-1: none): the last one found,
 * else the nearest starting at or before it, or the one before (nested) */
static inline int64_t find(intervals_t *t, uint64_t addr)
{
    if (t->n == 0)
        return -1;
    if (t->last >= 0 && addr >= t->start[t->last] && addr < t->end[t->last])
        return t->last;
    if (addr >= t->gap_lo && addr < t->gap_hi)
        return -1;
    int64_t lo = 0, hi = t->n;          /* first start > addr */
    while (lo < hi) {
        int64_t mid = (lo + hi) >> 1;
        if (t->start[mid] <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (int64_t j = lo - 1; j >= lo - 2 && j >= 0; j--)
        if (addr >= t->start[j] && addr < t->end[j]) {
            /* the locality cache only for intervals nothing nests in */
            if (j + 1 >= t->n || t->start[j + 1] >= t->end[j])
                t->last = j;
            return j;
        }
    /* none: every address up to the next start, past the two intervals looked
     * at, gets the same answer from the lines above */
    uint64_t lo_edge = 0;
    for (int64_t j = lo - 1; j >= lo - 2 && j >= 0; j--) {
        if (t->start[j] > lo_edge)
            lo_edge = t->start[j];
        if (t->end[j] > lo_edge)
            lo_edge = t->end[j];
    }
    t->gap_lo = lo_edge;
    t->gap_hi = lo < t->n ? t->start[lo] : UINT64_MAX;
    return -1;
}

static void set_intervals(intervals_t *t, const uint64_t *start, const uint64_t *end,
                          const int64_t *payload, int64_t n)
{
    t->start = start;
    t->end = end;
    t->payload = payload;
    t->n = n;
    t->last = -1;
    t->gap_lo = t->gap_hi = 0;
}

void *ap_namer_new(const uint64_t *o_start, const uint64_t *o_end, const int64_t *o_payload,
                   int64_t n_objects, const uint8_t *object_is_variable,
                   const uint64_t *s_start, const uint64_t *s_end, const int64_t *s_payload,
                   int64_t n_sections,
                   const uint64_t *m_start, const uint64_t *m_end, const int64_t *m_payload,
                   int64_t n_maps, int64_t unmapped,
                   const uint64_t *block_address, const uint64_t *block_order, int64_t n_blocks,
                   const uint64_t *h_start, const uint64_t *h_end, const uint64_t *h_from,
                   const uint64_t *h_to, const uint64_t *h_max_end, const int64_t *h_payload,
                   int64_t n_history)
{
    namer_t *nm = calloc(1, sizeof *nm);
    if (!nm)
        return NULL;
    set_intervals(&nm->objects, o_start, o_end, o_payload, n_objects);
    set_intervals(&nm->sections, s_start, s_end, s_payload, n_sections);
    set_intervals(&nm->maps, m_start, m_end, m_payload, n_maps);
    nm->history = (history_t){h_start, h_end, h_from, h_to, h_max_end, h_payload, n_history, -1};
    nm->object_is_variable = object_is_variable;
    nm->unmapped = unmapped;
    nm->block_address = block_address;
    nm->block_order = block_order;
    nm->n_blocks = n_blocks;
    nm->block_region = malloc((size_t)(n_blocks + 1) * sizeof *nm->block_region);
    if (nm->block_region)
        memset(nm->block_region, 0xff, (size_t)(n_blocks + 1) * sizeof *nm->block_region);
    if (!nm->block_region || dense_init(&nm->data) || dense_init(&nm->instructions)) {
        free(nm->block_region);
        dense_free(&nm->data);
        dense_free(&nm->instructions);
        free(nm);
        return NULL;
    }
    return nm;
}

void ap_namer_free(void *p)
{
    namer_t *nm = p;
    if (!nm)
        return;
    dense_free(&nm->data);
    dense_free(&nm->instructions);
    free(nm->counts);
    free(nm->block_region);
    free(nm);
}

/*
 * The data key of an access (access_names.py decodes it):
 *   bits 62-63: 0 a bare region, 1 a heap block, 2 a DWARF variable, 3 an ELF object
 *   bare region: bits 0-31 the region;
 *   heap block: bits 0-31 the block id << 1 | freed, 32-61 the region;
 *   DWARF variable: bits 0-31 the offset in it, 32-61 the object;
 *   ELF object: bits 32-61 the object.
 */
#define KEY(kind, hi, lo) (((uint64_t)(kind) << 62) | ((uint64_t)(hi) << 32) | (uint64_t)(uint32_t)(lo))

static inline int in_version(const history_t *h, int64_t j, uint64_t addr, uint64_t order)
{
    return addr >= h->start[j] && addr < h->end[j] && order >= h->from[j] && order < h->to[j];
}

/* the version of a traced region holding ``addr`` at ``order`` (-1: none) */
static inline int64_t find_version(history_t *h, uint64_t addr, uint64_t order)
{
    if (h->n == 0)
        return -1;
    if (h->last >= 0 && in_version(h, h->last, addr, order))
        return h->last;
    int64_t lo = 0, hi = h->n;          /* first start > addr */
    while (lo < hi) {
        int64_t mid = (lo + hi) >> 1;
        if (h->start[mid] <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (int64_t j = lo - 1; j >= 0 && h->max_end[j] > addr; j--)
        if (in_version(h, j, addr, order)) {
            h->last = j;
            return j;
        }
    return -1;
}

/* the region of an address at an order: a module's section, else the traced
 * region's version then, else the mapping of the last memory map */
static inline int64_t region_of(namer_t *nm, uint64_t addr, uint64_t order)
{
    int64_t j = find(&nm->sections, addr);
    if (j >= 0)
        return nm->sections.payload[j];
    j = find_version(&nm->history, addr, order);
    if (j >= 0)
        return nm->history.payload[j];
    j = find(&nm->maps, addr);
    return j >= 0 ? nm->maps.payload[j] : nm->unmapped;
}

static int grow_counts(namer_t *nm, int64_t d)
{
    int64_t cap = nm->counts_cap ? nm->counts_cap * 2 : 1024;
    while (cap <= d)
        cap *= 2;
    int64_t *c = realloc(nm->counts, (size_t)cap * NCOUNT * sizeof *c);
    if (!c)
        return -1;
    memset(c + nm->counts_cap * NCOUNT, 0, (size_t)(cap - nm->counts_cap) * NCOUNT * sizeof *c);
    nm->counts = c;
    nm->counts_cap = cap;
    return 0;
}

/* the data key of an access (see KEY) to ``addr`` at ``order``, in heap block
 * ``block`` (0: none; ``freed``: after its release) */
static inline uint64_t data_key_of(namer_t *nm, uint32_t block, int freed, uint64_t addr,
                                   uint64_t order)
{
    if (block > 0 && (int64_t)block <= nm->n_blocks) {
        int64_t region = nm->block_region[block];
        if (region < 0)         /* a block's region: where it was when allocated */
            region = nm->block_region[block] =
                region_of(nm, nm->block_address[block - 1], nm->block_order[block - 1]);
        return KEY(1, region, ((uint64_t)block << 1) | (freed != 0));
    }
    int64_t j = find(&nm->objects, addr);
    if (j >= 0) {
        int64_t obj = nm->objects.payload[j];
        if (!nm->object_is_variable[obj])
            return KEY(3, obj, 0);
        return KEY(2, obj, nm->whole_objects ? 0 : addr - nm->objects.start[j]);
    }
    return KEY(0, 0, region_of(nm, addr, order));
}

static inline uint64_t data_key(namer_t *nm, const access_t *r)
{
    return data_key_of(nm, r->block, r->freed, r->addr, r->order);
}

/* the dense instruction id of ``ikey`` (rip ^ size << 48), through the cache of
 * the keys met last; -1: no memory */
static inline int64_t instruction_id(namer_t *nm, uint64_t ikey)
{
    uint64_t slot = (ikey * 0x9e3779b97f4a7c15ULL) >> (64 - INST_CACHE_BITS);
    if (nm->inst_cache_key[slot] == ikey + 1)
        return nm->inst_cache_id[slot];
    int64_t k = dense_id(&nm->instructions, ikey);
    if (k >= 0) {
        nm->inst_cache_key[slot] = ikey + 1;
        nm->inst_cache_id[slot] = (uint32_t)k;
    }
    return k;
}

/* the dense data id of ``key`` into ``*d``, through the key met last (``*last_key``),
 * its counts' room made; 0, -1: no memory */
static inline int data_id_of(namer_t *nm, uint64_t key, uint64_t *last_key, int64_t *d)
{
    if (key == *last_key)
        return 0;
    *d = dense_id(&nm->data, key);
    if (*d < 0)
        return -1;
    *last_key = key;
    return *d >= nm->counts_cap ? grow_counts(nm, *d) : 0;
}

/* name ``n`` rows: data ids, and instruction ids unless ``inst_id`` is NULL */
static int name_rows(namer_t *nm, const access_t *rows, int64_t n, uint32_t *data_id,
                     uint32_t *inst_id)
{
    uint64_t last_key = UINT64_MAX, last_ikey = UINT64_MAX;
    int64_t d = -1, k = -1;
    for (int64_t i = 0; i < n; i++) {
        const access_t *r = &rows[i];
        if (data_id_of(nm, data_key(nm, r), &last_key, &d))
            return -1;
        if (inst_id) {
            uint64_t ikey = r->rip ^ ((uint64_t)r->size << 48);
            if (ikey != last_ikey) {
                k = instruction_id(nm, ikey);
                if (k < 0)
                    return -1;
                last_ikey = ikey;
            }
            inst_id[i] = (uint32_t)k;
        }
        nm->counts[d * NCOUNT + (r->kind == 1 ? 0 : 1)] += 1;
        nm->counts[d * NCOUNT + 2] += r->size;
        data_id[i] = (uint32_t)d;
    }
    return 0;
}

typedef struct {           /* numpy EVENT_DTYPE (replay.py) */
    int64_t call_id, ref;
    uint64_t tsc;
    int32_t fid, depth;
    uint8_t type, fate;
    uint8_t pad[6];
} event_t;

_Static_assert(sizeof(event_t) == 40, "EVENT_DTYPE is 40 bytes");

enum { EV_ACCESS = 2 };
enum { FLAG_STORE = 1, FLAG_FIRST = 2, FLAG_ALLOCATOR = 4 };   /* columnar.py */

/*
 * The store's access rows of one chunk of the segmentation (segmentation.py):
 * ``rows`` (n accesses, the first of index ``access_start`` in its thread),
 * ``events`` (the chunk's events: its ACCESS events are the rows' calls, in
 * order), ``span_begin``/``span_end`` (sorted orders of the thread's allocator
 * calls: an access inside one is the allocator's).  Writes the columns of
 * columnar.py's access_rows; returns 0, -1 when memory ran out, -2 when the
 * events do not match the rows.
 */
int ap_rows(void *p, const access_t *rows, int64_t n, int64_t access_start,
            const event_t *events, int64_t n_events,
            const uint64_t *span_begin, const uint64_t *span_end, int64_t n_spans,
            int64_t *pos, int64_t *seq, uint64_t *order, int64_t *call_id, int32_t *fid,
            uint32_t *inst_id, uint32_t *data_id, uint64_t *addr, uint8_t *flags)
{
    if (name_rows(p, rows, n, data_id, inst_id))
        return -1;
    int64_t e = 0, span = 0;
    for (int64_t i = 0; i < n; i++) {
        const access_t *r = &rows[i];
        if (events) {
            while (e < n_events && events[e].type != EV_ACCESS)
                e++;
            if (e == n_events)
                return -2;
            call_id[i] = events[e].call_id;
            fid[i] = events[e].fid;
            e++;
        } else {            /* a thread without call records: outside every call */
            call_id[i] = -1;
            fid[i] = -1;
        }
        seq[i] = (int64_t)r->seq;
        pos[i] = access_start + i + (int64_t)r->seq;
        order[i] = r->order;
        addr[i] = r->addr;
        uint8_t f = (uint8_t)((r->kind == 1 ? 0 : FLAG_STORE) | (r->first ? FLAG_FIRST : 0));
        if (in_span(span_begin, span_end, n_spans, &span, r->order))
            f |= FLAG_ALLOCATOR;
        flags[i] = f;
    }
    return 0;
}

/* the data ids of ``n`` access rows (as ap_rows gives them) into ``data_id``: what
 * a reader of a thread without call records needs; 0, -1 when memory ran out */
int ap_data_ids(void *p, const access_t *rows, int64_t n, uint32_t *data_id)
{
    return name_rows(p, rows, n, data_id, NULL);
}

/*
 * The records of one block (ap_decode's arguments) decoded a tile at a time
 * into a buffer that stays in the cache, each tile's rows handed to ``use`` in
 * order.  Every record's instruction id is checked first: -2 with ``*bad_id``
 * for an unknown one (nothing handed, the state unchanged).  Returns 0, or the
 * first nonzero answer of ``use`` (the state then unchanged).
 */
int ap_decode_tiles(const compact_block_t *b, decode_state_t *state, int64_t *bad_id,
                    tile_use_t use, void *ctx)
{
    enum { TILE = 512 };
    access_t rows[2 * TILE];
    uint8_t tile[TILE * REC_SIZE];
    if (!ids_known(b->data, b->n, b->planes, b->n_inst, bad_id))
        return -2;
    decode_state_t s = *state;
    for (int64_t first = 0; first < b->n; first += TILE) {
        int64_t m = b->n - first < TILE ? b->n - first : TILE;
        const uint8_t *src = tile_records(b->data, b->n, b->planes, first, m, tile);
        int64_t got = ap_decode(src, m, 0, b->rip, b->size, b->kind, b->ilen, b->first, b->n_inst,
                                &s, rows, bad_id);
        if (got < 0)
            return -2;
        int rc = use(ctx, rows, got);
        if (rc)
            return rc;
    }
    *state = s;
    return 0;
}

/*
 * ap_rows for the compact records of one block (ap_decode's arguments) of a
 * thread without call records: the columns from ``out_at`` on (room for 2n
 * rows); returns the rows written, -1 when memory ran out, -2 with ``*bad_id``
 * for an unknown instruction id (nothing written, the state unchanged).
 *
 * What ap_decode, name_rows and ap_rows do, in one loop over each tile of
 * records, without the access rows between them: the store's largest pass.
 * The same rows, names and counts as those three on the decoded rows
 * (tests/test_store.py compares them).
 */
int64_t ap_rows_compact(void *p, const uint8_t *data, int64_t n, int planes,
                        const uint64_t *i_rip, const uint16_t *i_size, const uint8_t *i_kind,
                        const uint8_t *i_ilen, const uint8_t *i_first, int64_t n_inst,
                        decode_state_t *state, int64_t access_start,
                        const uint64_t *span_begin, const uint64_t *span_end, int64_t n_spans,
                        int64_t *pos, int64_t *seq, uint64_t *order, int64_t *call_id,
                        int32_t *fid, uint32_t *inst_id, uint32_t *data_id, uint64_t *addr,
                        uint8_t *flags, int64_t *bad_id)
{
    enum { TILE = 512 };
    uint8_t tile[TILE * REC_SIZE];
    namer_t *nm = p;
    (void)i_ilen;
    if (!ids_known(data, n, planes, n_inst, bad_id))
        return -2;
    uint64_t s = state->seq;
    int64_t next = state->next_order;
    uint64_t last_key = UINT64_MAX;
    int64_t last_inst = -1, d = -1, k = -1, span = 0, m = 0;
    for (int64_t first = 0; first < n; first += TILE) {
        int64_t count = n - first < TILE ? n - first : TILE;
        const uint8_t *rec = tile_records(data, n, planes, first, count, tile);
        for (int64_t i = 0; i < count; i++, rec += REC_SIZE) {
            uint64_t a;
            uint32_t id, b;
            uint8_t kind;
            if (!read_access(rec, i_kind, &s, &next, &a, &id, &b, &kind))
                continue;
            if ((int64_t)id != last_inst) {
                k = instruction_id(nm, i_rip[id] ^ ((uint64_t)i_size[id] << 48));
                if (k < 0)
                    return -1;
                last_inst = id;
            }
            uint32_t block = b & (FREED_BIT - 1);
            int freed = (int)(b >> 31);
            uint16_t size = i_size[id];
            int rows = kind == 3 ? 2 : 1;
            for (int r = 0; r < rows; r++) {
                uint64_t o = (uint64_t)next++;
                if (data_id_of(nm, data_key_of(nm, block, freed, a, o), &last_key, &d))
                    return -1;
                int store = kind == 2 || r == 1;
                nm->counts[d * NCOUNT + store] += 1;
                nm->counts[d * NCOUNT + 2] += size;
                uint8_t f = (uint8_t)((store ? FLAG_STORE : 0) | (!r && i_first[id] ? FLAG_FIRST : 0));
                if (in_span(span_begin, span_end, n_spans, &span, o))
                    f |= FLAG_ALLOCATOR;
                pos[m] = access_start + m + (int64_t)s;
                seq[m] = (int64_t)s;
                order[m] = o;
                call_id[m] = -1;
                fid[m] = -1;
                inst_id[m] = (uint32_t)k;
                data_id[m] = (uint32_t)d;
                addr[m] = a;
                flags[m] = f;
                m++;
            }
        }
    }
    state->seq = s;
    state->next_order = next;
    return m;
}

/* the keys of the data ids (``which`` 0) or of the instruction ids (1) from
 * ``first`` on, into ``out`` (room for all); returns how many ids there are */
int64_t ap_keys(void *p, int which, int64_t first, uint64_t *out)
{
    namer_t *nm = p;
    dense_t *d = which ? &nm->instructions : &nm->data;
    if (out && first < d->n)
        memcpy(out, d->order + first, (size_t)(d->n - first) * sizeof *out);
    return d->n;
}

/* loads, stores, bytes and after_free of each data id (NCOUNT per id) into ``out`` */
int64_t ap_counts(void *p, int64_t *out)
{
    namer_t *nm = p;
    memset(out, 0, (size_t)nm->data.n * NCOUNT * sizeof *out);
    int64_t have = nm->data.n < nm->counts_cap ? nm->data.n : nm->counts_cap;
    if (have > 0)
        memcpy(out, nm->counts, (size_t)have * NCOUNT * sizeof *out);
    return nm->data.n;
}

/*
 * The counts of ``n`` access rows (no ids out): what a summary needs, without
 * a store.  ``span_begin``/``span_end``: the thread's allocator calls.
 */
int ap_count_rows(void *p, const access_t *rows, int64_t n, const uint64_t *span_begin,
                  const uint64_t *span_end, int64_t n_spans)
{
    namer_t *nm = p;
    enum { TILE = 1024 };
    uint32_t data_id[TILE];
    int64_t span = 0;
    for (int64_t first = 0; first < n; first += TILE) {
        int64_t m = n - first < TILE ? n - first : TILE;
        if (name_rows(nm, rows + first, m, data_id, NULL))
            return -1;
        for (int64_t i = 0; i < m; i++) {
            const access_t *r = &rows[first + i];
            if (r->freed && !in_span(span_begin, span_end, n_spans, &span, r->order))
                nm->counts[(int64_t)data_id[i] * NCOUNT + 3] += 1;
        }
    }
    return 0;
}

static inline void add_counts(namer_t *nm, int64_t d, int64_t loads, int64_t stores,
                              int64_t bytes, int64_t after_free)
{
    int64_t *c = &nm->counts[d * NCOUNT];
    c[0] += loads;
    c[1] += stores;
    c[2] += bytes;
    c[3] += after_free;
}

/*
 * The counts of one block of compact records (ap_decode's arguments) in one
 * loop: decoded a tile of records at a time and named, without access rows
 * (the summary's pass: a variable counted as a whole, see ap_whole_objects).
 * Returns 0, -1 when memory ran out, -2 with ``*bad_id`` for an unknown
 * instruction id.
 */
int ap_count_compact(void *p, const uint8_t *data, int64_t n, int planes,
                     const uint64_t *i_rip, const uint16_t *i_size, const uint8_t *i_kind,
                     const uint8_t *i_ilen, const uint8_t *i_first, int64_t n_inst,
                     decode_state_t *state, const uint64_t *span_begin,
                     const uint64_t *span_end, int64_t n_spans, int64_t *bad_id)
{
    enum { TILE = 512 };
    uint8_t tile[TILE * REC_SIZE];
    namer_t *nm = p;
    (void)i_rip, (void)i_ilen, (void)i_first;
    if (!ids_known(data, n, planes, n_inst, bad_id))
        return -2;
    uint64_t s = state->seq;
    int64_t next = state->next_order;
    uint64_t last_key = UINT64_MAX;
    int64_t d = -1, span = 0;
    /* the counts of the data id met last, in registers: consecutive accesses to
     * one variable would otherwise wait on each other's stores to its counts */
    int64_t held = -1, loads = 0, stores = 0, bytes = 0, after_free = 0;
    for (int64_t first = 0; first < n; first += TILE) {
        int64_t count = n - first < TILE ? n - first : TILE;
        const uint8_t *rec = tile_records(data, n, planes, first, count, tile);
        for (int64_t i = 0; i < count; i++, rec += REC_SIZE) {
            uint64_t a;
            uint32_t id, b;
            uint8_t kind;
            if (!read_access(rec, i_kind, &s, &next, &a, &id, &b, &kind))
                continue;
            uint32_t block = b & (FREED_BIT - 1);
            int freed = (int)(b >> 31);
            int64_t size = i_size[id];
            int rows = kind == 3 ? 2 : 1;
            for (int r = 0; r < rows; r++) {
                uint64_t o = (uint64_t)next++;
                if (data_id_of(nm, data_key_of(nm, block, freed, a, o), &last_key, &d))
                    return -1;
                if (d != held) {
                    if (held >= 0)
                        add_counts(nm, held, loads, stores, bytes, after_free);
                    loads = stores = bytes = after_free = 0;
                    held = d;
                }
                int64_t store = kind == 2 || r == 1;
                stores += store;
                loads += 1 - store;
                bytes += size;
                if (freed && !in_span(span_begin, span_end, n_spans, &span, o))
                    after_free++;
            }
        }
    }
    if (held >= 0)
        add_counts(nm, held, loads, stores, bytes, after_free);
    state->seq = s;
    state->next_order = next;
    return 0;
}

/* ``on``: a variable's accesses go to one data id, whatever their offset in it
 * (counts per variable, not per field: the summary's) */
void ap_whole_objects(void *p, int on)
{
    ((namer_t *)p)->whole_objects = on;
}

/* ------------------------------------------------------------- tallies */
void *tl_new(int64_t width)
{
    tally_t *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    if (dense_init(&t->keys)) {
        dense_free(&t->keys);
        free(t);
        return NULL;
    }
    t->width = width;
    return t;
}

void tl_free(void *p)
{
    tally_t *t = p;
    if (!t)
        return;
    dense_free(&t->keys);
    free(t->sums);
    free(t->first);
    free(t);
}

/* add ``n`` rows: ``keys``, the columns ``cols`` (``ncols`` <= width pointers to
 * int64 arrays; NULL entries add 1 to their column), the first row at ``base`` */
int tl_add(void *p, const uint64_t *keys, int64_t n, const int64_t *const *cols, int64_t ncols,
           int64_t base)
{
    tally_t *t = p;
    int64_t *row = NULL;
    for (int64_t i = 0; i < n; i++) {
        if (!row || keys[i] != keys[i - 1]) {
            row = tally_row(t, keys[i], base + i);
            if (!row)
                return -1;
        }
        for (int64_t c = 0; c < ncols; c++)
            row[c] += cols[c] ? cols[c][i] : 1;
    }
    return 0;
}

/* how many keys; with the outputs, the keys, their sums (width each) and first positions */
int64_t tl_dump(void *p, uint64_t *keys, int64_t *sums, int64_t *first)
{
    tally_t *t = p;
    int64_t n = t->keys.n;
    if (keys)
        memcpy(keys, t->keys.order, (size_t)n * sizeof *keys);
    if (sums && n)
        memcpy(sums, t->sums, (size_t)(n * t->width) * sizeof *sums);
    if (first && n)
        memcpy(first, t->first, (size_t)n * sizeof *first);
    return n;
}
