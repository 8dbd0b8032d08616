// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * The drain of the call rings as two threads of C, which never wait for
 * Python's GIL: the drain thread takes the records of every registered ring
 * out into buffers (mt_drain_ring_take, ring_drain.c), and the writer thread
 * appends the buffers to their files (mt_write_chunks), in order.
 *
 * Why: the drain, in Python, ran at the mercy of the tracer's other threads.
 * A thread holding the GIL for 10-35 ms (an import, a conversion) let a ring
 * of 4 MiB fill (~3 ms at full speed) and its writer wait; the Python part of
 * each pass was a third of the drain's CPU, and every new buffer's pages were
 * zeroed by the kernel.  Here a pass is a loop over a table, buffers are kept
 * for the next takes, and Python only tells the table what changed
 * (madtrace/rings/native_drain.py, its one user).
 *
 * What stays Python's (madtrace/rings/rings.py, ring_pool.py): registering
 * rings, the pool's claims, and a ring whose owner changed (MT_RING_OWNERS_W
 * != MT_RING_OWNERS_R): the thread leaves it alone, since records past the
 * hand-over belong to another file; Python drains it up to the boundary
 * (mt_drainer_take) and names the new file.  Every take, the thread's or
 * Python's, holds the drainer's lock, so a ring is taken by one at a time and
 * each file's records are queued in their order.
 *
 * Up to `limit` bytes of buffers wait for the disk; beyond, nothing more is
 * taken until the disk catches up (the writers in the target wait, then
 * drop, counted).  A write error is kept (mt_drainer_error); what is queued
 * after it is let go.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "capture_format.h"
#include "layout.h"

int mt_drain_ring_take(uint8_t *ring, uint8_t *dst, uint64_t max_records, uint64_t *counts,
                       uint64_t from, uint64_t to, int recording, uint64_t *moved, uint64_t upto);
int mt_write_chunks(int fd, const uint8_t *data, uint64_t size, uint64_t *written);

#define PATH_BYTES 4096
#define SMALL_BYTES (64u << 10)      /* the smallest buffer kept; below, a take's own */
#define SIZE_CLASSES 48
/* The writer yields the CPU to the drain and the program: a burst's records
 * wait in buffers (up to the bound) while the drain keeps the rings empty; on
 * 2 CPUs, the program, the drain and the writer at equal priority left the
 * drain a CPU two thirds of the time, and the program's ring filled. */
#define WRITER_NICE 5

struct mt_record_file {              /* calls/<tid>.rec: opened at its first records */
    char path[PATH_BYTES];
    int fd;                          /* -1: not opened yet */
};

struct item {                        /* queued for the writer */
    struct item *next;
    struct mt_record_file *file;
    uint8_t *buf;                    /* NULL: close the file (and free it) */
    uint64_t size, capacity;
};

struct entry {                       /* a ring the thread drains (index: the ring's) */
    uint8_t *ring;                   /* the tracer's address of the ring block; NULL: none */
    struct mt_record_file *file;
    int recording;                   /* LIMIT is published with TAIL */
    uint64_t moved, peak;            /* since mt_drainer_collect */
};

struct mt_drainer {
    pthread_mutex_t lock;            /* entries, counts, takes (recursive: Python nests) */
    struct entry entries[MT_SLOTS];
    uint64_t *counts, from, to;      /* the drain's code counters (ring_drain.c) */
    volatile uint8_t *nowait;        /* the control block's MT_CTL_NOWAIT */
    int active;                      /* the thread takes records (not while split) */
    pthread_t thread;
    int running, stop;
    uint64_t interval_ns, idle_max_ns;
    int failed_err, failed_index;    /* the thread's pass failed there: it stopped taking */

    pthread_mutex_t spill;           /* the queue, the buffers, the writer's state */
    pthread_cond_t wake, done;
    struct item *head, *tail;
    struct item *free[SIZE_CLASSES]; /* written buffers kept, by log2 of their size */
    uint64_t pending, limit, keep, kept;
    int writing, closing, error;
    char error_path[PATH_BYTES];
    pthread_t writer;
    int writer_running;
};

/* a new calls/<tid>.rec's header (trace/format.py CALL_RECORDS, through the
 * generated capture_format.h: computed in Python inside a stop of the target,
 * its import took 3 ms of it) */
static const uint8_t call_header[MT_CAPTURE_HEADER_SIZE] = MT_CALL_RECORDS_HEADER;

static int log2_ceil(uint64_t n)
{
    int k = 0;
    while ((1ull << k) < n)
        k++;
    return k;
}

/* ------------------------------------------------------------- the writer */

static int open_file(struct mt_record_file *f)
{
    int fd = open(f->path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return -errno;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = -errno;
        close(fd);
        return err;
    }
    if (st.st_size == 0) {
        ssize_t w = write(fd, call_header, sizeof call_header);
        if (w != (ssize_t)sizeof call_header) {
            int err = w < 0 ? -errno : -EIO;
            close(fd);
            return err;
        }
    }
    f->fd = fd;
    return 0;
}

static int write_item(struct mt_drainer *d, struct item *it)
{
    if (!it->buf) {
        if (it->file->fd >= 0)
            close(it->file->fd);
        free(it->file);
        return 0;
    }
    if (d->error)
        return 0;                    /* let go: recording stops at the first error */
    int err = it->file->fd >= 0 ? 0 : open_file(it->file);
    uint64_t written;
    if (!err)
        err = mt_write_chunks(it->file->fd, it->buf, it->size, &written);
    return err;
}

static void keep_or_free(struct mt_drainer *d, struct item *it)
{
    if (it->buf && it->capacity >= SMALL_BYTES && d->kept + it->capacity <= d->keep) {
        int k = log2_ceil(it->capacity);
        it->next = d->free[k];
        d->free[k] = it;
        d->kept += it->capacity;
        return;
    }
    free(it->buf);
    free(it);
}

/* The tracer's signals (SIGINT, SIGTERM, SIGCHLD) are for its Python threads. */
static void block_signals(void)
{
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
}

static void *writer_main(void *arg)
{
    struct mt_drainer *d = arg;
    block_signals();
    pthread_setname_np(pthread_self(), "madtrace-write");
    int nice = getpriority(PRIO_PROCESS, 0);   /* best effort: the writer only runs later */
    (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), nice + WRITER_NICE);
    pthread_mutex_lock(&d->spill);
    for (;;) {
        while (!d->head && !d->closing)
            pthread_cond_wait(&d->wake, &d->spill);
        struct item *it = d->head;
        if (!it)
            break;
        d->head = it->next;
        if (!d->head)
            d->tail = NULL;
        d->writing = 1;
        pthread_mutex_unlock(&d->spill);
        int err = write_item(d, it);
        pthread_mutex_lock(&d->spill);
        if (err && !d->error) {
            d->error = err;
            memcpy(d->error_path, it->file->path, PATH_BYTES);
        }
        d->writing = 0;
        if (it->buf)
            d->pending -= it->capacity;
        keep_or_free(d, it);
        pthread_cond_broadcast(&d->done);
    }
    pthread_mutex_unlock(&d->spill);
    return NULL;
}

static void enqueue(struct mt_drainer *d, struct item *it)
{
    it->next = NULL;
    pthread_mutex_lock(&d->spill);
    if (it->buf)
        d->pending += it->capacity;
    if (d->tail)
        d->tail->next = it;
    else
        d->head = it;
    d->tail = it;
    pthread_cond_signal(&d->wake);
    pthread_mutex_unlock(&d->spill);
}

/* A buffer for n bytes (a kept one of the next power of two if there is one):
 * NULL if the bound leaves no room for it, or memory is short. */
static struct item *buffer_for(struct mt_drainer *d, uint64_t n)
{
    uint64_t capacity = n < SMALL_BYTES ? n : 1ull << log2_ceil(n);
    struct item *it = NULL;
    pthread_mutex_lock(&d->spill);
    if (capacity >= SMALL_BYTES && d->free[log2_ceil(capacity)]) {
        it = d->free[log2_ceil(capacity)];
        d->free[log2_ceil(capacity)] = it->next;
        d->kept -= it->capacity;
    }
    pthread_mutex_unlock(&d->spill);
    if (it)
        return it;
    it = malloc(sizeof *it);
    if (!it)
        return NULL;
    it->buf = malloc(capacity);
    if (!it->buf) {
        free(it);
        return NULL;
    }
    it->capacity = capacity;
    return it;
}

/* Records the bound lets one take have now. */
static uint64_t room(struct mt_drainer *d)
{
    pthread_mutex_lock(&d->spill);
    uint64_t bytes = d->pending < d->limit ? d->limit - d->pending : 0;
    pthread_mutex_unlock(&d->spill);
    if (bytes > (uint64_t)MT_RING_RECORDS * MT_RECORD_SIZE)
        bytes = (uint64_t)MT_RING_RECORDS * MT_RECORD_SIZE;
    return bytes / MT_RECORD_SIZE;
}

/* --------------------------------------------------------------- the takes */

static inline uint64_t ring_u64(const uint8_t *ring, int offset)
{
    return __atomic_load_n((const uint64_t *)(ring + offset), __ATOMIC_ACQUIRE);
}

/* The records of entry e below upto, to its file; *moved: how many.  Returns 0,
 * -EPROTO (HEAD more than a ring ahead of TAIL), or -ENOMEM. */
static int take(struct mt_drainer *d, struct entry *e, uint64_t upto, uint64_t *moved)
{
    *moved = 0;
    uint64_t head = ring_u64(e->ring, MT_RING_HEAD);
    uint64_t tail = ring_u64(e->ring, MT_RING_TAIL);
    if (upto < head)
        head = upto;
    if (head <= tail)
        return 0;
    uint64_t used = head - tail;
    if (used > e->peak)
        e->peak = used;
    if (used > MT_RING_RECORDS)
        return -EPROTO;
    uint64_t n = room(d);
    if (n > used)
        n = used;
    if (!n)
        return 0;
    struct item *it = buffer_for(d, n * MT_RECORD_SIZE);
    if (!it)
        return -ENOMEM;
    int err = mt_drain_ring_take(e->ring, it->buf, n, d->counts, d->from, d->to, e->recording,
                                 moved, head);
    if (err || !*moved) {
        free(it->buf);
        free(it);
        return err;
    }
    it->file = e->file;
    it->size = *moved * MT_RECORD_SIZE;
    e->moved += *moved;
    enqueue(d, it);
    return 0;
}

/* Every ring whose owner did not change since Python last looked, up to its
 * HEAD now.  The lock is held.  Returns the records moved, or -errno of the
 * first ring that failed (in *failed: its index). */
static int64_t pass(struct mt_drainer *d, int *failed)
{
    uint64_t total = 0;
    for (int i = 0; i < MT_SLOTS; i++) {
        struct entry *e = &d->entries[i];
        if (!e->ring)
            continue;
        /* HEAD first: a new owner is recorded before its first record */
        uint64_t head = ring_u64(e->ring, MT_RING_HEAD);
        if (ring_u64(e->ring, MT_RING_OWNERS_W) != ring_u64(e->ring, MT_RING_OWNERS_R))
            continue;
        uint64_t moved;
        int err = take(d, e, head, &moved);
        if (err) {
            *failed = i;
            return err;
        }
        total += moved;
    }
    if (d->nowait && *d->nowait)
        *d->nowait = 0;              /* writers may wait again: the drain is alive */
    return (int64_t)total;
}

static void *drain_main(void *arg)
{
    struct mt_drainer *d = arg;
    block_signals();
    pthread_setname_np(pthread_self(), "madtrace-drain");
    uint64_t idle = d->interval_ns;
    for (;;) {
        pthread_mutex_lock(&d->lock);
        if (d->stop) {
            pthread_mutex_unlock(&d->lock);
            break;
        }
        int failed = -1;
        int64_t moved = d->active ? pass(d, &failed) : 0;
        pthread_mutex_unlock(&d->lock);
        if (moved < 0) {             /* said by Python (mt_drainer_failed) */
            pthread_mutex_lock(&d->lock);
            d->failed_err = (int)moved;
            d->failed_index = failed;
            d->active = 0;
            pthread_mutex_unlock(&d->lock);
            continue;
        }
        if ((uint64_t)moved >= MT_RING_RECORDS / 16) {
            idle = d->interval_ns;   /* a ring fills fast: again at once */
            continue;
        }
        idle = moved ? d->interval_ns : (idle * 2 < d->idle_max_ns ? idle * 2 : d->idle_max_ns);
        struct timespec ts = {(time_t)(idle / 1000000000u), (long)(idle % 1000000000u)};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

/* ----------------------------------------------------------- Python's side */

struct mt_drainer *mt_drainer_new(uint8_t *nowait, uint64_t limit, uint64_t keep)
{
    struct mt_drainer *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&d->lock, &attr);
    pthread_mutexattr_destroy(&attr);
    pthread_mutex_init(&d->spill, NULL);
    pthread_cond_init(&d->wake, NULL);
    pthread_cond_init(&d->done, NULL);
    d->nowait = nowait;
    d->limit = limit;
    d->keep = keep;
    d->to = d->from = 0;
    if (pthread_create(&d->writer, NULL, writer_main, d) != 0) {
        free(d);
        return NULL;
    }
    d->writer_running = 1;
    return d;
}

void mt_drainer_lock(struct mt_drainer *d) { pthread_mutex_lock(&d->lock); }
void mt_drainer_unlock(struct mt_drainer *d) { pthread_mutex_unlock(&d->lock); }

/* The code counters of the takes (ring_drain.c count_codes); the caller holds
 * the lock while it moves the counts to a new array. */
void mt_drainer_set_counts(struct mt_drainer *d, uint64_t *counts, uint64_t from, uint64_t to)
{
    pthread_mutex_lock(&d->lock);
    d->counts = counts;
    d->from = from;
    d->to = to;
    pthread_mutex_unlock(&d->lock);
}

/* Ring `index` (the tracer's address `ring`, NULL: none any more) drained to
 * `file`; the entry's counts since the last collect go (collect first). */
void mt_drainer_set_ring(struct mt_drainer *d, int index, uint8_t *ring,
                         struct mt_record_file *file, int recording)
{
    pthread_mutex_lock(&d->lock);
    struct entry *e = &d->entries[index];
    e->ring = ring;
    e->file = file;
    e->recording = recording;
    e->moved = e->peak = 0;
    pthread_mutex_unlock(&d->lock);
}

/* LIMIT of `ring` (TAIL + its size while recording, else 0), with the takes
 * of entry `index` (-1: a ring not in the table) publishing it or not. */
void mt_drainer_set_limit(struct mt_drainer *d, int index, uint8_t *ring, int recording)
{
    pthread_mutex_lock(&d->lock);
    if (index >= 0)
        d->entries[index].recording = recording;
    uint64_t tail = ring_u64(ring, MT_RING_TAIL);
    __atomic_store_n((uint64_t *)(ring + MT_RING_LIMIT), recording ? tail + MT_RING_RECORDS : 0,
                     __ATOMIC_RELEASE);
    pthread_mutex_unlock(&d->lock);
}

/* The records of entry `index` below upto (UINT64_MAX: all), now, whatever its
 * owners (Python follows them).  Returns 0, -EPROTO or -ENOMEM; *moved. */
int mt_drainer_take(struct mt_drainer *d, int index, uint64_t upto, uint64_t *moved)
{
    pthread_mutex_lock(&d->lock);
    int err = d->entries[index].ring ? take(d, &d->entries[index], upto, moved) : 0;
    pthread_mutex_unlock(&d->lock);
    return err;
}

/* A pass now, in the caller's thread (rings whose owner changed are left to
 * the caller).  Returns the records moved, or -errno with *failed set. */
int64_t mt_drainer_pass(struct mt_drainer *d, int *failed)
{
    pthread_mutex_lock(&d->lock);
    int64_t moved = pass(d, failed);
    pthread_mutex_unlock(&d->lock);
    return moved;
}

/* moved[i], peak[i]: entry i's records moved and its fullest take since the
 * last collect (then zero). */
void mt_drainer_collect(struct mt_drainer *d, uint64_t *moved, uint64_t *peak)
{
    pthread_mutex_lock(&d->lock);
    for (int i = 0; i < MT_SLOTS; i++) {
        moved[i] = d->entries[i].moved;
        peak[i] = d->entries[i].peak;
        d->entries[i].moved = d->entries[i].peak = 0;
    }
    pthread_mutex_unlock(&d->lock);
}

/* The thread takes records (active) or leaves every ring to Python. */
void mt_drainer_set_active(struct mt_drainer *d, int active)
{
    pthread_mutex_lock(&d->lock);
    d->active = active;
    pthread_mutex_unlock(&d->lock);
}

int mt_drainer_active(struct mt_drainer *d)
{
    return __atomic_load_n(&d->active, __ATOMIC_ACQUIRE);
}

int mt_drainer_start(struct mt_drainer *d, uint64_t interval_ns, uint64_t idle_max_ns)
{
    d->interval_ns = interval_ns;
    d->idle_max_ns = idle_max_ns;
    d->stop = 0;
    int err = pthread_create(&d->thread, NULL, drain_main, d);
    if (err)
        return -err;
    d->running = 1;
    return 0;
}

/* The drain thread ends (its pass done); the writer goes on. */
void mt_drainer_stop(struct mt_drainer *d)
{
    if (!d->running)
        return;
    pthread_mutex_lock(&d->lock);
    d->stop = 1;
    pthread_mutex_unlock(&d->lock);
    pthread_join(d->thread, NULL);
    d->running = 0;
}

/* The thread's failed pass: -errno (0: none), *index: the ring's. */
int mt_drainer_failed(struct mt_drainer *d, int *index)
{
    pthread_mutex_lock(&d->lock);
    int err = d->failed_err;
    *index = d->failed_index;
    pthread_mutex_unlock(&d->lock);
    return err;
}

/* A record file (path: calls/<tid>.rec), opened by the writer at its first records. */
struct mt_record_file *mt_drainer_file(struct mt_drainer *d, const char *path)
{
    (void)d;
    struct mt_record_file *f = malloc(sizeof *f);
    if (!f)
        return NULL;
    strncpy(f->path, path, PATH_BYTES - 1);
    f->path[PATH_BYTES - 1] = 0;
    f->fd = -1;
    return f;
}

/* The file is closed once what is queued for it is written (and freed: not used after). */
int mt_drainer_close_file(struct mt_drainer *d, struct mt_record_file *f)
{
    struct item *it = calloc(1, sizeof *it);
    if (!it)
        return -ENOMEM;
    it->file = f;
    enqueue(d, it);
    return 0;
}

/* Returns once everything queued is written (or let go after an error). */
void mt_drainer_flush(struct mt_drainer *d)
{
    pthread_mutex_lock(&d->spill);
    while (d->head || d->writing)
        pthread_cond_wait(&d->done, &d->spill);
    pthread_mutex_unlock(&d->spill);
}

uint64_t mt_drainer_pending(struct mt_drainer *d)
{
    pthread_mutex_lock(&d->spill);
    uint64_t pending = d->pending;
    pthread_mutex_unlock(&d->spill);
    return pending;
}

/* The writer's first error (-errno, 0: none), its file's path in path. */
int mt_drainer_error(struct mt_drainer *d, char *path, uint64_t size)
{
    pthread_mutex_lock(&d->spill);
    int err = d->error;
    if (err && size) {
        strncpy(path, d->error_path, size - 1);
        path[size - 1] = 0;
    }
    pthread_mutex_unlock(&d->spill);
    return err;
}

/* Both threads ended (everything queued written, the files closed), the
 * memory freed: d is not used after. */
void mt_drainer_free(struct mt_drainer *d)
{
    mt_drainer_stop(d);
    pthread_mutex_lock(&d->spill);
    d->closing = 1;
    pthread_cond_signal(&d->wake);
    pthread_mutex_unlock(&d->spill);
    if (d->writer_running)
        pthread_join(d->writer, NULL);
    for (int k = 0; k < SIZE_CLASSES; k++)
        while (d->free[k]) {
            struct item *it = d->free[k];
            d->free[k] = it->next;
            free(it->buf);
            free(it);
        }
    pthread_mutex_destroy(&d->lock);
    pthread_mutex_destroy(&d->spill);
    pthread_cond_destroy(&d->wake);
    pthread_cond_destroy(&d->done);
    free(d);
}
