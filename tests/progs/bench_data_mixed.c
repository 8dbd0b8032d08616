/* SPDX-License-Identifier: GPL-2.0-or-later */
/* Data-tracing benchmark, mixed paths: ROUNDS (argv[1]) passes over a global
 * int array of N elements (argv[2]), a load and a store per element (code a
 * rewriter can give probes), and after every 256 elements one `rep movsq`
 * copying 8 quadwords between two global buffers (a string instruction: it
 * stays on the fault path).  Deterministic output. */
#include <stdio.h>
#include <stdlib.h>

#define MAX_N 65536
int values[MAX_N];
long from[8] = {1, 2, 3, 4, 5, 6, 7, 8}, to[8];

__attribute__((noinline)) static void copy8(void) {
    long *d = to, *s = from;
    long n = 8;
    __asm__ volatile("rep movsq" : "+D"(d), "+S"(s), "+c"(n) : : "memory");
}

__attribute__((noinline)) static unsigned pass(int n, unsigned s) {
    for (int i = 0; i < n; i++) {
        s += (unsigned)values[i];
        values[i] = (int)(s & 0xffff);
        if ((i & 255) == 255) {
            copy8();
            from[i & 7] += to[(i + 1) & 7];
        }
    }
    return s;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 100;
    int n = argc > 2 ? atoi(argv[2]) : 4096;
    if (rounds < 0 || n < 1 || n > MAX_N) {
        fprintf(stderr, "usage: %s [rounds] [n 1..%d]\n", argv[0], MAX_N);
        return 2;
    }
    unsigned s = 1;
    for (int r = 0; r < rounds; r++) s = pass(n, s + (unsigned)r);
    printf("rounds %d n %d: %u %ld\n", rounds, n, s, from[3]);
    return 0;
}
