/* A single-threaded program that vforks all the time, for tests that attach,
 * trace data and detach while its one thread may be stopped at a vfork event
 * (no other thread could then run a system call for the tracer).
 * Usage: vfork_loop PERIOD_US [ready]
 * Each round stores into a global and a heap block, vforks a child that
 * _exits at once with the round's number (checked by waitpid), then sleeps
 * PERIOD_US microseconds (0: not at all).  With "ready" it prints "ready"
 * first; it goes on until a line (or EOF) arrives on stdin, then prints its
 * rounds and a checksum that depends only on their number. */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

long rounds_done;        /* .bss */
long checksum = 7;       /* .data */

static int stdin_has_input(void) {
    struct pollfd p = {0, POLLIN, 0};
    return poll(&p, 1, 0) > 0;
}

int main(int argc, char **argv) {
    long period = argc > 1 ? atol(argv[1]) : 50000;
    if (argc > 2 && strcmp(argv[2], "ready") == 0) {
        printf("ready\n");
        fflush(stdout);
    }
    long *block = malloc(64 * sizeof(long));
    if (!block) return 2;
    memset(block, 0, 64 * sizeof(long));
    while (!stdin_has_input()) {
        long i = rounds_done;
        block[i % 64] += i;
        checksum = checksum * 31 + block[i % 64];
        pid_t child = vfork();
        if (child < 0) { printf("vfork failed at %ld\n", i); return 3; }
        if (child == 0) _exit((int)(i & 0x7f));
        int status;
        if (waitpid(child, &status, 0) != child || !WIFEXITED(status) ||
            WEXITSTATUS(status) != (int)(i & 0x7f)) {
            printf("vfork child failed at %ld: status %#x\n", i, status);
            return 4;
        }
        rounds_done = i + 1;
        if (period > 0) {
            struct timespec ts = {period / 1000000, (period % 1000000) * 1000};
            nanosleep(&ts, NULL);
        }
    }
    long expect = 7, sums[64] = {0};
    for (long i = 0; i < rounds_done; i++) {
        sums[i % 64] += i;
        expect = expect * 31 + sums[i % 64];
    }
    printf("rounds %s checksum %s\n", rounds_done > 0 ? "some" : "none",
           checksum == expect ? "ok" : "wrong");
    return checksum != expect;
}
