/* SPDX-License-Identifier: GPL-2.0-or-later */
/* Data-tracing benchmark, pointer chasing: a linked list of N nodes (argv[2],
 * default 4096) malloc'd one by one, linked in a shuffled order (a fixed
 * seed), walked ROUNDS times (argv[1], default 100): each step loads a node's
 * value and its next pointer (two loads per node, one pointer chase), and
 * every walk stores the round's sum into a global.  Deterministic output. */
#include <stdio.h>
#include <stdlib.h>

struct node {
    struct node *next;
    long value;
};

long sums[64];                       /* .bss */

__attribute__((noinline)) static struct node *build(int n) {
    struct node **nodes = malloc(sizeof *nodes * (size_t)n);
    for (int i = 0; i < n; i++) {
        nodes[i] = malloc(sizeof **nodes);
        nodes[i]->value = i;
    }
    unsigned long seed = 12345;
    for (int i = n - 1; i > 0; i--) {          /* Fisher-Yates with an LCG */
        seed = seed * 6364136223846793005UL + 1442695040888963407UL;
        int j = (int)((seed >> 33) % (unsigned long)(i + 1));
        struct node *t = nodes[i];
        nodes[i] = nodes[j];
        nodes[j] = t;
    }
    for (int i = 0; i < n - 1; i++) nodes[i]->next = nodes[i + 1];
    nodes[n - 1]->next = NULL;
    struct node *head = nodes[0];
    free(nodes);
    return head;
}

__attribute__((noinline)) static long walk(const struct node *p) {
    long s = 0;
    for (; p; p = p->next) s += p->value;
    return s;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 100;
    int n = argc > 2 ? atoi(argv[2]) : 4096;
    if (rounds < 0 || n < 1) {
        fprintf(stderr, "usage: %s [rounds] [nodes]\n", argv[0]);
        return 2;
    }
    struct node *head = build(n);
    long total = 0;
    for (int r = 0; r < rounds; r++) {
        sums[r % 64] = walk(head);
        total += sums[r % 64];
    }
    printf("rounds %d nodes %d: total %ld\n", rounds, n, total);
    return 0;
}
