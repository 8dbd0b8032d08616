// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * The drain of the function-tracing rings: the tracer's side of the call
 * records' hot path, in C.
 *
 * mt_drain_ring() takes the records [TAIL, HEAD) of one ring (layout:
 * injector/layout.h), appends them unchanged to the thread's record file and
 * publishes TAIL and, while recording, the writer's LIMIT = TAIL +
 * MT_RING_RECORDS (the trampolines compare HEAD with LIMIT only, so they never
 * read the tracer's TAIL on their fast path).  It goes piece by piece, and
 * publishes after each piece, so that a writer waiting on a full ring goes on
 * as soon as the first piece is out.
 *
 * The calls are counted by the trampolines themselves (MT_RING_COUNTS, one
 * counter per thread and site): the drain does not read the records, except
 * to count the entry records of sites beyond MT_COUNTED_SITES (codes from
 * count_from on), which have no counter.
 *
 * Built by the Makefile into build/native/libmtdrain.so; used through ctypes
 * by madtrace/rings/rings.py (its drain thread; ctypes releases the GIL for
 * the call), the only caller.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>
#include <xxhash.h>

#include "capture_format.h"
#include "layout.h"

#define PIECE_RECORDS 65536   /* 1 MiB of records per write (one chunk) */
_Static_assert(PIECE_RECORDS * MT_RECORD_SIZE <= MT_CHUNK_MAX_BYTES, "a piece fits in a chunk");

/* a data record handed to the tracer (hybrid data engine): the address, the
 * thread's call records before it (its seq) and the instruction id;
 * madtrace/rings/rings.py DATA_OUT_DTYPE */
struct mt_data_out {
    uint64_t addr, seq;
    uint32_t id, pad;
};

/* Writes size bytes of records as one chunk of the capture container
 * (build/native/capture_format.h, generated from madtrace/trace/format.py):
 * the chunk header (magic, length, XXH3-64 of the records seeded with their
 * length) and the records, in one writev.  Returns 0 or -errno.  *written:
 * the records' bytes written: size, or 0 on an error (a chunk written in
 * part is cut off again, so that the file holds whole chunks only). */
static int write_records(int fd, const uint8_t *data, size_t size, size_t *written)
{
    uint8_t header[MT_CHUNK_HEADER_SIZE];
    uint32_t magic = MT_CHUNK_MAGIC, length = (uint32_t)size;
    uint64_t check = XXH3_64bits_withSeed(data, size, size);
    memcpy(header + MT_CHUNK_MAGIC_OFFSET, &magic, 4);
    memcpy(header + MT_CHUNK_LENGTH_OFFSET, &length, 4);
    memcpy(header + MT_CHUNK_CHECK_OFFSET, &check, 8);
    struct iovec iov[2] = {{header, sizeof header}, {(void *)data, size}};
    size_t total = sizeof header + size, done = 0;
    *written = 0;
    while (done < total) {
        ssize_t w = writev(fd, iov, 2);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            int err = -errno;
            off_t end = lseek(fd, 0, SEEK_END);
            if (done && end >= (off_t)done && ftruncate(fd, end - (off_t)done) != 0)
                err = -EIO;   /* a broken chunk stays: the reader names it */
            return err;
        }
        done += (size_t)w;
        for (int i = 0; i < 2; i++) {   /* what is left of the two parts */
            size_t part = (size_t)w < iov[i].iov_len ? (size_t)w : iov[i].iov_len;
            iov[i].iov_base = (uint8_t *)iov[i].iov_base + part;
            iov[i].iov_len -= part;
            w -= (ssize_t)part;
        }
    }
    *written = size;
    return 0;
}

/* counts[code - from] += 1 for every record whose code (site id << 1 |
 * MT_KIND_EXIT) is in [from, to); codes >= to (never written by a trampoline
 * of ours) go to counts[to - from] */
static void count_codes(const uint8_t *records, uint64_t n, uint64_t *counts, uint64_t from,
                        uint64_t to)
{
    for (uint64_t i = 0; i < n; i++) {
        uint32_t code;
        memcpy(&code, records + i * MT_RECORD_SIZE + 8, sizeof code);
        if (code >= from)
            counts[(code < to ? code : to) - from]++;
    }
}

/* the size of one record and the ring block, to check the build against the Python side */
uint64_t mt_drain_record_size(void)
{
    return MT_RECORD_SIZE;
}

uint64_t mt_drain_ring_block(void)
{
    return MT_RING_BLOCK;
}

/* the capture container's version and chunk header, to check the build against trace/format.py */
uint64_t mt_drain_capture_version(void)
{
    return MT_CAPTURE_VERSION;
}

uint64_t mt_drain_chunk_header_size(void)
{
    return MT_CHUNK_HEADER_SIZE;
}

/* Where consume() puts a piece of count records (done: those it put before):
 * returns how many it took (all of them, but for a short write), *err set. */
typedef uint64_t (*piece_sink)(void *where, const uint8_t *piece, uint64_t count,
                               uint64_t done, int *err);

static uint64_t to_file(void *where, const uint8_t *piece, uint64_t count, uint64_t done, int *err)
{
    (void)done;
    size_t written;
    *err = write_records(*(int *)where, piece, count * MT_RECORD_SIZE, &written);
    return written / MT_RECORD_SIZE;
}

static uint64_t to_memory(void *where, const uint8_t *piece, uint64_t count, uint64_t done, int *err)
{
    memcpy((uint8_t *)where + done * MT_RECORD_SIZE, piece, count * MT_RECORD_SIZE);
    *err = 0;
    return count;
}

/* The records from TAIL to HEAD (upto at most, max_records at most), a piece
 * at a time, to sink; each piece taken is consumed at once (TAIL, and LIMIT
 * when recording, published).  Returns 0, the sink's error (what it took before
 * is consumed all the same), or -EPROTO (HEAD not within one ring of TAIL:
 * nothing is consumed). */
static int consume(uint8_t *ring, piece_sink sink, void *where, uint64_t max_records,
                   uint64_t *counts, uint64_t from, uint64_t to, int recording,
                   uint64_t *moved, uint64_t upto)
{
    volatile uint64_t *head_p = (volatile uint64_t *)(ring + MT_RING_HEAD);
    volatile uint64_t *tail_p = (volatile uint64_t *)(ring + MT_RING_TAIL);
    volatile uint64_t *limit_p = (volatile uint64_t *)(ring + MT_RING_LIMIT);
    /* records below HEAD were written before HEAD was (x86 stores are seen in order) */
    uint64_t head = __atomic_load_n(head_p, __ATOMIC_ACQUIRE);
    uint64_t tail = *tail_p;
    *moved = 0;
    if (upto < head)
        head = upto;            /* the records of a ring's next owner stay (ring_pool.py) */
    if (head <= tail)
        return 0;
    if (head - tail > MT_RING_RECORDS)
        return -EPROTO;
    if (head - tail > max_records)
        head = tail + max_records;
    const uint8_t *records = ring + MT_RING_RECORDS_OFF;
    uint64_t position = tail;
    int err = 0;
    while (position != head) {
        uint64_t index = position & MT_RING_MASK;
        uint64_t count = head - position;
        if (count > MT_RING_RECORDS - index)
            count = MT_RING_RECORDS - index;   /* up to the end of the ring */
        if (count > PIECE_RECORDS)
            count = PIECE_RECORDS;
        const uint8_t *piece = records + index * MT_RECORD_SIZE;
        count = sink(where, piece, count, position - tail, &err);
        if (from < to)
            count_codes(piece, count, counts, from, to);
        position += count;
        /* the piece is consumed: the writer may overwrite it now */
        __atomic_store_n(tail_p, position, __ATOMIC_RELEASE);
        if (recording)
            __atomic_store_n(limit_p, position + MT_RING_RECORDS, __ATOMIC_RELEASE);
        if (err)
            break;
    }
    *moved = position - tail;
    return err;
}

/*
 * Drains one ring.  ring: the tracer's address of the ring block; fd: the
 * record file (opened for appending); counts: to - from + 1 counters for the
 * codes [from, to) and the unknown ones (from >= to: no code is counted);
 * recording: nonzero to give the writer room again (LIMIT), zero to leave
 * LIMIT alone (recording is off: LIMIT is 0).  *moved: the records written
 * out and consumed (TAIL moved past them).  Returns 0, -errno if writing
 * failed (the records before the failed write are consumed all the same), or
 * -EPROTO if HEAD is not within one ring of TAIL (nothing is consumed).
 * upto: no record from there on is taken (UINT64_MAX: none is left).
 */
int mt_drain_ring_upto(uint8_t *ring, int fd, uint64_t *counts, uint64_t from, uint64_t to,
                       int recording, uint64_t *moved, uint64_t upto)
{
    return consume(ring, to_file, &fd, MT_RING_RECORDS, counts, from, to, recording, moved, upto);
}

/*
 * As mt_drain_ring_upto, but the records are copied to dst (room for
 * max_records), not written: the drain thread then never waits for the disk
 * (a file system that stalls for a second under load: the writer would find
 * its ring full all that time, and drop).  madtrace/rings/drain_thread.c
 * writes them out from its own thread (mt_write_chunks).  Returns 0, or
 * -EPROTO if HEAD is not within one ring of TAIL (nothing is consumed).
 */
int mt_drain_ring_take(uint8_t *ring, uint8_t *dst, uint64_t max_records, uint64_t *counts,
                       uint64_t from, uint64_t to, int recording, uint64_t *moved, uint64_t upto)
{
    return consume(ring, to_memory, dst, max_records, counts, from, to, recording, moved, upto);
}

/* size bytes of records appended to fd as chunks of PIECE_RECORDS records at
 * most (mt_drain_ring_take's, later).  Returns 0 or -errno; *written: the
 * bytes of records written (whole chunks) */
int mt_write_chunks(int fd, const uint8_t *data, uint64_t size, uint64_t *written)
{
    *written = 0;
    while (*written < size) {
        uint64_t piece = size - *written;
        if (piece > PIECE_RECORDS * MT_RECORD_SIZE)
            piece = PIECE_RECORDS * MT_RECORD_SIZE;
        size_t done;
        int err = write_records(fd, data + *written, piece, &done);
        *written += done;
        if (err)
            return err;
    }
    return 0;
}

/* mt_drain_ring_upto, every record up to HEAD */
int mt_drain_ring(uint8_t *ring, int fd, uint64_t *counts, uint64_t from, uint64_t to,
                  int recording, uint64_t *moved)
{
    return mt_drain_ring_upto(ring, fd, counts, from, to, recording, moved, UINT64_MAX);
}

uint64_t mt_drain_data_out_size(void)
{
    return sizeof(struct mt_data_out);
}

/* a hook group taken out of a ring (hybrid engine's hook stubs, layout.h "Hook
 * stubs"): madtrace/rings/ring_split.py HOOK_OUT_DTYPE */
struct mt_hook_out {
    uint64_t a0, a1, a2, ret;   /* entry: rdi, rsi, rdx, return address; return: a0 = rax,
                                   a1 = entry rsp */
    uint64_t seq;               /* the thread's call records before it */
    uint64_t data_before;       /* data records taken out before it (an index of out) */
    uint64_t position;          /* its first record's ring index */
    uint32_t code;              /* its first record's code: MT_HOOK_CODE | hook << 2 | kind */
    uint32_t stamp;             /* entry: the epoch it read; return: its stamp */
    uint32_t rsp;               /* the function's entry rsp, low 32 bits */
    uint32_t flags;             /* MT_HOOK_OUT_* */
};
enum { MT_HOOK_OUT_LATE = 1 };  /* taken at the end before an earlier stamp came */

/* the state of mt_drain_ring_split, in and out: ring_split.py SPLIT_STATE_DTYPE */
struct mt_split {
    uint64_t calls;             /* the thread's call records written out so far */
    struct mt_data_out *out;    /* data records out: out[out_n], out_cap of room */
    uint64_t out_cap, out_n;
    struct mt_hook_out *hooks;  /* hook groups out */
    uint64_t hooks_cap, hooks_n;
    uint64_t damaged;           /* records of broken hook groups skipped (a signal handler
                                   overwrote a group's first record) */
    uint64_t late;              /* return groups taken at the end out of stamp order */
    uint32_t next_stamp;        /* the lowest stamp not taken yet (every ring's) */
    uint32_t final;             /* nonzero: take everything (no stamp is coming any more) */
};

uint64_t mt_drain_hook_out_size(void) { return sizeof(struct mt_hook_out); }
uint64_t mt_drain_split_size(void) { return sizeof(struct mt_split); }

static inline const uint8_t *record_at(const uint8_t *ring, uint64_t position)
{
    return ring + MT_RING_RECORDS_OFF + (position & MT_RING_MASK) * MT_RECORD_SIZE;
}
static inline uint32_t u32_at(const uint8_t *rec, int offset)
{
    uint32_t v;
    memcpy(&v, rec + offset, 4);
    return v;
}
static inline uint64_t u64_at(const uint8_t *rec, int offset)
{
    uint64_t v;
    memcpy(&v, rec + offset, 8);
    return v;
}

/* the records of the hook group whose first record is at position (head:
 * HEAD), or 0 if it is broken: continuation records that do not follow, or
 * whose position does not match (stale records of an earlier lap) */
static uint64_t group_size(const uint8_t *ring, uint64_t position, uint64_t head)
{
    uint32_t code = u32_at(record_at(ring, position), 8);
    uint32_t kind = code & 3;
    uint64_t n = kind == MT_HOOK_ENTRY ? MT_HOOK_ENTRY_RECORDS :
                 kind == MT_HOOK_RETURN ? MT_HOOK_RETURN_RECORDS :
                 kind == MT_HOOK_VOID ? (code >> 2) & 0x3ff : 0;
    if (n < 2 || head - position < n)
        return 0;
    for (uint64_t i = 1; i < n; i++)
        if (u32_at(record_at(ring, position + i), 8) != MT_HOOK_CONT)
            return 0;
    if (u32_at(record_at(ring, position + 1), 12) != (uint32_t)position)
        return 0;
    return n;
}

static void decode_group(const uint8_t *ring, uint64_t position, struct mt_hook_out *h)
{
    const uint8_t *r0 = record_at(ring, position), *r1 = record_at(ring, position + 1);
    memset(h, 0, sizeof *h);
    h->code = u32_at(r0, 8);
    h->stamp = u32_at(r0, 12);
    h->a0 = u64_at(r0, 0);
    h->position = position;
    if ((h->code & 3) == MT_HOOK_ENTRY) {
        const uint8_t *r2 = record_at(ring, position + 2), *r3 = record_at(ring, position + 3);
        h->a1 = u64_at(r1, 0);
        h->a2 = u64_at(r2, 0);
        h->rsp = u32_at(r2, 12);
        h->ret = u64_at(r3, 0);
    } else {
        h->a1 = u64_at(r1, 0);
        h->rsp = (uint32_t)h->a1;
    }
}

/* epoch e may be taken once every stamp below it is: e <= next (mod 2^32) */
static inline int waits(uint32_t epoch, uint32_t next)
{
    return (int32_t)(epoch - next) > 0;
}

/*
 * As mt_drain_ring, for rings that also hold data records (MT_DATA_CODE <=
 * code < MT_HOOK_CODE: the data probes and the fault loop) and hook groups
 * (code >= MT_HOOK_CODE): the call records go to fd in order, the data records
 * to s->out with their seq, the hook groups to s->hooks with their seq and the
 * number of data records before them (the tracer names the data records
 * before a group with the heap as it was, then applies the group).  A data
 * record or entry group is taken once every stamp below its epoch was taken, a
 * return group when its stamp is s->next_stamp (which then moves on): so that
 * an access is named after exactly the allocation events that came before it,
 * in whichever thread.  Returns 0 when the ring is empty, 1 when out or hooks
 * is full (empty them and call again), 2 when a record waits for a stamp
 * (s->next_stamp) another ring holds, -ENOENT when a call record comes and fd
 * < 0 (open the record file and call again), -EPROTO if HEAD is not within one
 * ring of TAIL, -errno if writing failed; what came before is consumed.
 */
int mt_drain_ring_split(uint8_t *ring, int fd, uint64_t *counts, uint64_t from, uint64_t to,
                        int recording, uint64_t *moved, struct mt_split *s)
{
    static uint8_t stage[PIECE_RECORDS * MT_RECORD_SIZE];
    volatile uint64_t *head_p = (volatile uint64_t *)(ring + MT_RING_HEAD);
    volatile uint64_t *tail_p = (volatile uint64_t *)(ring + MT_RING_TAIL);
    volatile uint64_t *limit_p = (volatile uint64_t *)(ring + MT_RING_LIMIT);
    uint64_t head = __atomic_load_n(head_p, __ATOMIC_ACQUIRE);
    uint64_t tail = *tail_p;
    int err = 0, stop = 0;
    *moved = 0;
    if (head == tail)
        return 0;
    if (head - tail > MT_RING_RECORDS)
        return -EPROTO;
    uint64_t position = tail, n_calls = 0;
    while (!err) {
        int flush = position == head;
        if (!flush) {
            const uint8_t *rec = record_at(ring, position);
            uint32_t code = u32_at(rec, 8);
            if (code < MT_DATA_CODE) {
                if (fd < 0) {
                    stop = -1;
                    flush = 1;
                } else {
                    memcpy(stage + n_calls * MT_RECORD_SIZE, rec, MT_RECORD_SIZE);
                    n_calls++;
                    position++;
                    flush = n_calls == PIECE_RECORDS;
                }
            } else if (code < MT_HOOK_CODE) {
                if (!s->final && waits(u32_at(rec, 12), s->next_stamp)) {
                    stop = 2;
                    flush = 1;
                } else if (s->out_n == s->out_cap) {
                    stop = 1;
                    flush = 1;
                } else {
                    struct mt_data_out *d = &s->out[s->out_n++];
                    d->addr = u64_at(rec, 0);
                    d->seq = s->calls + n_calls;
                    d->id = code & ~(uint32_t)MT_DATA_CODE;
                    d->pad = 0;
                    position++;
                }
            } else {
                uint64_t n = group_size(ring, position, head);
                uint32_t kind = code & 3, late = 0;
                if (!n) {
                    s->damaged++;
                    position++;
                } else if (kind == MT_HOOK_VOID) {
                    position += n;
                } else if (kind == MT_HOOK_ENTRY && !s->final &&
                           waits(u32_at(rec, 12), s->next_stamp)) {
                    stop = 2;
                    flush = 1;
                } else if (kind == MT_HOOK_RETURN && u32_at(rec, 12) != s->next_stamp &&
                           !(late = s->final)) {
                    stop = 2;
                    flush = 1;
                } else if (s->hooks_n == s->hooks_cap) {
                    stop = 1;
                    flush = 1;
                } else {
                    struct mt_hook_out *h = &s->hooks[s->hooks_n++];
                    decode_group(ring, position, h);
                    h->seq = s->calls + n_calls;
                    h->data_before = s->out_n;
                    if (kind == MT_HOOK_RETURN) {
                        if (late) {
                            h->flags |= MT_HOOK_OUT_LATE;
                            s->late++;
                        } else {
                            s->next_stamp++;
                        }
                    }
                    position += n;
                }
            }
        }
        if (!flush)
            continue;
        if (n_calls) {
            size_t written;
            err = write_records(fd, stage, n_calls * MT_RECORD_SIZE, &written);
            if (from < to)
                count_codes(stage, written / MT_RECORD_SIZE, counts, from, to);
            s->calls += n_calls;
            n_calls = 0;
        }
        /* what came before is consumed: the writer may overwrite it now */
        __atomic_store_n(tail_p, position, __ATOMIC_RELEASE);
        if (recording)
            __atomic_store_n(limit_p, position + MT_RING_RECORDS, __ATOMIC_RELEASE);
        if (stop || position == head)
            break;
    }
    *moved = position - tail;
    if (err)
        return err;
    return stop < 0 ? -ENOENT : stop;
}

/*
 * The return group with this stamp, further on in the ring than a record
 * waiting for it (a signal handler's records, written between the group's
 * stamp and its publication): decoded into *h (seq: calls + the call records
 * before it) and made void in the ring (the drain skips it when it gets
 * there).  Returns 1 if found, else 0.
 */
int mt_ring_take_stamp(uint8_t *ring, uint32_t stamp, uint64_t calls, struct mt_hook_out *h)
{
    uint64_t head = __atomic_load_n((volatile uint64_t *)(ring + MT_RING_HEAD), __ATOMIC_ACQUIRE);
    uint64_t tail = *(volatile uint64_t *)(ring + MT_RING_TAIL);
    if (head - tail > MT_RING_RECORDS)
        return 0;
    for (uint64_t p = tail; p != head;) {
        uint8_t *rec = (uint8_t *)record_at(ring, p);
        uint32_t code = u32_at(rec, 8);
        if (code < MT_DATA_CODE) {
            calls++;
            p++;
            continue;
        }
        uint64_t n = code >= MT_HOOK_CODE ? group_size(ring, p, head) : 0;
        if (n && (code & 3) == MT_HOOK_RETURN && u32_at(rec, 12) == stamp) {
            decode_group(ring, p, h);
            h->seq = calls;
            uint32_t void_code = MT_HOOK_CODE | (uint32_t)n << 2 | MT_HOOK_VOID;
            memcpy(rec + 8, &void_code, 4);
            return 1;
        }
        p += n ? n : 1;
    }
    return 0;
}

/* call records in [TAIL, HEAD) (not drained yet: a stalled ring) */
uint64_t mt_ring_pending_calls(const uint8_t *ring)
{
    uint64_t head = __atomic_load_n((volatile uint64_t *)(ring + MT_RING_HEAD), __ATOMIC_ACQUIRE);
    uint64_t tail = *(volatile uint64_t *)(ring + MT_RING_TAIL), n = 0;
    if (head - tail > MT_RING_RECORDS)
        return 0;
    for (uint64_t p = tail; p != head; p++)
        n += u32_at(record_at(ring, p), 8) < MT_DATA_CODE;
    return n;
}

/* a stamp of the tracer's own: the epoch's next value (the stubs' lock xadd) */
uint32_t mt_epoch_take(uint32_t *epoch)
{
    return __atomic_fetch_add(epoch, 1, __ATOMIC_SEQ_CST);
}

/* The ring pool's atomic updates from the tracer's side (layout.h "Ring
 * pool"; rings/rings.py and ring_pool.py): the target's threads change the
 * same words with lock cmpxchg and lock cmpxchg16b, so the tracer does too.
 * mt_slot_cas: the slot-table entry at slot (16-byte aligned) becomes {key,
 * ring} = {new_key, new_ring} if it is {old_key, old_ring}; mt_word_cas: a
 * u64 becomes new if it is old.  Each returns 1 if it did, else 0. */
int mt_slot_cas(uint64_t *slot, uint64_t old_key, uint64_t old_ring, uint64_t new_key,
                uint64_t new_ring)
{
    unsigned char done;
    __asm__ __volatile__("lock cmpxchg16b %1\n\tsete %0"
                         : "=q"(done), "+m"(*(volatile unsigned __int128 *)slot),
                           "+a"(old_key), "+d"(old_ring)
                         : "b"(new_key), "c"(new_ring)
                         : "memory", "cc");
    return done;
}

int mt_word_cas(uint64_t *word, uint64_t old, uint64_t new)
{
    return __atomic_compare_exchange_n(word, &old, new, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}
