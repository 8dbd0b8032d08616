/* SPDX-License-Identifier: GPL-2.0-or-later */
/* Data-access kernels that run long enough for rewritten code to carry most
 * of their accesses (argv[1] picks one, argv[2] its size):
 *   list     pointer chasing over malloc'd nodes linked in a shuffled order
 *   array    passes over a global array, a load and a store per element
 *   matmul   a matrix multiply on heap matrices
 *   strings  byte loops over global strings (length, transformed copy, compare)
 * Prints its result on stdout and the brk heap range on stderr ("heap LO HI"),
 * so that an oracle can tell heap accesses apart. */
#define _DEFAULT_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct node { struct node *next; long value; };
int values[8192];                                 /* .bss */
char text[4096], copy[4096];                      /* .bss */
const char words[] = "the quick brown fox jumps over the lazy dog ";

__attribute__((noinline)) static struct node *build(int n) {
    struct node **all = malloc(sizeof *all * (size_t)n);
    for (int i = 0; i < n; i++) {
        all[i] = malloc(sizeof **all);
        all[i]->value = i * 3;
    }
    unsigned long seed = 99;
    for (int i = n - 1; i > 0; i--) {
        seed = seed * 6364136223846793005UL + 1442695040888963407UL;
        int j = (int)((seed >> 33) % (unsigned long)(i + 1));
        struct node *t = all[i];
        all[i] = all[j];
        all[j] = t;
    }
    for (int i = 0; i < n - 1; i++) all[i]->next = all[i + 1];
    all[n - 1]->next = NULL;
    struct node *head = all[0];
    free(all);
    return head;
}

__attribute__((noinline)) static long chase(const struct node *p) {
    long s = 0;
    for (; p; p = p->next) s += p->value;
    return s;
}

__attribute__((noinline)) static long passes(int n, int rounds) {
    long s = 0;
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < n; i++) {
            s += values[i];
            values[i] = (int)(s ^ r);
        }
    return s;
}

__attribute__((noinline)) static void matmul(const double *a, const double *b, double *c, int n) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int k = 0; k < n; k++) s += a[i * n + k] * b[k * n + j];
            c[i * n + j] = s;
        }
}

__attribute__((noinline)) static int length(const char *s) {
    int n = 0;
    while (s[n]) n++;
    return n;
}

__attribute__((noinline)) static void shout(char *to, const char *from) {
    for (; *from; from++, to++) *to = (char)(*from >= 'a' && *from <= 'z' ? *from - 32 : *from);
    *to = 0;
}

__attribute__((noinline)) static int differ(const char *a, const char *b) {
    int d = 0;
    for (; *a && *b; a++, b++) d += *a != *b;
    return d;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    int n = argc > 2 ? atoi(argv[2]) : 100;
    char *lo = sbrk(0);
    long result = 0;
    if (!strcmp(mode, "list")) {
        struct node *head = build(n);
        for (int r = 0; r < 20; r++) result += chase(head);
    } else if (!strcmp(mode, "array")) {
        result = passes(n < 8192 ? n : 8192, 20);
    } else if (!strcmp(mode, "matmul")) {
        double *a = malloc(sizeof *a * (size_t)(n * n)), *b = malloc(sizeof *b * (size_t)(n * n));
        double *c = malloc(sizeof *c * (size_t)(n * n));
        for (int i = 0; i < n * n; i++) { a[i] = i % 7; b[i] = i % 5; }
        matmul(a, b, c, n);
        for (int i = 0; i < n * n; i++) result += (long)c[i];
    } else if (!strcmp(mode, "strings")) {
        int w = (int)sizeof words - 1, len = 0;
        while (len + w < (int)sizeof text - 1) { memcpy(text + len, words, (size_t)w); len += w; }
        text[len] = 0;
        for (int r = 0; r < n; r++) {
            shout(copy, text);
            result += length(copy) + differ(text, copy);
        }
    } else {
        fprintf(stderr, "usage: %s list|array|matmul|strings [size]\n", argv[0]);
        return 2;
    }
    printf("%s %d: %ld\n", mode, n, result);
    fprintf(stderr, "heap %p %p\n", (void *)lo, sbrk(0));
    return 0;
}
