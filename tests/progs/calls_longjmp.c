// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * Function-tracing test program: longjmp out of nested traced functions.
 *
 *   calls_longjmp [ROUNDS]      (default ROUNDS=200)
 *
 * Each round, attempt() does setjmp and calls dive(0, depth), which recurses
 * to a depth between 1 and 12; the deepest call calls bail(), which
 * longjmps back into attempt(): the dive and bail frames never return.  The
 * round then continues with ordinary calls of after() (one of which is made
 * from a frame that had been abandoned before, at the same stack depth).  The
 * last line, "calls: ...", counts entries; a call abandoned by longjmp is
 * entered but never returns normally.
 */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>

#define TRACED __attribute__((noinline, noclone, noipa))

unsigned long n_dive, n_bail, n_after, n_attempt;
static jmp_buf env;

TRACED void bail(int code) {
    n_bail++;
    longjmp(env, code);
}

TRACED long dive(int d, int target) {
    n_dive++;
    if (d < target) {
        long r = dive(d + 1, target);
        __asm__ volatile("" : "+r"(r));   /* keep the recursion a real call */
        return r + 1;
    }
    bail(d + 1);   /* does not return */
    return 0;
}

TRACED long after(long x) {
    n_after++;
    return x * 3 + 1;
}

TRACED long attempt(int round) {
    n_attempt++;
    volatile long acc = round;
    int code = setjmp(env);
    if (code == 0) {
        acc += dive(0, 1 + (round * 7) % 12);   /* never returns */
        return -1;
    }
    acc = after(acc + code);
    if (round % 3 == 0)
        acc = after(acc);
    return acc;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 200;
    long sum = 0;
    for (int r = 0; r < rounds; r++)
        sum += attempt(r);
    sum += after(sum);
    printf("result: rounds=%d sum=%ld\n", rounds, sum);
    printf("calls: dive=%lu bail=%lu after=%lu attempt=%lu\n", n_dive, n_bail, n_after, n_attempt);
    return 0;
}
