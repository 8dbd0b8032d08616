/* SPDX-License-Identifier: GPL-2.0-or-later */
/* A data-touching function called many times (argv[1] calls, default 1000):
 * bump() loads and stores globals (.bss, .data) and a heap block, and calls
 * scale(), whose first instruction reads a global.  bump() is called directly
 * and through a pointer (its address is taken: function tracing patches its
 * entry); scale() only directly.  The loop also calls strlen() on a global
 * through the PLT (whose GOT may share a page with .data).  countdown(), in
 * assembly, branches back to its own first instruction (which a function
 * tracer patching its entry counts as a call) and adds to a global each time;
 * main() calls it once, the same in every run.  Deterministic output: the totals on
 * stdout; the brk heap range on stderr ("heap LO HI", for an oracle). */
#define _DEFAULT_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

long counters[64];                    /* .bss */
long weight = 3;                      /* .data */
char word[16] = "madtrace";           /* .data */
long steps;                           /* .bss, countdown()'s */

/* countdown(n): steps += 1, n -= 1, again from its entry while n > 0 */
__asm__(".pushsection .text\n"
        ".globl countdown\n"
        ".type countdown, @function\n"
        "countdown:\n"
        "    addq $1, steps(%rip)\n"
        "    subq $1, %rdi\n"
        "    jnz countdown\n"
        "    ret\n"
        ".size countdown, .-countdown\n"
        ".popsection\n");
void countdown(long n);
struct tally { long n, sum; } *tally; /* heap */

__attribute__((noinline)) long scale(long v) {
    return v * weight;
}

__attribute__((noinline)) void bump(int i) {
    counters[i & 63] += scale(i);
    tally->n++;
    tally->sum += counters[(i * 7) & 63];
}

void (*volatile via)(int) = bump;

int main(int argc, char **argv) {
    int calls = argc > 1 ? atoi(argv[1]) : 1000;
    if (calls < 0) {
        fprintf(stderr, "usage: %s [calls]\n", argv[0]);
        return 2;
    }
    char *lo = sbrk(0);
    tally = calloc(1, sizeof *tally);
    long letters = 0;
    for (int i = 0; i < calls; i++) {
        if (i % 4 == 3)
            via(i);
        else
            bump(i);
        letters += (long)strlen(word);
    }
    countdown(40);
    long s = 0;
    for (int i = 0; i < 64; i++) s += counters[i];
    printf("calls %d: n %ld sum %ld counters %ld letters %ld steps %ld\n", calls, tally->n,
           tally->sum, s, letters, steps);
    free(tally);
    fprintf(stderr, "heap %p %p\n", (void *)lo, sbrk(0));
    return 0;
}
