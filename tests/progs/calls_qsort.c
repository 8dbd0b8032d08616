// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * Function-tracing test program: a comparator called back by libc.
 *
 *   calls_qsort [N [ROUNDS]]      (defaults N=1000, ROUNDS=3)
 *
 * Each round fills an array from a fixed linear congruential generator, sorts
 * it with qsort(cmp_int) and looks up every 8th original value with
 * bsearch(cmp_key).  Both comparators are called from inside libc only (by
 * address, not through any PLT).  The last line, "calls: ...", counts their
 * entries (deterministic: same input, same glibc).
 */
#include <stdio.h>
#include <stdlib.h>

#define TRACED __attribute__((noinline, noclone, noipa))

unsigned long n_cmp_int, n_cmp_key, n_check_sorted;

TRACED int cmp_int(const void *a, const void *b) {
    n_cmp_int++;
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

TRACED int cmp_key(const void *key, const void *elem) {
    n_cmp_key++;
    int x = *(const int *)key, y = *(const int *)elem;
    return (x > y) - (x < y);
}

TRACED int check_sorted(const int *v, long n) {
    n_check_sorted++;
    for (long i = 1; i < n; i++)
        if (v[i - 1] > v[i])
            return 0;
    return 1;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000;
    int rounds = argc > 2 ? atoi(argv[2]) : 3;
    int *v = malloc(sizeof *v * (size_t)n), *orig = malloc(sizeof *v * (size_t)n);
    unsigned long seed = 12345, found = 0, sum = 0;
    int ok = 1;
    for (int r = 0; r < rounds; r++) {
        for (long i = 0; i < n; i++) {
            seed = seed * 6364136223846793005UL + 1442695040888963407UL;
            v[i] = orig[i] = (int)((seed >> 33) % 100000);
        }
        qsort(v, (size_t)n, sizeof *v, cmp_int);
        ok &= check_sorted(v, n);
        for (long i = 0; i < n; i += 8) {
            int *hit = bsearch(&orig[i], v, (size_t)n, sizeof *v, cmp_key);
            found += hit != NULL;
        }
        sum += (unsigned long)v[0] + (unsigned long)v[n / 2] + (unsigned long)v[n - 1];
    }
    printf("result: n=%ld rounds=%d sorted=%d found=%lu sum=%lu\n", n, rounds, ok, found, sum);
    printf("calls: cmp_int=%lu cmp_key=%lu check_sorted=%lu\n", n_cmp_int, n_cmp_key,
           n_check_sorted);
    free(v);
    free(orig);
    return 0;
}
