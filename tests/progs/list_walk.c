/* A correct program: builds a linked list of N malloc'd nodes, walks it
 * PASSES times, then frees every node.  Every access of the walk happens
 * while its node is live; the only accesses to freed memory are the
 * allocator's own (free() keeping its free lists in the released chunks).
 * Usage: list_walk [N] [PASSES]; prints the sum. */
#include <stdio.h>
#include <stdlib.h>

struct node { long v; struct node *next; };

__attribute__((noinline)) long traverse(const struct node *h) {
    long s = 0;
    for (; h; h = h->next) s += h->v;
    return s;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 800, passes = argc > 2 ? atoi(argv[2]) : 2;
    struct node *head = NULL;
    for (int i = 0; i < n; i++) {
        struct node *p = malloc(sizeof *p);
        p->v = i;
        p->next = head;
        head = p;
    }
    long s = 0;
    for (int k = 0; k < passes; k++) s += traverse(head);
    while (head) {
        struct node *next = head->next;
        free(head);
        head = next;
    }
    printf("%ld\n", s);
    return 0;
}
