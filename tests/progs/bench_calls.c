// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * Per-call overhead benchmark (bench/bench_calls.py).
 *
 *   bench_calls N
 *
 * Calls wrapper(i) N times; wrapper calls the tiny function leaf(i) with a
 * real call (its result is used afterwards, so it is not a tail jump) and
 * prints a checksum.  Trace "-f leaf": N calls.  With BENCH_CALLS_LOOP set in
 * the environment it also prints the loop's own time per call (ns) to stderr:
 * how much slower the traced program itself runs, start-up and the tracer's
 * end left out.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define TRACED __attribute__((noinline, noclone, noipa))

TRACED unsigned long leaf(unsigned long i) {
    return i * 2654435761UL ^ (i >> 7);
}

TRACED unsigned long wrapper(unsigned long i) {
    return leaf(i) + (i & 3);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

int main(int argc, char **argv) {
    unsigned long n = argc > 1 ? strtoul(argv[1], NULL, 10) : 1000000;
    unsigned long sum = 0;
    double start = now();
    for (unsigned long i = 0; i < n; i++)
        sum += wrapper(i);
    double end = now();
    printf("bench_calls n=%lu checksum=%lu\n", n, sum);
    if (getenv("BENCH_CALLS_LOOP"))
        fprintf(stderr, "loop %.3f ns/call\n", (end - start) / (n ? n : 1));
    return 0;
}
