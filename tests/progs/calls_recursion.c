// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * Function-tracing test program: recursion.
 *
 *   calls_recursion [N [M]]      (defaults N=20, M=1001)
 *
 * fib(N) is the doubly recursive Fibonacci (2*F(N+1)-1 calls: 21891 for
 * N=20); an asm barrier keeps gcc -O2 from turning one of the two recursive
 * calls into a loop, so every logical call is a real call.  is_even/is_odd
 * is mutual recursion (M+1 entries in all); at -O2 each becomes a tail jump
 * (`jmp is_odd` / `jmp is_even`).  depth_sum is plain linear recursion.
 *
 * Every function counts its own entries; the last line, "calls: NAME=COUNT
 * ...", is the program's own count, which tests/test_oracles.py compares with
 * callgrind's.
 */
#include <stdio.h>
#include <stdlib.h>

#define TRACED __attribute__((noinline, noclone, noipa))

unsigned long n_fib, n_is_even, n_is_odd, n_depth_sum;

TRACED long fib(int n) {
    n_fib++;
    if (n < 2)
        return n;
    long a = fib(n - 1);
    long b = fib(n - 2);
    __asm__ volatile("" : "+r"(b));   /* the sum is not a tail position */
    return a + b;
}

TRACED int is_odd(unsigned n);

TRACED int is_even(unsigned n) {
    n_is_even++;
    if (n == 0)
        return 1;
    return is_odd(n - 1);
}

TRACED int is_odd(unsigned n) {
    n_is_odd++;
    if (n == 0)
        return 0;
    return is_even(n - 1);
}

TRACED long depth_sum(int n) {
    n_depth_sum++;
    if (n == 0)
        return 0;
    long s = depth_sum(n - 1);
    __asm__ volatile("" : "+r"(s));
    return s + n;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 20;
    unsigned m = argc > 2 ? (unsigned)atoi(argv[2]) : 1001;
    long f = fib(n);
    int e = is_even(m);
    int o = is_odd(m / 2);
    long d = depth_sum(500);
    printf("result: fib(%d)=%ld is_even(%u)=%d is_odd(%u)=%d depth_sum(500)=%ld\n",
           n, f, m, e, m / 2, o, d);
    printf("calls: fib=%lu is_even=%lu is_odd=%lu depth_sum=%lu\n",
           n_fib, n_is_even, n_is_odd, n_depth_sum);
    return 0;
}
