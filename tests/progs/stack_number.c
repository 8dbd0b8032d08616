/* A number in main's stack frame that lies inside one of madtrace's code
 * areas, while a loop touches traced data (step: its function is copied by
 * the hybrid engine).
 * Usage: stack_number SECONDS NUMBER  -> "number NUMBER counter C"
 * NUMBER "copies": after a third of the time, the middle of the first
 * madtrace-copies-stack_number mapping of /proc/self/maps (0: none). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static long counter;

__attribute__((noinline)) static void step(long i) { counter += i & 7; }

static unsigned long inside_copies(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    unsigned long lo, hi, found = 0;
    while (f && !found && fgets(line, sizeof line, f))
        if (strstr(line, "madtrace-copies-stack_number") && sscanf(line, "%lx-%lx", &lo, &hi) == 2)
            found = lo + (hi - lo) / 2;
    if (f)
        fclose(f);
    return found;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 1;
    int from_maps = argc > 2 && strcmp(argv[2], "copies") == 0;
    volatile unsigned long number = argc > 2 && !from_maps ? strtoul(argv[2], NULL, 0) : 0;
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    long i = 0;
    double elapsed;
    do {
        for (int k = 0; k < 100000; k++) step(i++);
        clock_gettime(CLOCK_MONOTONIC, &now);
        elapsed = (now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9;
        if (from_maps && !number && elapsed > seconds / 3)
            number = inside_copies();
    } while (elapsed < seconds);
    printf("number %#lx counter %ld\n", number, counter);
    return 0;
}
