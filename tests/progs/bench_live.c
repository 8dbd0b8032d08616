// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * The C target of bench/bench_live.py and of the live tests.
 *
 *   bench_live
 *
 * Prints "ready", then obeys one command per line on stdin:
 *   calls N   -> calls wrapper(i) N times (wrapper calls leaf: N calls of each)
 *               and prints "calls N checksum C ns_per_call T" (its own loop's time)
 *   watch MS  -> runs a loop of short steps (one leaf call each) for MS ms and
 *               prints "watch steps S longest_us L": the longest time between two
 *               steps, i.e. the longest pause of the program (a tracer stopping
 *               it to attach or to patch shows there), then "gaps" and each
 *               pause longer than 1 ms as START:LENGTH (CLOCK_MONOTONIC ns;
 *               the 64 longest)
 *   quit      -> exits 0
 * Each reply is one line, flushed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TRACED __attribute__((noinline, noclone, noipa))
#define GAP_NS 1e6          /* pauses listed by watch: longer than 1 ms */
#define MAX_GAPS 64

TRACED unsigned long leaf(unsigned long i) {
    return i * 2654435761UL ^ (i >> 7);
}

TRACED unsigned long wrapper(unsigned long i) {
    return leaf(i) + (i & 3);
}

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

int main(void) {
    char line[128];
    printf("ready\n");
    fflush(stdout);
    while (fgets(line, sizeof line, stdin)) {
        if (strncmp(line, "calls ", 6) == 0) {
            unsigned long n = strtoul(line + 6, NULL, 10), sum = 0;
            double start = now_ns();
            for (unsigned long i = 0; i < n; i++)
                sum += wrapper(i);
            double end = now_ns();
            printf("calls %lu checksum %lu ns_per_call %.3f\n", n, sum, (end - start) / (n ? n : 1));
        } else if (strncmp(line, "watch ", 6) == 0) {
            double ms = atof(line + 6), start = now_ns(), last = start, longest = 0;
            double gaps[MAX_GAPS][2];           /* start (CLOCK_MONOTONIC ns), length */
            unsigned long steps = 0, sum = 0, ngaps = 0;
            for (;;) {
                sum += leaf(steps++);
                double t = now_ns();
                if (t - last > longest)
                    longest = t - last;
                if (t - last > GAP_NS) {            /* kept: the MAX_GAPS longest */
                    unsigned long g = ngaps;
                    if (ngaps == MAX_GAPS) {        /* full: the shortest goes, if shorter */
                        g = 0;
                        for (unsigned long k = 1; k < MAX_GAPS; k++)
                            if (gaps[k][1] < gaps[g][1])
                                g = k;
                        if (gaps[g][1] >= t - last)
                            g = MAX_GAPS;
                    } else {
                        ngaps++;
                    }
                    if (g < MAX_GAPS) {
                        gaps[g][0] = last;
                        gaps[g][1] = t - last;
                    }
                }
                last = t;
                if (t - start >= ms * 1e6)
                    break;
            }
            printf("watch steps %lu longest_us %.1f checksum %lu gaps", steps, longest / 1000, sum);
            for (unsigned long g = 0; g < ngaps; g++)
                printf(" %.0f:%.0f", gaps[g][0], gaps[g][1]);
            printf("\n");
        } else if (strncmp(line, "quit", 4) == 0) {
            return 0;
        } else {
            printf("unknown command\n");
        }
        fflush(stdout);
    }
    return 0;
}
