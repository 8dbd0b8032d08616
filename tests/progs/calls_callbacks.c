// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * Function-tracing test program: a table of function pointers.
 *
 *   calls_callbacks [N]      (default N=5000)
 *
 * run_table() calls N times through a table of 5 operations, picking the
 * entry from a fixed pattern (so the 5 counts differ), and apply() calls an
 * operation passed as an argument; both are indirect calls ("call *%rax").
 * The last line, "calls: ...", is the program's own count of entries.
 */
#include <stdio.h>
#include <stdlib.h>

#define TRACED __attribute__((noinline, noclone, noipa))

typedef long (*op_fn)(long, long);

unsigned long n_op[5], n_apply, n_run_table;

TRACED long op_add(long a, long b) { n_op[0]++; return a + b; }
TRACED long op_sub(long a, long b) { n_op[1]++; return a - b; }
TRACED long op_mul(long a, long b) { n_op[2]++; return a * (b | 1); }
TRACED long op_xor(long a, long b) { n_op[3]++; return a ^ (b * 2654435761L); }
TRACED long op_rot(long a, long b) {
    n_op[4]++;
    unsigned long x = (unsigned long)a;
    int r = (int)(b & 63);
    return (long)(r ? (x << r) | (x >> (64 - r)) : x);
}

op_fn table[5] = {op_add, op_sub, op_mul, op_xor, op_rot};

TRACED long apply(op_fn f, long a, long b) {
    n_apply++;
    long r = f(a, b);
    __asm__ volatile("" : "+r"(r));   /* a real call, not a tail jump */
    return r;
}

TRACED long run_table(long n, long acc) {
    n_run_table++;
    for (long i = 0; i < n; i++) {
        long k = (i * i + 3 * i) % 7;   /* 0..6: entries 0 and 1 come up more often */
        acc = table[k % 5](acc, i);
        if (i % 10 == 0)
            acc = apply(table[(i / 10) % 5], acc, i);
    }
    return acc;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 5000;
    long acc = run_table(n, 1);
    acc = run_table(n / 2, acc);
    printf("result: n=%ld acc=%ld\n", n, acc);
    printf("calls: op_add=%lu op_sub=%lu op_mul=%lu op_xor=%lu op_rot=%lu apply=%lu "
           "run_table=%lu\n", n_op[0], n_op[1], n_op[2], n_op[3], n_op[4], n_apply, n_run_table);
    return 0;
}
