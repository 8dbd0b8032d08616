/* A long-running program for live instrument/restore tests.
 * Usage: live_calls ITERATIONS
 * Prints "ready", then calls tick() and tock() ITERATIONS times with a short
 * sleep every 1000 iterations, and prints checksums (deterministic). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

unsigned long ticks;   /* a global, for data tracing */

__attribute__((noinline, noclone)) unsigned long tick(unsigned long x) {
    __asm__ volatile("" ::: "memory");
    ticks++;
    return x * 2654435761u + 1;
}

__attribute__((noinline, noclone)) unsigned long tock(unsigned long x) {
    __asm__ volatile("" ::: "memory");
    return (x >> 3) ^ (x << 7);
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 100000;
    unsigned long a = 1, b = 2;
    printf("ready\n");
    fflush(stdout);
    for (long i = 0; i < n; i++) {
        a = tick(a + (unsigned long)i);
        b = tock(b + a);
        if (i % 1000 == 999) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
    }
    printf("a=%016lx b=%016lx ticks=%lu\n", a, b, ticks);
    return 0;
}
