/* SPDX-License-Identifier: GPL-2.0-or-later */
/* memcpy, memmove and memset calls among plain stores and allocations, many
 * per drain: each round stores `before`, copies (or sets) a traced buffer,
 * stores `after`; every thirtieth round also mallocs a block, sets it and frees
 * it.  Usage: data_copies ROUNDS (default 20000); prints a checksum. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char a[256], b[256];
volatile long before, after;
/* through volatile pointers: the compiler cannot inline them, libc's run */
static void *(*volatile set)(void *, int, size_t) = memset;
static void *(*volatile copy)(void *, const void *, size_t) = memcpy;
static void *(*volatile move)(void *, const void *, size_t) = memmove;

int main(int argc, char **argv) {
    long rounds = argc > 1 ? atol(argv[1]) : 20000;
    unsigned long sum = 0;
    for (long i = 0; i < rounds; i++) {
        size_t n = 16 + (size_t)(i % 97);
        before = i;
        switch (i % 3) {
        case 0: copy(a, b, n); break;
        case 1: move(b + 1, b, n); break;
        default: set(a, (int)(i & 0x7f), n); break;
        }
        after = i;
        if (i % 30 == 2) {
            char *p = malloc(n);
            set(p, 1, n);
            sum += (unsigned char)p[n - 1];
            free(p);
        }
        sum = sum * 31 + (unsigned char)a[i % 64] + (unsigned char)b[i % 64];
    }
    printf("checksum %lu\n", sum);
    return 0;
}
