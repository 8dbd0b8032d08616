// SPDX-License-Identifier: GPL-2.0-or-later
/* Indirect jumps whose targets live in traced memory: dispatch() tail-calls
 * through a writable table in .data (at -O2: jmp [table + i*8]), and each op
 * stores into a global.  A function copy turns such a jump into a stub whose
 * first act is loading the target from the (protected) table; a detach that
 * finds a thread in that stub must put it back at the jump, never step the
 * load (it faults on the traced page for ever).  Prints a checksum.
 * argv[1]: iterations (default 3000000). */
#include <stdio.h>
#include <stdlib.h>

typedef long (*op_t)(long);
long acc;                                  /* .bss: each op stores into it */

__attribute__((noinline)) static long op0(long x) { acc += x; return x + 1; }
__attribute__((noinline)) static long op1(long x) { acc ^= x; return x * 3; }
__attribute__((noinline)) static long op2(long x) { acc -= x; return x >> 1; }
__attribute__((noinline)) static long op3(long x) { acc += 7; return x + 5; }

op_t table[4] = {op0, op1, op2, op3};     /* .data, writable: traced */

__attribute__((noinline)) long dispatch(long i, long x) { return table[i & 3](x); }

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 3000000, x = 1, sum = 0;
    for (long i = 0; i < n; i++) {
        x = dispatch(i, x) & 0xffff;
        sum += x;
    }
    printf("sum %ld acc %ld\n", sum, acc);
    return 0;
}
