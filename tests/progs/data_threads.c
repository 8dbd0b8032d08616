/* Multi-threaded data-access test: each thread updates its own slice of a
 * global array and a per-thread counter in a global table, with no system
 * calls in its loop, so every access is deterministic per instruction. */
#include <pthread.h>
#include <stdio.h>

#define THREADS 3
#define SLICE 64
long data[THREADS * SLICE];
long counters[THREADS];

static void *worker(void *arg) {
    long id = (long)arg;
    for (int round = 0; round < 5; round++)
        for (int i = 0; i < SLICE; i++) {
            data[id * SLICE + i] += round + i;
            counters[id]++;
        }
    return NULL;
}

int main(void) {
    pthread_t t[THREADS];
    for (long i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, worker, (void *)i);
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    long s = 0;
    for (int i = 0; i < THREADS * SLICE; i++) s += data[i];
    printf("sum=%ld counters=%ld,%ld,%ld\n", s, counters[0], counters[1], counters[2]);
    return 0;
}
