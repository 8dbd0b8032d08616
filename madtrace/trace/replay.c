// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * The frame rules of madtrace's call records, in C: the one place that decides
 * which dynamic call every call record and every data access belongs to.
 *
 * Input, per thread and in order: call records (u64 tsc, u32 code, u32 rsp
 * relative to the thread's first record, see madtrace/trace/segmentation.py)
 * and the "seq" (and size) of each data access (the access lies between
 * record seq-1 and record seq).  Output: one ordered stream of events,
 * BEGIN (an entry record opened a call), END (a call closed: completed by its
 * exit record, unwound by a longjmp, an enclosed tail frame ending with its
 * frame, or still open when the thread's records end) and ACCESS (with the
 * innermost open call), and for each END one segment row (the whole call).
 *
 * The rules (the same words as madtrace/analysis/calltree.py's docstring):
 *  - an entry record at rsp R below the top frame's rsp opens a frame;
 *  - an exit record with the top frame's exit code and rsp closes it, completed;
 *  - any other exit closes the frames deeper than R, then looks among the
 *    frames at exactly R for one expecting this exit code: found, it and the
 *    frames above it close (it completed); not found, the exit is "unmatched"
 *    (tracing began inside that call) and the frames at R close;
 *  - any other entry: a call site at R proves every frame with rsp <= R over,
 *    an entry or tail site every frame with rsp < R; a tail frame pushed on a
 *    frame with the same rsp is "enclosed" and ends with (and shares the fate
 *    of) that frame;
 *  - a frame closed without its own exit record was unwound (longjmp) if it is
 *    a call or entry frame, completed if it is a free tail frame.
 *
 * Called through ctypes by madtrace/trace/replay.py only; built by the
 * Makefile into build/native/libmtreplay.so.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { KIND_CALL, KIND_ENTRY, KIND_TAIL_ENCLOSED, KIND_TAIL_FREE, KIND_ROOT };
enum { FATE_COMPLETED = 0, FATE_UNWOUND = 1, FATE_OPEN = 2, FATE_UNMATCHED = 3 };
enum { EV_BEGIN = 0, EV_END = 1, EV_ACCESS = 2 };
#define NO_EXIT (-1)
#define SENTINEL_RSP ((int64_t)1 << 40)

typedef struct {           /* numpy RECORD_DTYPE */
    uint64_t tsc;
    uint32_t code;
    uint32_t rsp;
} record_t;

typedef struct {           /* numpy EVENT_DTYPE (replay.py) */
    int64_t call_id;       /* -1: outside every traced call (accesses) */
    int64_t ref;           /* BEGIN/END: record position; ACCESS: access index */
    uint64_t tsc;          /* BEGIN/END: the record's tsc (END of an open call: the last) */
    int32_t fid;
    int32_t depth;         /* 1 = outermost traced frame; ACCESS: depth of its call */
    uint8_t type;
    uint8_t fate;
    uint8_t pad[6];
} event_t;

typedef struct {           /* numpy SEGMENT_DTYPE (replay.py) */
    int64_t call_id, parent_id, begin_seq, end_seq;
    uint64_t begin_tsc, end_tsc;
    int64_t accesses_self, accesses_incl, bytes_self, bytes_incl;
    int64_t accesses_before;   /* the thread's accesses before it began */
    int32_t fid, depth;
    uint8_t fate, outer;
    uint8_t pad[6];
} segment_t;

typedef struct {
    int64_t rsp, call_id, begin_seq;
    uint64_t begin_tsc;
    int64_t acc_at_begin, bytes_at_begin, acc_self, bytes_self;
    int32_t exit_code, fid;
    uint8_t kind, outer, fate;
} frame_t;

typedef struct {
    /* tables */
    int32_t *code_fid, *code_exit;
    uint8_t *code_kind;
    int64_t n_codes, n_fids;
    int32_t *fid_active;
    /* state */
    frame_t *stack;        /* stack[0]: the sentinel */
    int64_t depth, cap;    /* frames above the sentinel, allocated frames */
    int64_t records, next_call, accesses, bytes;
    uint32_t base;
    int has_base;
    uint64_t first_tsc, last_tsc;
    int64_t entries, exits, unmatched, unwound, closed;
    /* output of the current call */
    event_t *ev;
    int64_t n_ev, ev_cap;
    segment_t *seg;
    int64_t n_seg, seg_cap;
} replay_t;

size_t rp_event_size(void) { return sizeof(event_t); }
size_t rp_segment_size(void) { return sizeof(segment_t); }

replay_t *rp_new(const int32_t *code_fid, const int32_t *code_exit, const uint8_t *code_kind,
                 int64_t n_codes, int64_t n_fids, int64_t first_call)
{
    replay_t *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->n_codes = n_codes;
    s->n_fids = n_fids;
    s->code_fid = malloc(sizeof(int32_t) * (n_codes ? n_codes : 1));
    s->code_exit = malloc(sizeof(int32_t) * (n_codes ? n_codes : 1));
    s->code_kind = malloc(n_codes ? n_codes : 1);
    s->fid_active = calloc(n_fids ? n_fids : 1, sizeof(int32_t));
    s->cap = 64;
    s->stack = malloc(sizeof(frame_t) * s->cap);
    if (!s->code_fid || !s->code_exit || !s->code_kind || !s->fid_active || !s->stack) {
        free(s->code_fid); free(s->code_exit); free(s->code_kind); free(s->fid_active);
        free(s->stack); free(s);
        return NULL;
    }
    memcpy(s->code_fid, code_fid, sizeof(int32_t) * n_codes);
    memcpy(s->code_exit, code_exit, sizeof(int32_t) * n_codes);
    memcpy(s->code_kind, code_kind, n_codes);
    memset(&s->stack[0], 0, sizeof(frame_t));
    s->stack[0].rsp = SENTINEL_RSP;
    s->stack[0].call_id = -1;
    s->stack[0].fid = -1;
    s->stack[0].exit_code = NO_EXIT;
    s->stack[0].kind = KIND_ROOT;
    s->next_call = first_call;
    return s;
}

void rp_free(replay_t *s)
{
    if (!s)
        return;
    free(s->code_fid); free(s->code_exit); free(s->code_kind); free(s->fid_active);
    free(s->stack); free(s);
}

/* counters: records, entries, exits, unmatched exits, unwound frames, open
 * frames (depth), first tsc, last tsc, next call id, accesses, bytes, closed */
void rp_stats(const replay_t *s, int64_t *out)
{
    out[0] = s->records; out[1] = s->entries; out[2] = s->exits; out[3] = s->unmatched;
    out[4] = s->unwound; out[5] = s->depth; out[6] = (int64_t)s->first_tsc;
    out[7] = (int64_t)s->last_tsc; out[8] = s->next_call; out[9] = s->accesses;
    out[10] = s->bytes; out[11] = s->closed;
}

int64_t rp_depth(const replay_t *s) { return s->depth; }

static void emit_end(replay_t *s, const frame_t *f, int64_t depth, int64_t ref, uint64_t tsc)
{
    event_t *e = &s->ev[s->n_ev++];
    segment_t *g = &s->seg[s->n_seg++];
    e->call_id = f->call_id; e->ref = ref; e->tsc = tsc; e->fid = f->fid;
    e->depth = (int32_t)depth; e->type = EV_END; e->fate = f->fate;
    memset(e->pad, 0, sizeof(e->pad));
    g->call_id = f->call_id; g->parent_id = s->stack[depth - 1].call_id;
    g->begin_seq = f->begin_seq; g->end_seq = ref;
    g->begin_tsc = f->begin_tsc; g->end_tsc = tsc;
    g->accesses_self = f->acc_self; g->accesses_incl = s->accesses - f->acc_at_begin;
    g->bytes_self = f->bytes_self; g->bytes_incl = s->bytes - f->bytes_at_begin;
    g->accesses_before = f->acc_at_begin;
    g->fid = f->fid; g->depth = (int32_t)depth; g->fate = f->fate; g->outer = f->outer;
    memset(g->pad, 0, sizeof(g->pad));
    if (f->fid >= 0 && f->fid < s->n_fids)
        s->fid_active[f->fid]--;
    s->closed++;
}

/* An exit record that matches no open frame: the call began before tracing
 * did (attach).  It becomes a segment of its own (fate "unmatched") with an
 * unknown beginning (begin_seq -1, begin_tsc the thread's first record); the
 * accesses it made before were attributed to the frame then innermost. */
static void emit_unmatched(replay_t *s, uint32_t c, uint64_t t)
{
    frame_t *top = &s->stack[s->depth];
    event_t *e = &s->ev[s->n_ev++];
    segment_t *g = &s->seg[s->n_seg++];
    int32_t fid = s->code_fid[c];
    e->call_id = s->next_call; e->ref = s->records; e->tsc = t; e->fid = fid;
    e->depth = (int32_t)s->depth + 1; e->type = EV_END; e->fate = FATE_UNMATCHED;
    memset(e->pad, 0, sizeof(e->pad));
    g->call_id = s->next_call++; g->parent_id = top->call_id;
    g->begin_seq = -1; g->end_seq = s->records;
    g->begin_tsc = s->first_tsc; g->end_tsc = t;
    g->accesses_self = g->accesses_incl = g->bytes_self = g->bytes_incl = 0;
    g->accesses_before = s->accesses;
    g->fid = fid; g->depth = (int32_t)s->depth + 1; g->fate = FATE_UNMATCHED;
    g->outer = !(fid >= 0 && fid < s->n_fids && s->fid_active[fid]);
    memset(g->pad, 0, sizeof(g->pad));
}

/* Close stack[k..depth] at record position ref, time t.  bottom_fate < 0: the
 * bottom frame's fate follows from its kind.  Fates are decided bottom-up
 * (enclosed tail frames share the fate of the frame below), ENDs are emitted
 * top-down (the innermost call ends first). */
static void close_from(replay_t *s, int64_t k, int bottom_fate, int64_t ref, uint64_t t)
{
    int fate = FATE_COMPLETED;
    for (int64_t j = k; j <= s->depth; j++) {
        frame_t *f = &s->stack[j];
        if (j == k && bottom_fate >= 0)
            fate = bottom_fate;
        else if (f->kind == KIND_TAIL_ENCLOSED && j > k)
            ;
        else if (f->kind == KIND_CALL || f->kind == KIND_ENTRY)
            fate = FATE_UNWOUND;
        else
            fate = FATE_COMPLETED;
        f->fate = (uint8_t)fate;
        if (fate == FATE_UNWOUND)
            s->unwound++;
    }
    for (int64_t j = s->depth; j >= k; j--)
        emit_end(s, &s->stack[j], j, ref, t);
    s->depth = k - 1;
}

static int push(replay_t *s, int64_t r, uint32_t code, int kind, uint64_t t)
{
    if (s->depth + 1 >= s->cap) {
        int64_t cap = s->cap * 2;
        frame_t *grown = realloc(s->stack, sizeof(frame_t) * cap);
        if (!grown)
            return -1;
        s->stack = grown;
        s->cap = cap;
    }
    frame_t *parent = &s->stack[s->depth];
    frame_t *f = &s->stack[++s->depth];
    int32_t fid = s->code_fid[code];
    f->rsp = r; f->call_id = s->next_call++; f->begin_seq = s->records;
    f->begin_tsc = t; f->acc_at_begin = s->accesses; f->bytes_at_begin = s->bytes;
    f->acc_self = 0; f->bytes_self = 0; f->exit_code = s->code_exit[code]; f->fid = fid;
    f->kind = (uint8_t)kind; f->fate = FATE_OPEN;
    f->outer = 1;
    if (fid >= 0 && fid < s->n_fids) {
        f->outer = s->fid_active[fid] == 0;
        s->fid_active[fid]++;
    }
    (void)parent;
    event_t *e = &s->ev[s->n_ev++];
    e->call_id = f->call_id; e->ref = s->records; e->tsc = t; e->fid = fid;
    e->depth = (int32_t)s->depth; e->type = EV_BEGIN; e->fate = FATE_OPEN;
    memset(e->pad, 0, sizeof(e->pad));
    return 0;
}

static int exit_slow(replay_t *s, uint32_t c, int64_t r, uint64_t t)
{
    int64_t k = s->depth + 1;
    while (s->stack[k - 1].rsp < r)      /* deeper frames: abandoned */
        k--;
    int64_t j = k - 1;
    while (s->stack[j].rsp == r) {
        if (s->stack[j].exit_code == (int32_t)c) {
            close_from(s, j, FATE_COMPLETED, s->records, t);
            return 0;
        }
        j--;
    }
    s->unmatched++;
    if (j + 1 <= s->depth)
        close_from(s, j + 1, -1, s->records, t);
    emit_unmatched(s, c, t);
    return 0;
}

static int entry_slow(replay_t *s, uint32_t c, int64_t r, uint64_t t)
{
    int kind = s->code_kind[c];
    int64_t k = s->depth + 1;
    if (kind == KIND_CALL) {
        while (s->stack[k - 1].rsp <= r)
            k--;
    } else {
        while (s->stack[k - 1].rsp < r)
            k--;
    }
    if (k <= s->depth)
        close_from(s, k, -1, s->records, t);
    if (kind == KIND_TAIL_FREE && s->stack[s->depth].rsp == r)
        kind = KIND_TAIL_ENCLOSED;
    return push(s, r, c, kind, t);
}

static void access(replay_t *s, uint16_t size)
{
    frame_t *top = &s->stack[s->depth];
    event_t *e = &s->ev[s->n_ev++];
    e->call_id = top->call_id; e->ref = s->accesses; e->tsc = 0; e->fid = top->fid;
    e->depth = (int32_t)s->depth; e->type = EV_ACCESS; e->fate = 0;
    memset(e->pad, 0, sizeof(e->pad));
    top->acc_self++;
    top->bytes_self += size;
    s->accesses++;
    s->bytes += size;
}

/* Replay records[0..n_rec) and accesses[0..n_acc) (their seq and size) in
 * their exact order, writing events to ev[ev_cap] and segments to seg[seg_cap].
 * An access with seq q goes before record q.  Records are replayed only while
 * the accesses that precede them are known: the caller passes
 * accesses_final=1 once it has no more accesses, records_final=1 once it has
 * no more records (then every access given is consumed).  Stops early when
 * the output might not fit.  out[0] = records used, out[1] = accesses used,
 * out[2] = events written, out[3] = segments written.  Returns 0, or -1 when
 * memory ran out. */
int rp_run(replay_t *s, const record_t *rec, int64_t n_rec, const uint8_t *seq_at,
           int64_t seq_stride, const uint8_t *size_at, int64_t size_stride, int64_t n_acc,
           int records_final, int accesses_final,
           event_t *ev, int64_t ev_cap, segment_t *seg, int64_t seg_cap, int64_t *out)
{
/* the accesses' seq (u64) and size (u16), each ``stride`` bytes apart: fields of the
 * access rows as they are, or arrays of their own */
#define ACC_SEQ(k) (*(const uint64_t *)(const void *)(seq_at + (k) * seq_stride))
#define ACC_SIZE(k) (*(const uint16_t *)(const void *)(size_at + (k) * size_stride))
    int64_t i = 0, a = 0;
    s->ev = ev; s->ev_cap = ev_cap; s->n_ev = 0;
    s->seg = seg; s->seg_cap = seg_cap; s->n_seg = 0;
    int rc = 0;
    if (n_rec && !s->has_base) {
        s->base = (uint32_t)(rec[0].rsp - 0x80000000u);
        s->has_base = 1;
        s->first_tsc = s->last_tsc = rec[0].tsc;
    }
    for (;;) {
        /* the accesses before record s->records */
        while (a < n_acc && ACC_SEQ(a) <= (uint64_t)s->records && s->n_ev < ev_cap) {
            access(s, ACC_SIZE(a));
            a++;
        }
        if (s->n_ev >= ev_cap)
            break;
        if (i == n_rec) {
            if (records_final)
                while (a < n_acc && s->n_ev < ev_cap) {
                    access(s, ACC_SIZE(a));
                    a++;
                }
            break;
        }
        if (a == n_acc && !accesses_final)
            break;       /* an access still unknown may come before this record */
        if (s->n_ev + s->depth + 2 > ev_cap || s->n_seg + s->depth + 1 > seg_cap)
            break;
        const record_t *x = &rec[i];
        uint64_t t = x->tsc;
        uint32_t c = x->code;
        int64_t r = (int64_t)(uint32_t)(x->rsp - s->base);
        frame_t *top = &s->stack[s->depth];
        s->last_tsc = t;
        if (c & 1) {
            s->exits++;
            if ((int32_t)c == top->exit_code && r == top->rsp)
                close_from(s, s->depth, FATE_COMPLETED, s->records, t);
            else
                exit_slow(s, c, r, t);
        } else {
            s->entries++;
            if (r < top->rsp)
                rc = push(s, r, c, s->code_kind[c], t);
            else
                rc = entry_slow(s, c, r, t);
            if (rc)
                break;
        }
        s->records++;
        i++;
    }
    out[0] = i; out[1] = a; out[2] = s->n_ev; out[3] = s->n_seg;
    return rc;
}

/* The thread's records are over: END (open) for every frame still open,
 * innermost first, at position "records" and the last record's time. */
int64_t rp_finish(replay_t *s, event_t *ev, int64_t ev_cap, segment_t *seg, int64_t seg_cap)
{
    if (ev_cap < s->depth || seg_cap < s->depth)
        return -1;
    s->ev = ev; s->ev_cap = ev_cap; s->n_ev = 0;
    s->seg = seg; s->seg_cap = seg_cap; s->n_seg = 0;
    for (int64_t j = s->depth; j >= 1; j--) {
        s->stack[j].fate = FATE_OPEN;
        emit_end(s, &s->stack[j], j, s->records, s->last_tsc);
    }
    s->depth = 0;
    return s->n_ev;
}

/*
 * The calls table's columns of n segment rows, in one pass over them (column
 * by column, numpy read each field's strided values once per column: the
 * rows' 104 bytes each time, a fifth of a call-heavy store's build).  out: the
 * SEGMENT_COLUMNS arrays of replay.py, in that order.  begin_pos and end_pos
 * place a call in its thread's merged stream of records and accesses.
 */
void rp_segment_columns(const segment_t *s, int64_t n, void *const *out)
{
    int64_t *call_id = out[0], *parent_id = out[1], *begin_seq = out[2], *end_seq = out[3];
    int64_t *begin_pos = out[4], *end_pos = out[5];
    uint64_t *begin_tsc = out[6], *end_tsc = out[7];
    int64_t *acc_self = out[8], *acc_incl = out[9], *bytes_self = out[10], *bytes_incl = out[11];
    int32_t *fid = out[12], *depth = out[13], *fate = out[14];
    uint8_t *outer = out[15];
    for (int64_t i = 0; i < n; i++) {
        const segment_t *g = &s[i];
        call_id[i] = g->call_id;
        parent_id[i] = g->parent_id;
        begin_seq[i] = g->begin_seq;
        end_seq[i] = g->end_seq;
        begin_pos[i] = g->begin_seq < 0 ? -1 : g->begin_seq + g->accesses_before;
        end_pos[i] = g->end_seq + g->accesses_before + g->accesses_incl;
        begin_tsc[i] = g->begin_tsc;
        end_tsc[i] = g->end_tsc;
        acc_self[i] = g->accesses_self;
        acc_incl[i] = g->accesses_incl;
        bytes_self[i] = g->bytes_self;
        bytes_incl[i] = g->bytes_incl;
        fid[i] = g->fid;
        depth[i] = g->depth;
        fate[i] = g->fate;
        outer[i] = g->outer != 0;
    }
}
