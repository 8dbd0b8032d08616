/* SPDX-License-Identifier: GPL-2.0-or-later */
/* Searches keys in lines of text with Boyer-Moore-Horspool, as MiBench's
 * stringsearch does: LINES lines (argv[1], default 1500) of 40-80 letters
 * and spaces from a fixed generator in a .bss buffer, KEYS keys (argv[2],
 * default 60) of 3-8 letters; for each key its skip table (.bss) is built,
 * then every line searched.  Prints the number of lines holding each key,
 * summed, and a checksum of the positions. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LINES 20000
#define LINE 96

static char text[MAX_LINES][LINE];
static char keys[1000][16];
static size_t skip[256];
static unsigned long state = 777;

static unsigned next(void)
{
    state = state * 6364136223846793005UL + 1442695040888963407UL;
    return (unsigned)(state >> 33);
}

static void init_search(const char *key, size_t len)
{
    for (int c = 0; c < 256; c++)
        skip[c] = len;
    for (size_t i = 0; i + 1 < len; i++)
        skip[(unsigned char)key[i]] = len - 1 - i;
}

static long search(const char *line, size_t n, const char *key, size_t len)
{
    size_t at = 0;
    while (at + len <= n) {
        size_t k = len;
        while (k > 0 && line[at + k - 1] == key[k - 1])
            k--;
        if (k == 0)
            return (long)at;
        at += skip[(unsigned char)line[at + len - 1]];
    }
    return -1;
}

int main(int argc, char **argv)
{
    long lines = argc > 1 ? atol(argv[1]) : 1500, nkeys = argc > 2 ? atol(argv[2]) : 60;
    if (lines > MAX_LINES || nkeys > 1000)
        return 1;
    for (long i = 0; i < lines; i++) {
        int len = 40 + next() % 41;
        for (int k = 0; k < len; k++)
            text[i][k] = next() % 6 == 0 ? ' ' : 'a' + next() % 8;
        text[i][len] = 0;
    }
    for (long j = 0; j < nkeys; j++) {
        int len = 3 + next() % 6;
        for (int k = 0; k < len; k++)
            keys[j][k] = 'a' + next() % 8;
        keys[j][len] = 0;
    }
    long found = 0;
    unsigned long sum = 0;
    for (long j = 0; j < nkeys; j++) {
        size_t len = strlen(keys[j]);
        init_search(keys[j], len);
        for (long i = 0; i < lines; i++) {
            long at = search(text[i], strlen(text[i]), keys[j], len);
            if (at >= 0) {
                found++;
                sum = sum * 131 + (unsigned long)at;
            }
        }
    }
    printf("found %ld sum %lu\n", found, sum);
    return 0;
}
