/* SPDX-License-Identifier: GPL-2.0-or-later
 * Benchmark program of bench_scale.py: N live heap blocks, then a steady
 * state of M rounds that keeps N blocks live.
 *
 *   live_blocks N M
 *
 * build(): N nodes of 32 bytes, malloc'd one by one and linked in a
 * shuffled order (a pointer chase with no locality).  steady(): M rounds;
 * each frees one random node, mallocs its replacement in its place in the
 * list, and walks 8 nodes of the list.  The tracer's work per round (one
 * free, one malloc, the walk's accesses) is the same whatever N is: its
 * cost must not grow with the number of live blocks.  Prints a checksum. */
#include <stdio.h>
#include <stdlib.h>

struct node { struct node *next; long value; long pad[2]; };

static unsigned long rng = 88172645463325252UL;
static unsigned long next_random(void) {   /* xorshift64: the same sequence every run */
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return rng;
}

static struct node **nodes;     /* nodes[i]: the i-th node of the list */
static long n_nodes;

__attribute__((noinline)) void build(long n) {
    nodes = calloc(n, sizeof *nodes);
    for (long i = 0; i < n; i++) {
        nodes[i] = malloc(sizeof(struct node));
        nodes[i]->value = i;
    }
    for (long i = n - 1; i > 0; i--) {     /* shuffle, then link in that order */
        long j = next_random() % (i + 1);
        struct node *t = nodes[i]; nodes[i] = nodes[j]; nodes[j] = t;
    }
    for (long i = 0; i < n; i++)
        nodes[i]->next = nodes[(i + 1) % n];
    n_nodes = n;
}

__attribute__((noinline)) long steady(long rounds) {
    long sum = 0;
    struct node *p = nodes[0];
    for (long r = 0; r < rounds; r++) {
        long i = next_random() % n_nodes;
        long prev = (i + n_nodes - 1) % n_nodes;
        struct node *fresh = malloc(sizeof(struct node));
        fresh->value = nodes[i]->value + 1;
        fresh->next = nodes[i]->next;
        if (p == nodes[i]) p = fresh;
        free(nodes[i]);
        nodes[i] = fresh;
        nodes[prev]->next = fresh;
        for (int k = 0; k < 8; k++) { sum += p->value; p = p->next; }
    }
    return sum;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000;
    long m = argc > 2 ? atol(argv[2]) : 1000;
    if (n < 2) n = 2;
    build(n);
    printf("%ld\n", steady(m));
    return 0;
}
