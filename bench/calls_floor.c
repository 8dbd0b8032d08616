// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * The floor under any tracer that writes madtrace's call records, on this
 * machine (bench/bench_calls.py prints it beside the tracers).
 *
 *   calls_floor MODE N [FILE]
 *
 * Runs the loop of tests/progs/bench_calls.c (N calls of wrapper(i), which
 * calls leaf(i)), with what a tracer must do at least around each call of
 * leaf compiled into wrapper itself: no trampoline, no register saved, no
 * thread looked up.
 *
 *   native        nothing
 *   writes        an entry and an exit record (16 bytes each: timestamp 0,
 *                 code, low half of the stack pointer) into a 4 MiB ring in
 *                 memory; nobody reads them (the ring wraps)
 *   writes-tsc    the same with a timestamp (rdtsc) in each record
 *   file          the records of `writes` also go to FILE: a second thread
 *                 writes them out as they come (1 MiB at a time, at once
 *                 again while the ring fills fast, else every 200 us, like
 *                 madtrace's drain) and the writer waits when the ring is full
 *   file-tsc      the same with timestamps
 *
 * Prints the checksum line of bench_calls to stdout and the loop's own time
 * per call (ns) to stderr.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

#define TRACED __attribute__((noinline, noclone, noipa))
#define RECORDS (1u << 18)            /* 4 MiB of 16-byte records, as a madtrace ring */
#define MASK (RECORDS - 1)
#define PIECE (1u << 16)              /* records per write */

struct record {
    uint64_t tsc;
    uint64_t code_rsp;
};

static struct {
    uint64_t head;                    /* written by the writer */
    uint64_t limit;                   /* written by the drain: tail + RECORDS */
    char pad[48];
    uint64_t tail;                    /* written by the drain */
} ring __attribute__((aligned(64)));
static struct record *records;
static int timestamps, bounded, stop;

static inline void record(uint32_t code)
{
    uint64_t h = __atomic_load_n(&ring.head, __ATOMIC_RELAXED);
    if (bounded)
        while (h >= __atomic_load_n(&ring.limit, __ATOMIC_ACQUIRE))
            __builtin_ia32_pause();
    struct record *r = &records[h & MASK];
    r->tsc = timestamps ? __rdtsc() : 0;
    r->code_rsp = code | (uint64_t)(uint32_t)(uintptr_t)__builtin_frame_address(0) << 32;
    __atomic_store_n(&ring.head, h + 1, __ATOMIC_RELEASE);
}

TRACED unsigned long leaf(unsigned long i)
{
    return i * 2654435761UL ^ (i >> 7);
}

TRACED unsigned long wrapper(unsigned long i)
{
    return leaf(i) + (i & 3);
}

TRACED unsigned long wrapper_recorded(unsigned long i)
{
    record(0);
    unsigned long r = leaf(i);
    record(1);
    return r + (i & 3);
}

static int out_fd = -1;

static void *drain(void *unused)
{
    (void)unused;
    for (;;) {
        uint64_t head = __atomic_load_n(&ring.head, __ATOMIC_ACQUIRE), tail = ring.tail;
        int stopping = __atomic_load_n(&stop, __ATOMIC_ACQUIRE);
        uint64_t moved = head - tail;
        while (tail != head) {
            uint64_t index = tail & MASK, n = head - tail;
            if (n > RECORDS - index)
                n = RECORDS - index;
            if (n > PIECE)
                n = PIECE;
            if (write(out_fd, &records[index], n * sizeof(struct record)) !=
                (ssize_t)(n * sizeof(struct record))) {
                perror("write");
                exit(1);
            }
            tail += n;
            __atomic_store_n(&ring.tail, tail, __ATOMIC_RELEASE);
            __atomic_store_n(&ring.limit, tail + RECORDS, __ATOMIC_RELEASE);
        }
        if (stopping && moved == 0)
            return NULL;
        if (moved < RECORDS / 16)
            usleep(200);
    }
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: calls_floor native|writes|writes-tsc|file|file-tsc N [FILE]\n");
        return 2;
    }
    const char *mode = argv[1];
    unsigned long n = strtoul(argv[2], NULL, 10);
    int native = !strcmp(mode, "native");
    int to_file = !strncmp(mode, "file", 4);
    timestamps = strstr(mode, "tsc") != NULL;
    records = aligned_alloc(4096, RECORDS * sizeof(struct record));
    memset(records, 0, RECORDS * sizeof(struct record));
    ring.limit = RECORDS;
    pthread_t drainer;
    if (to_file) {
        if (argc < 4) {
            fprintf(stderr, "calls_floor: %s needs a FILE\n", mode);
            return 2;
        }
        out_fd = open(argv[3], O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
        if (out_fd < 0) {
            perror(argv[3]);
            return 1;
        }
        bounded = 1;
        pthread_create(&drainer, NULL, drain, NULL);
    }
    unsigned long sum = 0;
    double t0 = now();
    if (native)
        for (unsigned long i = 0; i < n; i++)
            sum += wrapper(i);
    else
        for (unsigned long i = 0; i < n; i++)
            sum += wrapper_recorded(i);
    double t1 = now();
    if (to_file) {
        __atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
        pthread_join(drainer, NULL);
        close(out_fd);
    }
    printf("bench_calls n=%lu checksum=%lu\n", n, sum);
    fprintf(stderr, "loop %.3f ns/call\n", (t1 - t0) / (n ? n : 1));
    return 0;
}
