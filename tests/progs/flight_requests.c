/* Requests served in a loop, for the flight recorder's tests: request R calls
 * handle(), which calls work() 100 + R % 7 times; work() loads and stores a
 * global table and a heap block allocated before the first request.  Request
 * SLOW is made slow on purpose (handle sleeps 30 ms in it).  With a third
 * argument: "segv" dies of SIGSEGV after the last request, "abort" of SIGABRT.
 * Prints the requests served and the sum of their answers; with
 * FLIGHT_REQUESTS_TIME set in the environment, the loop's own time (ns) to
 * stderr (bench/bench_flight.py: the recording's cost, its start and end left
 * out).
 * Usage: flight_requests REQUESTS SLOW [segv|abort] */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

long table[256];
long *heap;

__attribute__((noinline, noclone)) long work(long x) {
    table[x & 255] += x;
    heap[x & 63] += x;
    return table[x & 255] + heap[x & 63];
}

__attribute__((noinline, noclone)) long handle(long n, int slow) {
    long sum = 0;
    for (long i = 0; i < n; i++)
        sum += work(i);
    if (slow)
        usleep(30000);
    return sum;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: flight_requests REQUESTS SLOW [segv|abort]\n");
        return 2;
    }
    long requests = atol(argv[1]), slow = atol(argv[2]);
    heap = calloc(64, sizeof(long));
    long total = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long r = 0; r < requests; r++) {
        total += handle(100 + r % 7, r == slow);
        if (r % 64 == 0)
            usleep(200);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (getenv("FLIGHT_REQUESTS_TIME"))
        fprintf(stderr, "loop %.0f ns\n", (t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec));
    printf("served %ld requests, sum %ld\n", requests, total);
    fflush(stdout);
    if (argc > 3 && strcmp(argv[3], "segv") == 0)
        *(volatile int *)(long)argc = 0;        /* address 4: SIGSEGV */
    if (argc > 3 && strcmp(argv[3], "abort") == 0)
        abort();
    free(heap);
    return 0;
}
