/* Multi-threaded worker for attach tests: N threads compute checksums over a
 * deterministic sequence; the output only depends on the arguments.
 * Usage: threads NTHREADS ITERATIONS [ready]
 * With "ready", prints "ready" once the threads are working and waits for a
 * line on stdin before joining them (so a test can attach while they work);
 * the threads stay alive until that line, however fast they finish their work. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static long iterations;
static unsigned long results[64];

static unsigned long work(unsigned long seed, long n) {
    unsigned long x = seed;
    for (long i = 0; i < n; i++) {
        x = x * 6364136223846793005UL + 1442695040888963407UL;
        if ((i & 0xffff) == 0) {
            struct timespec ts = {0, 100000};  /* sleeps: attach lands in syscalls too */
            nanosleep(&ts, NULL);
        }
    }
    return x;
}

static volatile int hold;   /* "ready" mode: threads stay alive until the line arrives */

static void *thread_main(void *arg) {
    long id = (long)arg;
    results[id] = work((unsigned long)id + 1, iterations);
    while (hold) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 4;
    iterations = argc > 2 ? atol(argv[2]) : 1000000;
    if (n < 1 || n > 64) return 2;
    pthread_t tids[64];
    int ready = argc > 3 && strcmp(argv[3], "ready") == 0;
    hold = ready;
    for (long i = 0; i < n; i++) pthread_create(&tids[i], NULL, thread_main, (void *)i);
    if (ready) {
        printf("ready\n");
        fflush(stdout);
        char line[16];
        if (!fgets(line, sizeof line, stdin)) return 3;
        hold = 0;
    }
    for (int i = 0; i < n; i++) pthread_join(tids[i], NULL);
    for (int i = 0; i < n; i++) printf("thread %d: %016lx\n", i, results[i]);
    return 0;
}
