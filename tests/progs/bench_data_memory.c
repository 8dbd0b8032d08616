/* SPDX-License-Identifier: GPL-2.0-or-later */
/* Data-tracing benchmark, memory-heavy: ROUNDS (argv[1], default 1000)
 * passes over a global int array of N elements (argv[2], default 4096).  Each
 * pass loads and stores every element; the running sum carried from element
 * to element keeps the loop scalar (one load and one store per element at
 * -O2).  Deterministic output. */
#include <stdio.h>
#include <stdlib.h>

#define MAX_N 65536
int values[MAX_N];                   /* .bss */
long checksum = 1;                   /* .data */

__attribute__((noinline)) static void fill(int n) {
    for (int i = 0; i < n; i++) values[i] = i;
}

__attribute__((noinline)) static void pass(int n, int round) {
    unsigned s = (unsigned)checksum;
    for (int i = 0; i < n; i++) {
        s += (unsigned)values[i];
        values[i] = (int)((s ^ (unsigned)round) & 0xffff);
    }
    checksum = s;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 1000;
    int n = argc > 2 ? atoi(argv[2]) : 4096;
    if (rounds < 0 || n < 1 || n > MAX_N) {
        fprintf(stderr, "usage: %s [rounds] [n 1..%d]\n", argv[0], MAX_N);
        return 2;
    }
    fill(n);
    for (int r = 0; r < rounds; r++)
        pass(n, r);
    printf("rounds %d n %d: checksum %ld, values[%d] = %d\n", rounds, n, checksum, n - 1,
           values[n - 1]);
    return 0;
}
