// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * Function-tracing test program: traced functions called from several
 * threads at once.
 *
 *   calls_threads [THREADS [N]]      (defaults THREADS=4, N=3000)
 *
 * Thread k (1..THREADS) calls work() N*k times; work() calls leaf_op() and,
 * every 16th time, malloc/free.  The main thread calls work() N times too.
 * The counts are fixed by the arguments, whatever the interleaving; the
 * last line, "calls: ...", is the program's own (atomic) count.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define TRACED __attribute__((noinline, noclone, noipa))

unsigned long n_work, n_leaf_op, n_thread_main;
static long iterations;
static unsigned long results[65];

#define COUNT(c) __atomic_fetch_add(&(c), 1, __ATOMIC_RELAXED)

TRACED unsigned long leaf_op(unsigned long x) {
    COUNT(n_leaf_op);
    return x * 6364136223846793005UL + 1442695040888963407UL;
}

TRACED unsigned long work(unsigned long x, long i) {
    COUNT(n_work);
    x = leaf_op(x ^ (unsigned long)i);
    if ((i & 15) == 0) {
        unsigned long *p = malloc(sizeof *p * 4);
        p[0] = x;
        __asm__ volatile("" : : "r"(p) : "memory");
        x += p[0] >> 7;
        free(p);
    }
    return x;
}

TRACED void *thread_main(void *arg) {
    COUNT(n_thread_main);
    long id = (long)arg;
    unsigned long x = (unsigned long)id;
    for (long i = 0; i < iterations * id; i++)
        x = work(x, i);
    results[id] = x;
    return NULL;
}

int main(int argc, char **argv) {
    long nthreads = argc > 1 ? atol(argv[1]) : 4;
    iterations = argc > 2 ? atol(argv[2]) : 3000;
    if (nthreads < 1 || nthreads > 64)
        return 2;
    pthread_t tids[64];
    for (long t = 0; t < nthreads; t++)
        if (pthread_create(&tids[t], NULL, thread_main, (void *)(t + 1)) != 0)
            return 3;
    unsigned long x = 0;
    for (long i = 0; i < iterations; i++)
        x = work(x, i);
    results[0] = x;
    unsigned long sum = 0;
    for (long t = 0; t < nthreads; t++)
        pthread_join(tids[t], NULL);
    for (long t = 0; t <= nthreads; t++)
        sum ^= results[t] + (unsigned long)t;
    printf("result: threads=%ld n=%ld checksum=%lu\n", nthreads, iterations, sum);
    printf("calls: work=%lu leaf_op=%lu thread_main=%lu\n", n_work, n_leaf_op, n_thread_main);
    return 0;
}
