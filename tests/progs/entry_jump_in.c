// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * A function that jumps into the first bytes of another, as glibc's mempcpy
 * jumps into memmove's body (mov rax, rdi; then its start + 3).  The second
 * one touches a global, so the hybrid engine copies it and would redirect its
 * entry with a 5-byte jump, written over the bytes the first one jumps to.
 *
 *   entry_jump_in [N]   N calls of each (default 200000); prints the sums
 */
#include <stdio.h>
#include <stdlib.h>

long counter;
long target_fn(long a, long b);
long jumper_fn(long a, long b);

__asm__(
    ".text\n"
    ".globl jumper_fn\n.type jumper_fn, @function\n"
    "jumper_fn:\n.cfi_startproc\n"
    "  lea (%rdi,%rsi), %rdi\n"
    "  mov %rdi, %rax\n"
    "  jmp target_fn + 3\n"
    ".cfi_endproc\n.size jumper_fn, .-jumper_fn\n"
    ".globl target_fn\n.type target_fn, @function\n"
    "target_fn:\n.cfi_startproc\n"
    "  mov %rdi, %rax\n"                  /* 3 bytes: jumper_fn comes in after it */
    "  add counter(%rip), %rax\n"
    "  incq counter(%rip)\n"
    "  ret\n"
    ".cfi_endproc\n.size target_fn, .-target_fn\n");

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 200000, a = 0, b = 0;
    for (long i = 0; i < n; i++) {
        a += target_fn(i, 1);
        b += jumper_fn(i, 2);
    }
    printf("a %ld b %ld counter %ld\n", a, b, counter);
    return 0;
}
