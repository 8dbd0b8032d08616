// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * Function-tracing test program: tail calls.
 *
 *   calls_tail [N]      (default N=3000)
 *
 * At -O2 every "return f(...)" below becomes a jump: a chain of direct tail
 * jumps (tail_a -> tail_b -> tail_c), an indirect tail jump through a table
 * (dispatch -> one of op0..op3), a tail jump into the PLT (tail_strlen ->
 * strlen) and into a function that is also called normally (finish).  gcd is
 * self tail recursion, which gcc -O2 turns into a loop (so at -O2 it is
 * entered once per top-level call; it does not count itself).  At -O0 all
 * of them are ordinary calls.  The last line, "calls: ...", is the program's
 * own count of entries (an entry by a tail jump is an entry).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TRACED __attribute__((noinline, noclone, noipa))

unsigned long n_tail_a, n_tail_b, n_tail_c, n_finish, n_dispatch, n_op[4], n_tail_strlen;

TRACED long finish(long x) {
    n_finish++;
    return x ^ (x >> 3);
}

TRACED long tail_c(long x) {
    n_tail_c++;
    return finish(x * 2);
}

TRACED long tail_b(long x) {
    n_tail_b++;
    if (x & 1)
        return tail_c(x + 1);
    return finish(x);
}

TRACED long tail_a(long x) {
    n_tail_a++;
    return tail_b(x + 3);
}

TRACED long op0(long x) { n_op[0]++; return x + 1; }
TRACED long op1(long x) { n_op[1]++; return x * 3; }
TRACED long op2(long x) { n_op[2]++; return finish(x - 7); }
TRACED long op3(long x) { n_op[3]++; return x << 2; }

long (*const ops[4])(long) = {op0, op1, op2, op3};

TRACED long dispatch(long i, long x) {
    n_dispatch++;
    return ops[(i * 5 + (i >> 2)) & 3](x);
}

TRACED size_t tail_strlen(const char *s) {
    n_tail_strlen++;
    return strlen(s);
}

TRACED long gcd(long a, long b) {
    if (b == 0)
        return a;
    return gcd(b, a % b);
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 3000;
    char buf[64];
    long sum = 0;
    for (long i = 0; i < n; i++) {
        sum += tail_a(i);
        sum += dispatch(i, sum & 0xffff);
        sum += gcd(i * 7 + 12, 18 + (i % 97));
        if (i % 3 == 0) {
            int len = snprintf(buf, sizeof buf, "%ld", sum);
            sum += (long)tail_strlen(buf) - len;
            sum += finish(i);
        }
    }
    printf("result: n=%ld sum=%ld\n", n, sum);
    printf("calls: tail_a=%lu tail_b=%lu tail_c=%lu finish=%lu dispatch=%lu op0=%lu op1=%lu "
           "op2=%lu op3=%lu tail_strlen=%lu\n", n_tail_a, n_tail_b, n_tail_c, n_finish,
           n_dispatch, n_op[0], n_op[1], n_op[2], n_op[3], n_tail_strlen);
    return 0;
}
