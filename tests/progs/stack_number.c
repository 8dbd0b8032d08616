/* A number in main's stack frame that, in a non-PIE program, lies where
 * madtrace maps its code areas (0x40000000 and up), while a loop touches
 * traced data (step: its function is copied by the hybrid engine).
 * Usage: stack_number SECONDS NUMBER  -> "number NUMBER counter C" */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static long counter;

__attribute__((noinline)) static void step(long i) { counter += i & 7; }

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 1;
    volatile unsigned long number = argc > 2 ? strtoul(argv[2], NULL, 0) : 0;
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    long i = 0;
    do {
        for (int k = 0; k < 100000; k++) step(i++);
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while ((now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
    printf("number %#lx counter %ld\n", number, counter);
    return 0;
}
