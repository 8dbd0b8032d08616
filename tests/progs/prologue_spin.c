/* SPDX-License-Identifier: GPL-2.0-or-later
 * A thread that is nearly always in the first bytes of spin_target(): the
 * main thread calls it in a tight loop through a pointer (its address is
 * taken, so madtrace instruments it at its entry, overwriting its first five
 * bytes), and its prologue is several short instructions.  A stop of the
 * target often catches the thread strictly inside those bytes: its next
 * instruction would be cut in half by the patch.
 * Prints "ready", spins until its stdin reaches end of file (a second thread
 * waits for that), then prints the number of calls, which it checks against
 * its own count of loop iterations. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>

__asm__(".text\n"
        ".globl spin_target\n"
        ".type spin_target, @function\n"
        "spin_target:\n"
        "    push %rbp\n"            /* 1 byte */
        "    mov %rsp, %rbp\n"       /* 3 bytes */
        "    nop\n"
        "    incq spin_calls(%rip)\n"
        "    pop %rbp\n"
        "    ret\n"
        ".size spin_target, .-spin_target\n");

void spin_target(void);
unsigned long spin_calls;
static atomic_int done;

static void *watch_stdin(void *arg) {
    char buf[256];
    (void)arg;
    while (read(0, buf, sizeof buf) > 0)
        ;
    atomic_store(&done, 1);
    return NULL;
}

int main(void) {
    void (*volatile call)(void) = spin_target;
    pthread_t watcher;
    unsigned long loops = 0;
    if (pthread_create(&watcher, NULL, watch_stdin, NULL) != 0)
        return 2;
    printf("ready\n");
    fflush(stdout);
    while (!atomic_load_explicit(&done, memory_order_relaxed)) {
        call();
        loops++;
    }
    pthread_join(watcher, NULL);
    printf("calls=%s\n", loops == spin_calls ? "ok" : "WRONG");
    return loops == spin_calls ? 0 : 1;
}
