// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * Per-call overhead benchmark (bench/bench_calls.py).
 *
 *   bench_calls N
 *
 * Calls wrapper(i) N times; wrapper calls the tiny function leaf(i) with a
 * real call (its result is used afterwards, so it is not a tail jump) and
 * prints a checksum.  Trace "-f leaf": N calls.
 */
#include <stdio.h>
#include <stdlib.h>

#define TRACED __attribute__((noinline, noclone, noipa))

TRACED unsigned long leaf(unsigned long i) {
    return i * 2654435761UL ^ (i >> 7);
}

TRACED unsigned long wrapper(unsigned long i) {
    return leaf(i) + (i & 3);
}

int main(int argc, char **argv) {
    unsigned long n = argc > 1 ? strtoul(argv[1], NULL, 10) : 1000000;
    unsigned long sum = 0;
    for (unsigned long i = 0; i < n; i++)
        sum += wrapper(i);
    printf("bench_calls n=%lu checksum=%lu\n", n, sum);
    return 0;
}
