// SPDX-License-Identifier: GPL-2.0-or-later
/* Tail calls through memory without an index register, the pointers in
 * traced .data: via_hook() is `jmp [rip + hook]` at -O2 (CPython's
 * PyObject_Malloc jumps through its allocator struct so), via_ops() is `mov
 * rax, [rip + ops]; jmp [rax + 8]` (a type slot's tail call).  A function
 * copy gives such a jump a probe that loads the target into r11, then `jmp
 * r11`.  with_r11() keeps a value in r11 (an asm statement) before the same
 * jump as via_hook's: its jump keeps the stub, which preserves every register.
 * Each op stores into a global.  Prints a checksum.
 * argv[1]: iterations (default 3000000). */
#include <stdio.h>
#include <stdlib.h>

typedef long (*op_t)(long);
struct ops { op_t first, second; };
long acc;                                  /* .bss: each op stores into it */

__attribute__((noinline)) static long op0(long x) { acc += x; return x + 1; }
__attribute__((noinline)) static long op1(long x) { acc ^= x; return x * 3; }
__attribute__((noinline)) static long op2(long x) { acc -= x; return x >> 1; }

op_t hook = op0;                           /* .data, writable: traced */
struct ops table = {op1, op2};
struct ops *ops = &table;

__attribute__((noinline)) long via_hook(long x) { return hook(x); }
__attribute__((noinline)) long via_ops(long x) { return ops->second(x); }
__attribute__((noinline)) long with_r11(long x)
{
    long kept;
    __asm__ volatile("lea 3(%1), %%r11\n\tmov %%r11, %0" : "=r"(kept) : "r"(x) : "r11");
    return hook(kept);
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 3000000, x = 1, sum = 0;
    for (long i = 0; i < n; i++) {
        x = via_hook(x) & 0xffff;
        x = via_ops(x) & 0xffff;
        x = with_r11(x) & 0xffff;
        sum += x;
    }
    printf("sum %ld acc %ld\n", sum, acc);
    return 0;
}
