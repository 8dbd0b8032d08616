/* Heap block usage test program: a block that is never touched, a block
 * written and read a known number of times, a block read after it was
 * freed (use after free, in peek()), and calloc/realloc blocks.  Nothing is
 * allocated between the free and the read after it, so the freed block's
 * bytes are not reused.  Deterministic output. */
#include <stdio.h>
#include <stdlib.h>

#define K 16

__attribute__((noinline)) long fill_and_sum(long *v) {
    for (int i = 0; i < K; i++) v[i] = i * 5;       /* K stores */
    long s = 0;
    for (int i = 0; i < K; i++) s += v[i];          /* K loads */
    return s;
}

__attribute__((noinline)) long peek(const long *p) {
    return *(const volatile long *)(p + 1) != 0;   /* one load of a freed block */
}

int main(void) {
    char *never = malloc(40);                      /* never touched */
    long *kept = malloc(K * sizeof *kept);
    long *gone = malloc(8 * sizeof *gone);
    int *zeroed = calloc(4, sizeof *zeroed);
    long s = fill_and_sum(kept);
    gone[0] = 7;                                   /* one store before the free */
    long *volatile alias = gone;                   /* (no use-after-free warning) */
    free(gone);
    long after = peek(alias);
    zeroed = realloc(zeroed, 64 * sizeof *zeroed);
    zeroed[63] = 1;
    printf("s=%ld after=%d never=%p z=%d\n", s, after >= 0, (void *)never, zeroed[63]);
    return 0;
}
