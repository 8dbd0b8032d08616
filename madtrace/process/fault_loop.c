// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * madtrace's data-access hot loop, in C (the fault path of both data engines).
 *
 * The Python data engine (madtrace/data/engine.py) decides everything once
 * per instruction: it decodes the faulting instruction, builds its stub in the
 * data area (layout: injector/layout.h) and registers it here with the
 * operand's addressing (base, index, scale, displacement, segment, size).
 * From then on each fault of that instruction is handled here, in one ptrace
 * stop: waitpid, GETSIGINFO, GETREGS, the effective address, one pread of the
 * operand's bytes into the thread's slot, one access record, rip := stub,
 * resume.  Stores are written back from the slots at the next stop (of any
 * thread) with one pwrite each.  Hybrid engine: an operand on aliased pages is
 * not copied; the slot gets its alias address and the thread the instruction's
 * alias stub, which accesses the memory itself (nothing to write back: code
 * reading the alias never waits for a stop).
 *
 * Anything else (another signal, a system call that is not in the safe set, a
 * ptrace event, an unknown instruction or thread, a slot in use) is handed
 * back to Python untouched: mt_wait returns the raw wait status.
 *
 * Built by the Makefile into build/native/libmtloop.so; used through ctypes by
 * madtrace/process/fastloop.py, the only caller.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/types.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "layout.h"

#define MT_PAGE 4096ULL
#define MAX_THREADS 1024
#define OPND_REG_NONE 0xff
#define OPND_REG_RIP 0xfe

/* one access record: madtrace/process/fastloop.py FAST_RECORD_DTYPE */
struct mt_access {
    uint64_t seq, order, rip, addr;
    uint32_t tid;
    uint16_t size;
    uint8_t kind, ilen, first, pad[7];
};

/* an instruction with a stub for one slot (key: rip, slot) */
struct mt_insn {
    uint64_t rip;          /* 0: empty */
    uint64_t stub;
    uint64_t alias_stub;   /* the stub on the operand's alias (0: none) */
    int64_t disp;
    uint32_t slot;
    uint16_t size;
    uint8_t base, index, scale, seg;  /* seg: 0 none, 1 fs, 2 gs */
    uint8_t kinds;                     /* bit 0 load, bit 1 store */
    uint8_t ilen;
    uint8_t addr32;
    uint8_t atomic;                    /* lock / xchg: only while single-threaded, or
                                          through the alias */
    uint8_t op;                        /* OP_*: how the access is carried out */
    uint8_t rep;                       /* string instructions: a rep prefix */
    uint32_t id, id2, id3;             /* ring mode: instruction ids of its records (string
                                          moves: id2 the store after the load, id3 a store
                                          alone) */
    uint16_t ask;                      /* nonzero (2^k - 1): every 2^k-th fault the loop meets
                                          goes to Python (mt_insn_ask) */
    uint16_t seen;
};

/* how an instruction's access is carried out */
enum {
    OP_REDIRECT = 0,   /* its stub for the thread's slot (the operand copied into the slot) */
    OP_JMP = 1,        /* jmp [mem]: rip := the loaded pointer */
    OP_CALL = 2,       /* call [mem]: push the return address, rip := the loaded pointer */
    OP_MOVS = 3,       /* (rep) movs: copied here, element by element semantics */
    OP_STOS = 4,       /* (rep) stos: filled here */
    OP_MOVE = 5,       /* its function's copy has a probe for it (hybrid engine): the thread
                          moves there, rip := stub (on-stack replacement, rewriting.py) */
    OP_PYTHON = 6,     /* handed to Python (a move withdrawn) */
};
#define ANY_SLOT 0xffffffffu
#define STRING_CHUNK (1u << 20)    /* bytes of one string instruction handled per stop */

struct mt_thread {
    int32_t tid;           /* 0: free */
    int32_t slot;
    int32_t recording;     /* 0: its accesses are carried out, not recorded (--data-in) */
    const volatile uint64_t *head;  /* the thread's call-record count, or NULL */
};

struct mt_ctx {
    int memfd;
    int resume_request;    /* PTRACE_SYSCALL or PTRACE_CONT */
    uint8_t *area;         /* the tracer's mapping of the data area */
    uint64_t area_addr;    /* its address in the target */
    uint64_t *prot_runs;   /* sorted (start, end, original PROT_*) triples: pages madtrace protected */
    size_t n_prot;
    uint64_t *traced_runs; /* sorted [start, end) pairs: bytes that are recorded */
    size_t n_traced;
    uint8_t *safe_syscalls;   /* bitmap: resumed here at entry and exit */
    size_t n_safe;
    struct mt_insn *insns;
    size_t insn_cap;       /* power of two */
    size_t n_insns;
    struct mt_thread threads[MAX_THREADS];
    size_t n_threads;
    struct mt_access *records;
    size_t rec_cap, n_rec;
    uint64_t order;
    uint64_t fast, untraced, syscalls, writebacks, writeback_errors, moves;
    uint64_t kinds_filter;     /* bit 0: record loads, bit 1: record stores */
    const volatile uint8_t *alias_bits;  /* hybrid engine: one bit per page reached through
                                            its alias (data/hybrid/alias.py), or NULL */
    uint64_t alias_bit;
    int ring_mode;             /* hybrid engine: records go into the thread's ring (after
                                  its call records and probe records, in order) */
    uint64_t ring_full;        /* faults handed back because a ring was full */
    const volatile uint32_t *epoch;  /* ring mode: the control block's epoch (layout.h
                                        MT_CTL_EPOCH), which every data record carries */
};

static inline uint8_t *slot_of(struct mt_ctx *c, int slot) {
    return c->area + (size_t)slot * MT_DSLOT_SIZE;
}
#define SLOT_U64(c, s, off) (*(volatile uint64_t *)(slot_of(c, s) + (off)))

struct mt_ctx *mt_new(int memfd, uint8_t *area, uint64_t area_addr, size_t insn_cap,
                      struct mt_access *records, size_t rec_cap) {
    struct mt_ctx *c = calloc(1, sizeof(*c));
    if (!c) return NULL;
    c->memfd = memfd;
    c->area = area;
    c->area_addr = area_addr;
    c->insn_cap = insn_cap;
    c->insns = calloc(insn_cap, sizeof(struct mt_insn));
    c->records = records;
    c->rec_cap = rec_cap;
    c->resume_request = PTRACE_SYSCALL;
    c->kinds_filter = 3;
    if (!c->insns) { free(c); return NULL; }
    return c;
}

void mt_free(struct mt_ctx *c) {
    if (!c) return;
    free(c->insns);
    free(c->prot_runs);
    free(c->traced_runs);
    free(c->safe_syscalls);
    free(c);
}

size_t mt_record_size(void) { return sizeof(struct mt_access); }

static int set_runs(uint64_t **dst, size_t *n, const uint64_t *runs, size_t count) {
    uint64_t *copy = malloc((count ? count : 1) * 2 * sizeof(uint64_t));
    if (!copy) return -1;
    memcpy(copy, runs, count * 2 * sizeof(uint64_t));
    free(*dst);
    *dst = copy;
    *n = count;
    return 0;
}
int mt_set_protected(struct mt_ctx *c, const uint64_t *runs, size_t n) {
    uint64_t *copy = malloc((n ? n : 1) * 3 * sizeof(uint64_t));
    if (!copy) return -1;
    memcpy(copy, runs, n * 3 * sizeof(uint64_t));
    free(c->prot_runs);
    c->prot_runs = copy;
    c->n_prot = n;
    return 0;
}
int mt_set_traced(struct mt_ctx *c, const uint64_t *runs, size_t n) {
    return set_runs(&c->traced_runs, &c->n_traced, runs, n);
}
int mt_set_safe_syscalls(struct mt_ctx *c, const uint8_t *bitmap, size_t n) {
    uint8_t *copy = malloc(n ? n : 1);
    if (!copy) return -1;
    memcpy(copy, bitmap, n);
    free(c->safe_syscalls);
    c->safe_syscalls = copy;
    c->n_safe = n;
    return 0;
}
void mt_set_resume(struct mt_ctx *c, int request) { c->resume_request = request; }
void mt_set_ring_mode(struct mt_ctx *c, int on) { c->ring_mode = on; }
void mt_set_epoch(struct mt_ctx *c, const uint32_t *epoch) { c->epoch = epoch; }
uint64_t mt_ring_full(struct mt_ctx *c) { return c->ring_full; }

/* ring mode: room for n more records in the thread's ring (head: the tracer's
 * mapping of its HEAD; LIMIT is TAIL + ring size while recording, 0 when not) */
static int ring_room(const struct mt_thread *t, uint64_t n) {
    const volatile uint64_t *head = t->head;
    uint64_t limit = *(const volatile uint64_t *)((const uint8_t *)head + MT_RING_LIMIT - MT_RING_HEAD);
    return limit == 0 || *head + n <= limit;
}

/* ring mode: one data record, published as the target's own are (the thread is stopped) */
static void ring_record(const struct mt_ctx *c, const struct mt_thread *t, uint64_t addr,
                        uint32_t id) {
    volatile uint64_t *head = (volatile uint64_t *)t->head;
    uint8_t *ring = (uint8_t *)head - MT_RING_HEAD;
    uint64_t limit = *(volatile uint64_t *)(ring + MT_RING_LIMIT);
    if (limit == 0) return;                /* recording off */
    uint64_t h = *head;
    uint8_t *rec = ring + MT_RING_RECORDS_OFF + (h & MT_RING_MASK) * MT_RECORD_SIZE;
    uint32_t code = MT_DATA_CODE | id, epoch = c->epoch ? *c->epoch : 0;
    memcpy(rec, &addr, 8);
    memcpy(rec + 8, &code, 4);
    memcpy(rec + 12, &epoch, 4);
    __atomic_store_n(head, h + 1, __ATOMIC_RELEASE);
}

void mt_set_alias(struct mt_ctx *c, const uint8_t *bits, uint64_t alias_bit) {
    c->alias_bits = bits;
    c->alias_bit = alias_bit;
}

/* Writes into the target: a protected page of shared memory cannot be written
 * through /proc/PID/mem (FOLL_FORCE only breaks copy-on-write), so an aliased
 * page is written through its alias.  Returns the bytes written (len: all). */
static ssize_t write_target(struct mt_ctx *c, const void *buf, size_t len, uint64_t addr) {
    if (!c->alias_bits)
        return pwrite(c->memfd, buf, len, (off_t)addr);
    size_t done = 0;
    while (done < len) {
        uint64_t a = addr + done, page = a / MT_PAGE;
        size_t n = MT_PAGE - (a % MT_PAGE);
        if (n > len - done) n = len - done;
        uint64_t to = (c->alias_bits[page / 8] >> (page % 8) & 1) ? a ^ c->alias_bit : a;
        if (pwrite(c->memfd, (const uint8_t *)buf + done, n, (off_t)to) != (ssize_t)n)
            return (ssize_t)done;
        done += n;
    }
    return (ssize_t)done;
}
void mt_set_kinds(struct mt_ctx *c, uint64_t kinds) { c->kinds_filter = kinds; }
uint64_t mt_order(struct mt_ctx *c) { return c->order; }
void mt_set_order(struct mt_ctx *c, uint64_t order) { c->order = order; }
size_t mt_n_records(struct mt_ctx *c) { return c->n_rec; }
void mt_clear_records(struct mt_ctx *c) { c->n_rec = 0; }
size_t mt_n_insns(struct mt_ctx *c) { return c->n_insns; }
void mt_stats(struct mt_ctx *c, uint64_t out[6]) {
    out[0] = c->fast; out[1] = c->untraced; out[2] = c->syscalls;
    out[3] = c->writebacks; out[4] = c->writeback_errors; out[5] = c->moves;
}

static int in_runs(const uint64_t *runs, size_t n, uint64_t a) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (a < runs[2 * mid]) hi = mid;
        else if (a >= runs[2 * mid + 1]) lo = mid + 1;
        else return 1;
    }
    return 0;
}

/* The original protection of a protected page, or -1. */
static int prot_of(const uint64_t *runs, size_t n, uint64_t a) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (a < runs[3 * mid]) hi = mid;
        else if (a >= runs[3 * mid + 1]) lo = mid + 1;
        else return (int)runs[3 * mid + 2];
    }
    return -1;
}

/* ---------------------------------------------------------------- threads */
static struct mt_thread *find_thread(struct mt_ctx *c, int tid) {
    for (size_t i = 0; i < c->n_threads; i++)
        if (c->threads[i].tid == tid) return &c->threads[i];
    return NULL;
}
int mt_thread_set(struct mt_ctx *c, int tid, int slot, const uint64_t *head) {
    struct mt_thread *t = find_thread(c, tid);
    if (!t) {
        if (c->n_threads >= MAX_THREADS) return -1;
        t = &c->threads[c->n_threads++];
        t->tid = 0;
    }
    if (t->tid != tid) t->recording = 1;
    t->tid = tid;
    t->slot = slot;
    t->head = head;
    return 0;
}
void mt_thread_recording(struct mt_ctx *c, int tid, int on) {
    struct mt_thread *t = find_thread(c, tid);
    if (t) t->recording = on;
}
void mt_thread_del(struct mt_ctx *c, int tid) {
    struct mt_thread *t = find_thread(c, tid);
    if (!t) return;
    *t = c->threads[--c->n_threads];
}

/* ----------------------------------------------------------- instructions */
static size_t insn_hash(struct mt_ctx *c, uint64_t rip, uint32_t slot) {
    uint64_t h = (rip ^ ((uint64_t)slot << 48)) * 0x9E3779B97F4A7C15ULL;
    return (size_t)(h >> 20) & (c->insn_cap - 1);
}
static struct mt_insn *find_insn(struct mt_ctx *c, uint64_t rip, uint32_t slot) {
    for (size_t i = insn_hash(c, rip, slot), k = 0; k < c->insn_cap; i = (i + 1) & (c->insn_cap - 1), k++) {
        struct mt_insn *e = &c->insns[i];
        if (e->rip == 0) return NULL;
        if (e->rip == rip && e->slot == slot) return e;
    }
    return NULL;
}
int mt_insn_add(struct mt_ctx *c, uint64_t rip, uint32_t slot, uint64_t stub, int base, int index,
                int scale, int64_t disp, int seg, int size, int kinds, int ilen, int addr32,
                int atomic, int op, int rep, uint32_t id, uint32_t id2, uint32_t id3,
                uint64_t alias_stub) {
    if (c->n_insns * 2 >= c->insn_cap) return -1;   /* the caller grows the table */
    for (size_t i = insn_hash(c, rip, slot);; i = (i + 1) & (c->insn_cap - 1)) {
        struct mt_insn *e = &c->insns[i];
        if (e->rip == 0 || (e->rip == rip && e->slot == slot)) {
            if (e->rip == 0) c->n_insns++;
            e->rip = rip; e->slot = slot; e->stub = stub; e->base = base; e->index = index;
            e->scale = scale; e->disp = disp; e->seg = seg; e->size = size; e->kinds = kinds;
            e->ilen = ilen; e->addr32 = addr32; e->atomic = atomic; e->op = op; e->rep = rep;
            e->id = id; e->id2 = id2; e->id3 = id3; e->alias_stub = alias_stub;
            return 0;
        }
    }
}

/* A table twice as large, with every entry rehashed (mt_insn_add returned -1). */
int mt_insn_resize(struct mt_ctx *c, size_t cap) {
    struct mt_insn *old = c->insns, *fresh = calloc(cap, sizeof(struct mt_insn));
    size_t old_cap = c->insn_cap;
    if (!fresh || cap & (cap - 1)) { free(fresh); return -1; }
    c->insns = fresh;
    c->insn_cap = cap;
    c->n_insns = 0;
    for (size_t i = 0; i < old_cap; i++) {
        if (!old[i].rip) continue;
        size_t j = insn_hash(c, old[i].rip, old[i].slot);
        while (fresh[j].rip) j = (j + 1) & (cap - 1);
        fresh[j] = old[i];
        c->n_insns++;
    }
    free(old);
    return 0;
}

/* ------------------------------------------------------------- write-back */
/* Every slot whose stub ran: write its bytes back (stores) and free it. */
int mt_flush(struct mt_ctx *c) {
    int moved = 0;
    for (int s = 0; s < MT_DATA_SLOTS; s++) {
        if (!SLOT_U64(c, s, MT_DSLOT_ADDR) || !SLOT_U64(c, s, MT_DSLOT_DONE)) continue;
        __atomic_thread_fence(__ATOMIC_ACQUIRE);   /* bytes were stored before DONE */
        uint64_t addr = SLOT_U64(c, s, MT_DSLOT_ADDR), len = SLOT_U64(c, s, MT_DSLOT_LEN);
        /* whatever the instruction changed goes back, whether or not the decoder
         * called it a store */
        if (len && memcmp(slot_of(c, s) + MT_DSLOT_BYTES, slot_of(c, s) + MT_DSLOT_ORIGINAL, len)) {
            if (write_target(c, slot_of(c, s) + MT_DSLOT_BYTES, len, addr) == (ssize_t)len)
                c->writebacks++;
            else
                c->writeback_errors++;
        }
        SLOT_U64(c, s, MT_DSLOT_LEN) = 0;
        SLOT_U64(c, s, MT_DSLOT_DONE) = 0;
        SLOT_U64(c, s, MT_DSLOT_ADDR) = 0;
        moved++;
    }
    return moved;
}

/* ------------------------------------------------------------------ faults */
static uint64_t reg_value(const struct user_regs_struct *r, int index) {
    return ((const unsigned long long *)r)[index];
}

static void record(struct mt_ctx *c, struct mt_thread *t, uint64_t rip, uint64_t addr, int size,
                   int kind, int ilen, int first) {
    struct mt_access *a = &c->records[c->n_rec++];
    a->seq = t->head ? *t->head : 0;
    a->order = ++c->order; a->rip = rip; a->addr = addr; a->tid = (uint32_t)t->tid;
    a->size = (uint16_t)size; a->kind = (uint8_t)kind; a->ilen = (uint8_t)ilen;
    a->first = (uint8_t)first;
}

/* One execution's accesses of the operand at ea (loads before stores); 1 if any. */
static int record_operand(struct mt_ctx *c, struct mt_thread *t, uint64_t rip, uint64_t ea,
                          int size, int kinds, int ilen, uint32_t id) {
    if (!t->recording || !in_runs(c->traced_runs, c->n_traced, ea)) return 0;
    if (c->ring_mode) {
        ring_record(c, t, ea, id);          /* one record: its kinds come with the id */
        return 1;
    }
    int first = 1;
    for (int k = 1; k <= 2; k++) {
        if (!(kinds & k) || !(c->kinds_filter & k)) continue;
        record(c, t, rip, ea, size, k, ilen, first);
        first = 0;
    }
    return 1;
}

static int resume(struct mt_ctx *c, struct mt_thread *t) {
    c->fast++;
    ptrace(c->resume_request, t->tid, 0, 0);
    return 1;
}

/* Whether [ea, ea + size) lies on aliased pages: 1 all of it, 0 none, -1 part. */
static int aliased(const struct mt_ctx *c, uint64_t ea, uint64_t size) {
    if (!c->alias_bits) return 0;
    int all = 1, any = 0;
    for (uint64_t page = ea / MT_PAGE; page <= (ea + size - 1) / MT_PAGE; page++) {
        int bit = c->alias_bits[page / 8] >> (page % 8) & 1;
        all &= bit;
        any |= bit;
    }
    return all ? 1 : any ? -1 : 0;
}

/* The operand redirected to the thread's slot (OP_REDIRECT); on aliased pages
 * (through_alias), the access carried out on the alias by the alias stub. */
static int redirect(struct mt_ctx *c, struct mt_thread *t, struct user_regs_struct *regs,
                    struct mt_insn *e, uint64_t ea, int through_alias) {
    uint8_t *slot = slot_of(c, t->slot);
    if (through_alias) {
        if (!record_operand(c, t, regs->rip, ea, e->size, e->kinds, e->ilen, e->id)) c->untraced++;
        SLOT_U64(c, t->slot, MT_DSLOT_ALIAS) = ea ^ c->alias_bit;
        SLOT_U64(c, t->slot, MT_DSLOT_LEN) = 0;      /* nothing to write back */
        SLOT_U64(c, t->slot, MT_DSLOT_DONE) = 0;
        SLOT_U64(c, t->slot, MT_DSLOT_ADDR) = ea;
        if (ptrace(PTRACE_POKEUSER, t->tid, (void *)offsetof(struct user_regs_struct, rip),
                   (void *)e->alias_stub) < 0) {
            SLOT_U64(c, t->slot, MT_DSLOT_ADDR) = 0;
            return 0;
        }
        return resume(c, t);
    }
    if (pread(c->memfd, slot + MT_DSLOT_BYTES, e->size, (off_t)ea) != e->size) return 0;
    memcpy(slot + MT_DSLOT_ORIGINAL, slot + MT_DSLOT_BYTES, e->size);
    if (!record_operand(c, t, regs->rip, ea, e->size, e->kinds, e->ilen, e->id)) c->untraced++;
    SLOT_U64(c, t->slot, MT_DSLOT_LEN) = e->size;
    SLOT_U64(c, t->slot, MT_DSLOT_DONE) = 0;
    SLOT_U64(c, t->slot, MT_DSLOT_ADDR) = ea;
    if (ptrace(PTRACE_POKEUSER, t->tid, (void *)offsetof(struct user_regs_struct, rip),
               (void *)e->stub) < 0) {
        SLOT_U64(c, t->slot, MT_DSLOT_ADDR) = 0;
        return 0;   /* nothing resumed: Python sees the stop as it was */
    }
    return resume(c, t);
}

/* jmp [mem] / call [mem]: the pointer is loaded here. */
static int branch(struct mt_ctx *c, struct mt_thread *t, struct user_regs_struct *regs,
                  struct mt_insn *e, uint64_t ea) {
    uint64_t target, back = regs->rip + e->ilen;
    if (e->size != 8 || pread(c->memfd, &target, 8, (off_t)ea) != 8) return 0;
    if (e->op == OP_CALL && write_target(c, &back, 8, regs->rsp - 8) != 8) return 0;
    if (!record_operand(c, t, regs->rip, ea, 8, 1, e->ilen, e->id)) c->untraced++;
    if (e->op == OP_CALL) regs->rsp -= 8;
    regs->rip = target;
    if (ptrace(PTRACE_SETREGS, t->tid, 0, regs) < 0) return 0;
    return resume(c, t);
}

/* (rep) movs / stos: up to STRING_CHUNK bytes per stop, each iteration recorded
 * as one execution; an unfinished rep instruction stays at its address with
 * rcx/rsi/rdi advanced, as after an interrupt, and faults again. */
static int string_op(struct mt_ctx *c, struct mt_thread *t, struct user_regs_struct *regs,
                     struct mt_insn *e) {
    static uint8_t buf[2 * STRING_CHUNK + 64];
    uint64_t n = e->rep ? regs->rcx : 1, size = e->size;
    if (n == 0 || size == 0 || size > 8) return 0;
    uint64_t room = (c->rec_cap - c->n_rec) / 2;
    if (c->ring_mode) {
        const volatile uint64_t *head = t->head;
        uint64_t limit = *(const volatile uint64_t *)((const uint8_t *)head + MT_RING_LIMIT -
                                                      MT_RING_HEAD);
        room = limit > *head ? (limit - *head) / 2 : 0;
    }
    if (n > room) n = room;
    if (n > STRING_CHUNK / size) n = STRING_CHUNK / size;
    if (n == 0) return 0;
    int back = (regs->eflags >> 10) & 1;   /* DF */
    uint64_t span = n * size, dst = regs->rdi, src = regs->rsi;
    uint64_t dst_lo = back ? dst - (n - 1) * size : dst;
    uint64_t src_lo = back ? src - (n - 1) * size : src;
    if (e->op == OP_STOS) {
        for (uint64_t i = 0; i < span; i++) buf[i] = ((uint8_t *)&regs->rax)[i % size];
        if (write_target(c, buf, span, dst_lo) != (ssize_t)span) return 0;
    } else if (dst_lo + span <= src_lo || src_lo + span <= dst_lo) {
        if (pread(c->memfd, buf, span, (off_t)src_lo) != (ssize_t)span) return 0;
        if (write_target(c, buf, span, dst_lo) != (ssize_t)span) return 0;
    } else {
        /* overlapping: element by element in a copy of both ranges, in program order */
        uint64_t lo = dst_lo < src_lo ? dst_lo : src_lo;
        uint64_t hi = (dst_lo > src_lo ? dst_lo : src_lo) + span;
        if (pread(c->memfd, buf, hi - lo, (off_t)lo) != (ssize_t)(hi - lo)) return 0;
        for (uint64_t i = 0; i < n; i++) {
            uint64_t off = back ? (n - 1 - i) * size : i * size;
            memmove(buf + (dst_lo - lo) + off, buf + (src_lo - lo) + off, size);
        }
        if (write_target(c, buf + (dst_lo - lo), span, dst_lo) != (ssize_t)span) return 0;
    }
    int64_t step = back ? -(int64_t)size : (int64_t)size;
    int any = 0;
    for (uint64_t i = 0; i < n && t->recording; i++) {
        int first = 1;
        if (e->op == OP_MOVS && (c->kinds_filter & 1) &&
            in_runs(c->traced_runs, c->n_traced, src + i * step)) {
            if (c->ring_mode) ring_record(c, t, src + i * step, e->id);
            else record(c, t, regs->rip, src + i * step, size, 1, e->ilen, 1);
            first = 0;
            any = 1;
        }
        if ((c->kinds_filter & 2) && in_runs(c->traced_runs, c->n_traced, dst + i * step)) {
            if (c->ring_mode) ring_record(c, t, dst + i * step, first ? e->id3 : e->id2);
            else record(c, t, regs->rip, dst + i * step, size, 2, e->ilen, first);
            any = 1;
        }
    }
    if (!any) c->untraced++;
    regs->rdi += n * step;
    if (e->op == OP_MOVS) regs->rsi += n * step;
    if (e->rep) regs->rcx -= n;
    if (!e->rep || regs->rcx == 0) regs->rip += e->ilen;
    if (ptrace(PTRACE_SETREGS, t->tid, 0, regs) < 0) return 0;
    return resume(c, t);
}

/* Handle a SIGSEGV stop of a known thread at a fault address; 1 if handled
 * (the thread was resumed), 0 if Python must handle it (nothing changed). */
static int handle_fault(struct mt_ctx *c, struct mt_thread *t, uint64_t fault_addr, int in_loop) {
    struct user_regs_struct regs;
    uint64_t page = fault_addr & ~(MT_PAGE - 1);
    int prot = prot_of(c->prot_runs, c->n_prot, page);
    if (prot <= 0) return 0;
    if (c->n_rec + 2 > c->rec_cap) return 0;
    if (c->ring_mode && (!t->head || !ring_room(t, 2))) {
        c->ring_full += t->head != NULL;
        return 0;                       /* no ring (Python's slow path), or drain it first */
    }
    if (ptrace(PTRACE_GETREGS, t->tid, 0, &regs) < 0) return 0;
    struct mt_insn *e = find_insn(c, regs.rip, (uint32_t)t->slot);
    if (!e) e = find_insn(c, regs.rip, ANY_SLOT);
    if (!e) return 0;
    if (in_loop && e->ask && !(++e->seen & e->ask)) return 0;   /* Python asks again */
    /* an access the page's own protection forbids is the target's own fault */
    if (((e->kinds & 1) && !(prot & 1)) || ((e->kinds & 2) && !(prot & 2))) return 0;
    if (e->op == OP_PYTHON) return 0;
    if (e->op == OP_MOVE) {               /* into the copy, whose probe makes the access */
        regs.rip = e->stub;
        if (ptrace(PTRACE_SETREGS, t->tid, 0, &regs) < 0) return 0;
        c->moves++;
        ptrace(c->resume_request, t->tid, 0, 0);
        return 1;
    }
    if (e->op == OP_MOVS || e->op == OP_STOS) return string_op(c, t, &regs, e);
    uint64_t ea;
    if (e->base == OPND_REG_RIP) ea = regs.rip + e->ilen;
    else ea = e->base == OPND_REG_NONE ? 0 : reg_value(&regs, e->base);
    if (e->index != OPND_REG_NONE) ea += reg_value(&regs, e->index) * e->scale;
    ea += (uint64_t)e->disp;
    if (e->addr32) ea &= 0xffffffffULL;
    if (e->seg == 1) ea += regs.fs_base;
    else if (e->seg == 2) ea += regs.gs_base;
    /* the fault must be one of the operand's pages, else the decoding missed something */
    if (page < (ea & ~(MT_PAGE - 1)) || page > ((ea + e->size - 1) & ~(MT_PAGE - 1))) return 0;
    /* a locked instruction is atomic for the other threads only on the memory
     * itself: through the alias (a copy in a slot is not) */
    int through_alias = e->op == OP_REDIRECT ? aliased(c, ea, e->size) : 0;
    if (e->atomic && c->n_threads > 1 && through_alias != 1) return 0;
    if (e->op == OP_JMP || e->op == OP_CALL) return branch(c, t, &regs, e, ea);
    if (SLOT_U64(c, t->slot, MT_DSLOT_ADDR)) return 0;   /* slot still in use */
    /* part of the operand aliased, or no alias stub: Python's slow path */
    if (through_alias < 0 || (through_alias && !e->alias_stub)) return 0;
    return redirect(c, t, &regs, e, ea, through_alias);
}

int mt_handle_fault(struct mt_ctx *c, int tid, uint64_t fault_addr) {
    struct mt_thread *t = find_thread(c, tid);
    return t ? handle_fault(c, t, fault_addr, 0) : 0;
}

/* Every 2^k-th fault of the instruction at rip (each of its slots) that the loop
 * meets goes to Python again (mask = 2^k - 1; 0: none). */
void mt_insn_ask(struct mt_ctx *c, uint64_t rip, int mask) {
    struct mt_insn *e = find_insn(c, rip, ANY_SLOT);      /* hash look-ups: the cost does not
                                                             grow with the table */
    if (e) e->ask = (uint16_t)mask;
    for (uint32_t s = 0; s < MT_DATA_SLOTS; s++)
        if ((e = find_insn(c, rip, s))) e->ask = (uint16_t)mask;
}

/* From now on a fault of the instruction at rip (original code) moves the thread
 * to ``to`` (its copy's probe): OP_MOVE, for every slot's entry and ANY_SLOT's;
 * to == 0: handed to Python (the copy is withdrawn); every (ask + 1)-th such fault
 * goes to Python anyway (which may have more to do there, see rewriting.py).
 * -1: the table is half full (the caller grows it and calls again). */
int mt_insn_move(struct mt_ctx *c, uint64_t rip, uint64_t to, int kinds, int ask) {
    struct mt_insn *e;
    for (uint32_t s = 0; s < MT_DATA_SLOTS; s++)
        if ((e = find_insn(c, rip, s))) { e->op = to ? OP_MOVE : OP_PYTHON; e->stub = to; e->ask = (uint16_t)ask; }
    if ((e = find_insn(c, rip, ANY_SLOT))) {
        e->op = to ? OP_MOVE : OP_PYTHON; e->stub = to; e->ask = (uint16_t)ask;
        return 0;
    }
    if (!to) return 0;
    if (mt_insn_add(c, rip, ANY_SLOT, to, 0, 0, 1, 0, 0, 0, kinds, 0, 0, 0, OP_MOVE, 0, 0, 0, 0, 0) < 0)
        return -1;
    find_insn(c, rip, ANY_SLOT)->ask = (uint16_t)ask;
    return 0;
}

/* A system call stop (SIGTRAP | 0x80) of a call in the safe set: resumed. */
static int handle_syscall(struct mt_ctx *c, int tid) {
    long nr = ptrace(PTRACE_PEEKUSER, tid, (void *)offsetof(struct user_regs_struct, orig_rax), 0);
    if (nr < 0 || (size_t)nr >= c->n_safe * 8) return 0;
    if (!(c->safe_syscalls[nr / 8] & (1 << (nr % 8)))) return 0;
    c->syscalls++;
    ptrace(c->resume_request, tid, 0, 0);
    return 1;
}

/*
 * Wait for stops of the target's threads, handling those we can.
 * Returns 1 with *tid and *status set: a stop (or exit) for Python;
 * 0: nothing happened (block == 0); 2: the record buffer is nearly full;
 * -1: waitpid failed (errno: ECHILD, EINTR...).
 */
/* Python's signal handlers (SIGTERM: detach) run only once this returns: a run
 * of stops the loop handles itself returns after SLICE_NS, as if the record
 * buffer were full (the caller drains and calls again). */
#define SLICE_NS 20000000LL
#define SLICE_CHECK_EVERY 64

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int mt_wait(struct mt_ctx *c, int block, int *tid_out, int *status_out) {
    int64_t start = now_ns();
    for (unsigned handled = 0;; handled++) {
        int status;
        if (c->n_rec + 2 > c->rec_cap) return 2;
        if (handled && handled % SLICE_CHECK_EVERY == 0 && now_ns() - start >= SLICE_NS) return 2;
        pid_t tid = waitpid(-1, &status, __WALL | (block ? 0 : WNOHANG));
        if (tid == 0) return 0;
        if (tid < 0) return -1;
        mt_flush(c);
        struct mt_thread *t = find_thread(c, tid);
        if (t && WIFSTOPPED(status) && (status >> 16) == 0) {
            int sig = WSTOPSIG(status);
            if (sig == SIGSEGV) {
                siginfo_t si;
                if (ptrace(PTRACE_GETSIGINFO, tid, 0, &si) == 0 && si.si_code == SEGV_ACCERR &&
                    handle_fault(c, t, (uint64_t)si.si_addr, 1))
                    continue;
            } else if (sig == (SIGTRAP | 0x80) && c->n_safe && handle_syscall(c, tid)) {
                continue;
            }
        }
        *tid_out = tid;
        *status_out = status;
        return 1;
    }
}
