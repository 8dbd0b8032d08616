/* SPDX-License-Identifier: GPL-2.0-or-later */
/* Sorts words with libc's qsort and a strcmp comparator, as MiBench's
 * qsort_small does with its input file: N words (argv[1], default 20000) of
 * 3-12 letters from a fixed generator, in one heap array of 16-byte slots,
 * sorted ROUNDS times (argv[2], default 1) from the same start.  Prints the
 * first, middle and last words and a checksum. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SLOT 16

static unsigned long state = 12345;

static unsigned next(void)
{
    state = state * 6364136223846793005UL + 1442695040888963407UL;
    return (unsigned)(state >> 33);
}

static int compare(const void *a, const void *b) { return strcmp(a, b); }

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 20000, rounds = argc > 2 ? atol(argv[2]) : 1;
    char *start = malloc(n * SLOT), *words = malloc(n * SLOT);
    if (!start || !words)
        return 1;
    for (long i = 0; i < n; i++) {
        int len = 3 + next() % 10;
        for (int k = 0; k < len; k++)
            start[i * SLOT + k] = 'a' + next() % 26;
        start[i * SLOT + len] = 0;
    }
    unsigned long sum = 0;
    for (long r = 0; r < rounds; r++) {
        memcpy(words, start, n * SLOT);
        qsort(words, n, SLOT, compare);
        for (long i = 0; i < n; i++)
            sum = sum * 31 + (unsigned char)words[i * SLOT];
    }
    printf("%s %s %s %lu\n", words, words + n / 2 * SLOT, words + (n - 1) * SLOT, sum);
    free(start);
    free(words);
    return 0;
}
