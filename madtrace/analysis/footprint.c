// SPDX-License-Identifier: GPL-2.0-or-later
/* Footprint analysis core (madtrace/analysis/footprint.py drives it through
 * ctypes): distinct bytes, 64-byte lines and 4 KiB pages touched by every
 * dynamic call, inclusive and exclusive of its callees, for one thread's
 * ordered stream of BEGIN / END / ACCESS events (segmentation.py).
 *
 * Skadu's SlimTV, specialised to footprints.  Calls are numbered in the
 * order they begin, so the open calls (the stack) have increasing ids.  The
 * shadow memory keeps ONE value per unit (byte, line or page): the id of the
 * call that touched it last as the innermost call.  When call g (innermost,
 * at stack level d) touches unit x whose shadow value is s:
 *   - inclusive: the open calls that already have x are exactly those with
 *     id <= s (each began before the last touch and is still open, so that
 *     touch happened inside it); the others, levels k+1..d where level k is
 *     the deepest open call with id <= s (a binary search of the stack, the
 *     O(log depth) tag validation), get x: +1 at level d, -1 at level k,
 *     and a call's inclusive count is the sum of its level's counter and
 *     of its callees' (added when they end): O(1) per access, no vector;
 *   - exclusive (the units the call's own instructions touched): new when
 *     s != g.  For that to hold when a caller p becomes innermost again
 *     after a callee touched x, the callee that overwrote p's value (p still
 *     open) logs (x, p); when the callee ends, the value goes back to p if p
 *     is its direct caller, else the entry moves to the caller's log (the
 *     calls between stay open and must keep a value >= their ids, or they
 *     would count x again), until it reaches p's direct callee.
 * ACCESS events are loads and stores, or the ranges of block events (memcpy,
 * memset, system calls), of any size.
 * Memory: one int32 per unit touched by the thread (ids relative to the
 * thread's first call), in 256-unit blocks found by an open-addressing hash
 * table, plus per open call its counters and its undo log.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define GRANS 3                 /* bytes, lines, pages */
#define BLOCK_BITS 8
#define BLOCK_UNITS (1u << BLOCK_BITS)
#define NONE (-2)               /* never touched */
#define ROOT (-1)               /* outside every traced call */
#define EV_BEGIN 0
#define EV_END 1
#define EV_ACCESS 2

static const int SHIFT[GRANS] = {0, 6, 12};

typedef struct {
    uint64_t *keys;             /* block number + 1 (0: empty slot) */
    int32_t **blocks;
    size_t cap, used;
} shadow_t;

typedef struct {
    uint64_t unit;
    int32_t prior;
    uint8_t gran;
} undo_t;

typedef struct {
    int64_t call_id;            /* trace-wide id; -1 for the root */
    int32_t rel;                /* id relative to the thread's first call (ROOT for the root) */
    int32_t fid, depth;
    int64_t acc[GRANS];         /* inclusive counter of this level */
    int64_t self[GRANS];
    undo_t *log;
    size_t log_len, log_cap;
} frame_t;

typedef struct {
    shadow_t shadow[GRANS];
    frame_t *stack;
    size_t depth, cap;          /* stack[0] is the root */
    int32_t *ids;               /* rel ids of the stack, for the binary search */
    int64_t base;               /* call_id of the thread's first call, -1 unknown */
    int64_t error;              /* nonzero: 1 out of memory, 2 too many calls */
    size_t shadow_bytes, log_bytes, peak_log_bytes;
} fp_t;

/* one output row per ended call (and one for the root at fp_finish) */
typedef struct {
    int64_t call_id;
    int64_t fid, depth;
    int64_t incl[GRANS];
    int64_t self[GRANS];
} fp_row_t;

size_t fp_row_size(void) { return sizeof(fp_row_t); }

static uint64_t mix(uint64_t k) {
    k ^= k >> 33; k *= 0xff51afd7ed558ccdULL; k ^= k >> 33;
    return k;
}

static int shadow_grow(fp_t *fp, shadow_t *s) {
    size_t cap = s->cap ? s->cap * 2 : 1024;
    uint64_t *keys = calloc(cap, sizeof *keys);
    int32_t **blocks = calloc(cap, sizeof *blocks);
    if (!keys || !blocks) { free(keys); free(blocks); return -1; }
    for (size_t i = 0; i < s->cap; i++) {
        if (!s->keys[i]) continue;
        size_t j = mix(s->keys[i]) & (cap - 1);
        while (keys[j]) j = (j + 1) & (cap - 1);
        keys[j] = s->keys[i];
        blocks[j] = s->blocks[i];
    }
    fp->shadow_bytes += cap * (sizeof *keys + sizeof *blocks);
    fp->shadow_bytes -= s->cap * (sizeof *keys + sizeof *blocks);
    free(s->keys); free(s->blocks);
    s->keys = keys; s->blocks = blocks; s->cap = cap;
    return 0;
}

/* the shadow value of a unit (allocated as NONE on first use) */
static int32_t *shadow_slot(fp_t *fp, shadow_t *s, uint64_t unit) {
    uint64_t key = (unit >> BLOCK_BITS) + 1;
    if (s->used * 2 >= s->cap && shadow_grow(fp, s)) return NULL;
    size_t j = mix(key) & (s->cap - 1);
    while (s->keys[j] && s->keys[j] != key) j = (j + 1) & (s->cap - 1);
    if (!s->keys[j]) {
        int32_t *block = malloc(BLOCK_UNITS * sizeof *block);
        if (!block) return NULL;
        for (unsigned i = 0; i < BLOCK_UNITS; i++) block[i] = NONE;
        s->keys[j] = key;
        s->blocks[j] = block;
        s->used++;
        fp->shadow_bytes += BLOCK_UNITS * sizeof *block;
    }
    return &s->blocks[j][unit & (BLOCK_UNITS - 1)];
}

static void shadow_clear(shadow_t *s) {
    for (size_t i = 0; i < s->cap; i++) free(s->blocks[i]);
    free(s->keys); free(s->blocks);
    memset(s, 0, sizeof *s);
}

static int push(fp_t *fp, int64_t call_id, int32_t rel, int32_t fid, int32_t depth) {
    if (fp->depth == fp->cap) {
        size_t cap = fp->cap ? fp->cap * 2 : 64;
        frame_t *stack = realloc(fp->stack, cap * sizeof *stack);
        if (!stack) return -1;
        fp->stack = stack;
        int32_t *ids = realloc(fp->ids, cap * sizeof *ids);
        if (!ids) return -1;
        fp->ids = ids;
        fp->cap = cap;
    }
    frame_t *f = &fp->stack[fp->depth];
    memset(f, 0, sizeof *f);
    f->call_id = call_id; f->rel = rel; f->fid = fid; f->depth = depth;
    fp->ids[fp->depth] = rel;
    fp->depth++;
    return 0;
}

/* index of the deepest open call with id <= s, -1 for none */
static long deepest_at_most(const fp_t *fp, int32_t s) {
    long lo = 0, hi = (long)fp->depth;     /* first index with ids[i] > s */
    while (lo < hi) {
        long mid = (lo + hi) / 2;
        if (fp->ids[mid] <= s) lo = mid + 1; else hi = mid;
    }
    return lo - 1;
}

static int log_undo(fp_t *fp, frame_t *f, uint64_t unit, int32_t prior, int gran) {
    if (f->log_len == f->log_cap) {
        size_t cap = f->log_cap ? f->log_cap * 2 : 16;
        undo_t *log = realloc(f->log, cap * sizeof *log);
        if (!log) return -1;
        fp->log_bytes += (cap - f->log_cap) * sizeof *log;
        if (fp->log_bytes > fp->peak_log_bytes) fp->peak_log_bytes = fp->log_bytes;
        f->log = log; f->log_cap = cap;
    }
    f->log[f->log_len++] = (undo_t){unit, prior, (uint8_t)gran};
    return 0;
}

static int touch(fp_t *fp, int gran, uint64_t unit) {
    int32_t *slot = shadow_slot(fp, &fp->shadow[gran], unit);
    if (!slot) return -1;
    frame_t *top = &fp->stack[fp->depth - 1];
    int32_t s = *slot, g = top->rel;
    if (s == g) return 0;
    top->self[gran]++;
    if (s < g) {
        long k = deepest_at_most(fp, s);
        top->acc[gran]++;
        if (k >= 0) {
            fp->stack[k].acc[gran]--;
            if (fp->ids[k] == s && (size_t)k != fp->depth - 1 &&
                log_undo(fp, top, unit, s, gran)) return -1;
        }
    }
    *slot = g;
    return 0;
}

static void emit(frame_t *f, fp_row_t *row) {
    row->call_id = f->call_id; row->fid = f->fid; row->depth = f->depth;
    for (int g = 0; g < GRANS; g++) { row->incl[g] = f->acc[g]; row->self[g] = f->self[g]; }
}

/* the top frame ends: its counts go to its caller, its undo log is replayed */
static int pop(fp_t *fp, fp_row_t *row) {
    frame_t *f = &fp->stack[fp->depth - 1];
    emit(f, row);
    frame_t *parent = &fp->stack[fp->depth - 2];
    for (int g = 0; g < GRANS; g++) parent->acc[g] += f->acc[g];
    for (size_t i = f->log_len; i-- > 0;) {
        undo_t *u = &f->log[i];
        if (u->prior != parent->rel) {
            /* the value belongs to a caller further up: the calls in between are
             * still open and must keep seeing the unit as theirs (value >= their
             * ids), so it waits in the caller's log */
            if (log_undo(fp, parent, u->unit, u->prior, u->gran)) return -1;
            continue;
        }
        int32_t *slot = shadow_slot(fp, &fp->shadow[u->gran], u->unit);
        if (!slot) return -1;
        *slot = u->prior;
    }
    fp->log_bytes -= f->log_cap * sizeof *f->log;
    free(f->log);
    fp->depth--;
    return 0;
}

void fp_reset(fp_t *fp) {
    for (int g = 0; g < GRANS; g++) shadow_clear(&fp->shadow[g]);
    while (fp->depth > 0) free(fp->stack[--fp->depth].log);
    fp->shadow_bytes = fp->log_bytes = 0;
    fp->base = -1;
    fp->error = 0;
    push(fp, -1, ROOT, -1, 0);
}

fp_t *fp_new(void) {
    fp_t *fp = calloc(1, sizeof *fp);
    if (fp) fp_reset(fp);
    return fp;
}

void fp_free(fp_t *fp) {
    if (!fp) return;
    for (int g = 0; g < GRANS; g++) shadow_clear(&fp->shadow[g]);
    while (fp->depth > 0) free(fp->stack[--fp->depth].log);
    free(fp->stack); free(fp->ids); free(fp);
}

/* n events (types, call ids, fids, depths; addr/size for ACCESS events).  Rows
 * of the calls that ended go to out (room for out_cap: at most one per END
 * event).  Returns the rows written, or -1 (fp_error tells why). */
int64_t fp_run(fp_t *fp, int64_t n, const uint8_t *types, const int64_t *call_ids,
               const int32_t *fids, const int32_t *depths, const uint64_t *addrs,
               const uint64_t *sizes, fp_row_t *out, int64_t out_cap) {
    int64_t rows = 0;
    for (int64_t i = 0; i < n; i++) {
        if (types[i] == EV_BEGIN) {
            if (fp->base < 0) fp->base = call_ids[i];
            int64_t rel = call_ids[i] - fp->base;
            if (rel < 0 || rel > INT32_MAX - 1) { fp->error = 2; return -1; }
            if (push(fp, call_ids[i], (int32_t)rel, fids[i], depths[i])) { fp->error = 1; return -1; }
        } else if (types[i] == EV_END) {
            /* an exit whose call began before tracing did ends no open frame */
            if (fp->depth > 1 && fp->stack[fp->depth - 1].call_id == call_ids[i]) {
                if (rows >= out_cap) { fp->error = 3; return -1; }
                if (pop(fp, &out[rows++])) { fp->error = 1; return -1; }
            }
        } else {
            uint64_t first = addrs[i], last = addrs[i] + (sizes[i] ? sizes[i] : 1) - 1;
            for (int g = 0; g < GRANS; g++)
                for (uint64_t unit = first >> SHIFT[g]; unit <= last >> SHIFT[g]; unit++)
                    if (touch(fp, g, unit)) { fp->error = 1; return -1; }
        }
    }
    return rows;
}

/* the thread ends: the frames still open (none normally: the segmentation
 * ends them), then the root row (the thread's whole footprint) */
int64_t fp_finish(fp_t *fp, fp_row_t *out, int64_t out_cap) {
    int64_t rows = 0;
    while (fp->depth > 1) {
        if (rows >= out_cap - 1) { fp->error = 3; return -1; }
        if (pop(fp, &out[rows++])) { fp->error = 1; return -1; }
    }
    emit(&fp->stack[0], &out[rows++]);
    return rows;
}

int64_t fp_error(const fp_t *fp) { return fp->error; }
int64_t fp_depth(const fp_t *fp) { return (int64_t)fp->depth - 1; }

/* bytes held now: shadow blocks and tables, undo logs, the stack */
int64_t fp_memory(const fp_t *fp) {
    return (int64_t)(fp->shadow_bytes + fp->log_bytes + fp->cap * (sizeof(frame_t) + 4));
}

int64_t fp_peak_log(const fp_t *fp) { return (int64_t)fp->peak_log_bytes; }
