// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * Function tracing test: calls made while the word at %fs:0 is not the
 * thread pointer.
 *
 * The x86-64 TLS ABI keeps the thread pointer (the fs base) at %fs:0, and
 * madtrace's trampolines look a thread's ring up by that word first; a
 * runtime with its own TLS layout (Go's, for one) keeps something else there,
 * and the trampolines must then find the ring by the fs base itself.  This
 * program calls run() (which calls step() n times) with the word as glibc
 * set it, then with 0 and with an arbitrary value in it, then puts it back.
 * Nothing in between uses TLS.
 *
 * Calls: run 3, step 2500; the last line, "calls: NAME=COUNT ...", is the
 * program's own count.
 */
#include <stdio.h>

#define TRACED __attribute__((noinline, noclone, noipa))

static unsigned long n_run, n_step;

TRACED int step(int i) {
    n_step++;
    return i * 3 + 1;
}

TRACED int run(int n) {
    n_run++;
    int s = 0;
    for (int i = 0; i < n; i++)
        s += step(i);
    return s;
}

int main(void) {
    unsigned long *word;
    __asm__ volatile("mov %%fs:0, %0" : "=r"(word));   /* glibc: the TCB, which points at itself */
    int a = run(1000);
    unsigned long saved = *word;
    *word = 0;
    int b = run(1000);
    *word = 0x12345000;
    int c = run(500);
    *word = saved;
    printf("%d %d %d\n", a, b, c);
    printf("calls: run=%lu step=%lu\n", n_run, n_step);
    return 0;
}
