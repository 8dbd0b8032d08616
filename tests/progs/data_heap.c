/* Data-access test program (heap): pointer chasing over malloc'd nodes,
 * matrix multiply on heap arrays, realloc growth, memcpy/memset users.
 * Prints results on stdout and the brk heap range on stderr ("heap LO HI"),
 * so an oracle can tell heap accesses apart without knowing the layout. */
#define _DEFAULT_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct node { struct node *next; long value; };

__attribute__((noinline)) struct node *build_list(int n) {
    struct node *head = NULL;
    for (int i = 0; i < n; i++) {
        struct node *nd = malloc(sizeof *nd);
        nd->value = i * 7;
        nd->next = head;
        head = nd;
    }
    return head;
}

__attribute__((noinline)) long chase(struct node *head) {
    long s = 0;
    for (struct node *p = head; p; p = p->next) s += p->value;
    return s;
}

__attribute__((noinline)) void matmul(const double *a, const double *b, double *c, int n) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int k = 0; k < n; k++) s += a[i * n + k] * b[k * n + j];
            c[i * n + j] = s;
        }
}

__attribute__((noinline)) int *grow(int rounds) {
    int *v = NULL;
    int len = 0;
    for (int r = 0; r < rounds; r++) {
        v = realloc(v, (size_t)(len + 8) * sizeof *v);
        for (int i = 0; i < 8; i++) v[len + i] = r * 8 + i;
        len += 8;
    }
    return v;
}

int main(void) {
    char *lo = sbrk(0);
    struct node *list = build_list(50);
    long s = chase(list);
    int n = 8;
    double *a = malloc(n * n * sizeof *a), *b = malloc(n * n * sizeof *b), *c = malloc(n * n * sizeof *c);
    for (int i = 0; i < n * n; i++) { a[i] = i % 5; b[i] = i % 3; }
    matmul(a, b, c, n);
    int *v = grow(10);
    char *buf = malloc(256);
    memset(buf, 'x', 255);
    buf[255] = 0;
    char *copy = malloc(256);
    memcpy(copy, buf, 256);
    printf("chase=%ld c[9]=%g v[77]=%d copy=%zu\n", s, c[9], v[77], strlen(copy));
    fprintf(stderr, "heap %p %p\n", (void *)lo, sbrk(0));
    return 0;
}
