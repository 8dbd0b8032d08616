// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * Function-tracing test program: library calls through the PLT.
 *
 *   calls_plt [N]      (default N=2000)
 *
 * Each iteration calls malloc, strlen, free (and every 4th one realloc and
 * calloc) directly through the PLT, and calls strdup, which calls malloc and
 * strlen inside libc (libc's own calls, not through our PLT).  Every 100th
 * iteration prints a line with printf ("%s" makes libc call strlen again).
 * The program's own direct calls are in the "direct:" line; libc's internal
 * calls add exactly 1 malloc and 1 strlen per strdup (what test_oracles.py
 * checks, from two values of N).  The compiler cannot merge or drop any of
 * these calls: the buffers escape into noipa functions.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TRACED __attribute__((noinline, noclone, noipa))

unsigned long d_malloc, d_free, d_strlen, d_realloc, d_calloc, d_strdup, n_fill;

TRACED void fill(char *p, long len, long seed) {
    n_fill++;
    for (long i = 0; i < len; i++)
        p[i] = (char)('a' + (seed + i * 7) % 26);
    p[len] = 0;
}

TRACED unsigned long mix(const char *p, unsigned long h) {
    for (; *p; p++)
        h = h * 31 + (unsigned char)*p;
    return h;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 2000;
    unsigned long h = 5381;
    for (long i = 0; i < n; i++) {
        long len = 8 + i % 40;
        char *p = malloc((size_t)len + 1);
        d_malloc++;
        fill(p, len, i);
        h += strlen(p);
        d_strlen++;
        char *q = strdup(p);
        d_strdup++;
        h = mix(q, h);
        if (i % 4 == 0) {
            q = realloc(q, (size_t)len * 2 + 1);
            d_realloc++;
            char *z = calloc(4, 8);
            d_calloc++;
            h = mix(z, h) + 1;
            free(z);
            d_free++;
        }
        if (i % 100 == 0)
            printf("line %ld %s\n", i, q);
        free(q);
        free(p);
        d_free += 2;
    }
    printf("result: n=%ld hash=%lu\n", n, h);
    printf("direct: malloc=%lu free=%lu strlen=%lu realloc=%lu calloc=%lu strdup=%lu\n",
           d_malloc, d_free, d_strlen, d_realloc, d_calloc, d_strdup);
    printf("calls: fill=%lu\n", n_fill);
    return 0;
}
