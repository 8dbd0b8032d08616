/* Allocation and block-copy churn, for the hybrid engine's hook stubs: ROUNDS
 * rounds of malloc, a fill loop, memcpy (heap to heap, heap to a global),
 * memset of a global and free.  The number of ptrace stops must not
 * grow with ROUNDS.  Usage: hooks_churn [ROUNDS]; prints a checksum and the
 * calls it made. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char global_buf[512];
/* called through pointers in .data: no optimisation turns them into inline code,
 * and no call goes through the PLT (its GOT shares a page with .data here: every
 * PLT jump would be a fault of the data engine's, whatever the hooks do) */
static void *(*volatile copy)(void *, const void *, size_t) = memcpy;
static void *(*volatile fill)(void *, int, size_t) = memset;
static void *(*volatile alloc)(size_t) = malloc;
static void (*volatile release)(void *) = free;

int main(int argc, char **argv) {
    long rounds = argc > 1 ? atol(argv[1]) : 1000;
    unsigned long sum = 0, mallocs = 0, frees = 0, copies = 0, sets = 0;
    char *keep[8] = {0};
    for (long i = 0; i < rounds; i++) {
        size_t n = 16 + (size_t)(i % 7) * 24, m = 8 + (size_t)(i % 61);
        char *a = alloc(n), *b = alloc(n);
        mallocs += 2;
        for (size_t j = 0; j < n; j++)
            a[j] = (char)(i + j);
        copy(b, a, n);
        copy(global_buf, b, n);
        copies += 2;
        fill(global_buf + 256, (int)(i & 0x7f), m);
        sets++;
        sum += (unsigned char)b[n - 1] + (unsigned char)global_buf[3] +
               (unsigned char)global_buf[256 + m - 1];
        release(a);
        frees++;
        if (keep[i % 8]) {
            release(keep[i % 8]);
            frees++;
        }
        keep[i % 8] = b;
    }
    for (int k = 0; k < 8; k++)
        if (keep[k]) {
            release(keep[k]);
            frees++;
        }
    printf("sum=%lu malloc=%lu free=%lu memcpy=%lu memset=%lu\n", sum, mallocs, frees, copies,
           sets);
    return 0;
}
