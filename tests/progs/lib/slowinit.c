/* SPDX-License-Identifier: GPL-2.0-or-later */
/* A library whose constructor sleeps MT_SLOW_INIT_MS milliseconds (LD_PRELOAD):
 * the dynamic loader runs it before the program's entry point, so a program
 * that preloads it stays that long between its exec and its entry point. */
#include <stdlib.h>
#include <time.h>

__attribute__((constructor)) static void slow_init(void) {
    const char *ms = getenv("MT_SLOW_INIT_MS");
    long n = ms ? atol(ms) : 0;
    struct timespec t = {n / 1000, (n % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0) {
    }
}
