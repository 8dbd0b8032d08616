/* SPDX-License-Identifier: GPL-2.0-or-later */
/* Code that nothing copies jumping back into the middle of a function that is
 * copied (what GCC's hot/cold splitting makes: a function's .cold block runs,
 * then jumps into the function's hot part; python3's insertdict does it
 * thousands of times in a short script).  step() loads data[i], and for odd
 * values takes a detour outside any function (no symbol type, no unwind entry,
 * no data access: it never faults, so it is never copied), which jumps back
 * into step's original code just before its store to `total`: that store
 * faults each time and the thread is moved into step's copy again (the hybrid
 * engine's fault loop does that move by itself).  Usage: data_cold_split N.
 * Deterministic: prints n, the sum of step's results and total. */
#include <stdio.h>
#include <stdlib.h>

long data[1024];
long total;
long step(long i);

__asm__(".text\n"
        ".globl step\n"
        ".type step, @function\n"
        "step:\n"
        "    and $1023, %rdi\n"
        "    lea data(%rip), %rax\n"
        "    mov (%rax,%rdi,8), %rax\n"
        "    test $1, %al\n"
        "    jne .Lstep_detour\n"
        ".Lstep_back:\n"
        "    add %rax, total(%rip)\n"
        "    ret\n"
        ".size step, .-step\n"
        ".Lstep_detour:\n"
        "    imul $3, %rax\n"
        "    add $1, %rax\n"
        "    movzwl %ax, %eax\n"
        "    jmp .Lstep_back\n");

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000;
    for (long i = 0; i < 1024; i++)
        data[i] = i * 7;
    long sum = 0;
    for (long i = 0; i < n; i++)
        sum += step(i);
    printf("n %ld sum %ld total %ld\n", n, sum, total);
    return 0;
}
