/* Blocks in read() or nanosleep() so that tests attach while it sits inside a
 * syscall; after the syscall it prints what it got, proving it completed.
 * Usage: blocking read   -> prints ready, reads a line from stdin, echoes it
 *        blocking sleep MS -> prints ready, sleeps MS ms, prints slept MS */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    printf("ready\n");
    fflush(stdout);
    if (strcmp(argv[1], "read") == 0) {
        char buf[256];
        ssize_t n = read(0, buf, sizeof buf - 1);
        if (n < 0) { printf("read failed: %s\n", strerror(errno)); return 1; }
        buf[n] = 0;
        printf("got %zd bytes: %s", n, buf);
        return 0;
    }
    long ms = argc > 2 ? atol(argv[2]) : 500;
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L}, rem;
    if (nanosleep(&ts, &rem) != 0) { printf("nanosleep failed: %s\n", strerror(errno)); return 1; }
    printf("slept %ld\n", ms);
    return 0;
}
