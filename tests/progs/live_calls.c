/* A long-running program for live instrument/restore tests.
 * Usage: live_calls [MIN_ITERATIONS]   (default 100)
 *
 * Prints "ready", then calls tick() and tock() in rounds of ROUND iterations.
 * After each round it looks at its stdin: while stdin is open it waits up to
 * 1 ms for it (the target mostly sleeps, so it does not starve the tracer on
 * a loaded machine); it stops after the first round that ends with at least
 * MIN_ITERATIONS done and stdin at end of file.  So a test decides when it
 * finishes (by closing the pipe), however slow the machine is, and the output
 * is deterministic for the number of iterations done, which it prints:
 * `live_calls N </dev/null` (no waiting: stdin is at EOF at once) is the
 * untraced reference of a traced run that printed iterations=N.
 *
 * Globals for data tracing: tick() counts into `ticks`, tock() into `tocks`,
 * both through bump() (so "inside tick" includes a nested call), and main()
 * counts rounds in `rounds`, in .data (an access outside tick and tock; it starts
 * at 1, so it prints one more than the rounds done). */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define ROUND 100

unsigned long ticks, tocks;   /* .bss */
unsigned long rounds = 1;   /* .data */

__attribute__((noinline, noclone)) void bump(unsigned long *counter) {
    __asm__ volatile("" ::: "memory");
    (*counter)++;
}

__attribute__((noinline, noclone)) unsigned long tick(unsigned long x) {
    __asm__ volatile("" ::: "memory");
    bump(&ticks);
    return x * 2654435761u + 1;
}

__attribute__((noinline, noclone)) unsigned long tock(unsigned long x) {
    __asm__ volatile("" ::: "memory");
    bump(&tocks);
    return (x >> 3) ^ (x << 7);
}

/* Is stdin still open? Waits up to wait_ms for it; data read is ignored. */
static int stdin_open(int wait_ms) {
    struct pollfd pfd = {0, POLLIN, 0};
    if (poll(&pfd, 1, wait_ms) <= 0)
        return 1;                       /* nothing yet (or EINTR): still open */
    if (pfd.revents & POLLNVAL)
        return 0;                       /* no stdin at all */
    char buf[256];
    return read(0, buf, sizeof buf) > 0;   /* 0: end of file; -1: unreadable */
}

int main(int argc, char **argv) {
    long min = argc > 1 ? atol(argv[1]) : ROUND;
    unsigned long a = 1, b = 2;
    long i = 0;
    int open = 1;
    printf("ready\n");
    fflush(stdout);
    for (;;) {
        for (long end = i + ROUND; i < end; i++) {
            a = tick(a + (unsigned long)i);
            b = tock(b + a);
        }
        rounds++;
        if (open)
            open = stdin_open(1);
        if (!open && i >= min)
            break;
    }
    printf("iterations=%ld a=%016lx b=%016lx ticks=%lu tocks=%lu rounds=%lu\n",
           i, a, b, ticks, tocks, rounds);
    return 0;
}
