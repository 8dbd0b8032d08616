// SPDX-License-Identifier: GPL-2.0-or-later
// Threads that map memory, use it, move it with mremap to a larger size (the
// kernel moves it: the space above is taken), use it again and unmap it, side
// by side: another thread's mmap may get the range a move vacated.  Each round
// writes and reads every page before and after the move; a checksum per thread.
// Usage: data_mremap_race THREADS ROUNDS
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#define PAGES 4
#define PAGE 4096

static long rounds;
static long sums[16];

static void *worker(void *arg)
{
    long me = (long)arg, sum = 0;
    for (long r = 0; r < rounds; r++) {
        volatile long *p = mmap(NULL, PAGES * PAGE, PROT_READ | PROT_WRITE,
                                MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            abort();
        for (int i = 0; i < PAGES; i++)
            p[i * PAGE / sizeof(long)] = me * 1000 + r + i;
        volatile long *q = mremap((void *)p, PAGES * PAGE, 2 * PAGES * PAGE, MREMAP_MAYMOVE);
        if (q == MAP_FAILED)
            abort();
        for (int i = 0; i < 2 * PAGES; i++)
            sum += q[i * PAGE / sizeof(long)];
        for (int i = 0; i < 2 * PAGES; i++)
            q[i * PAGE / sizeof(long)] = i;
        munmap((void *)q, 2 * PAGES * PAGE);
    }
    sums[me] = sum;
    return NULL;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 4;
    rounds = argc > 2 ? atol(argv[2]) : 200;
    if (threads < 1 || threads > 16)
        return 2;
    pthread_t t[16];
    for (long i = 0; i < threads; i++)
        pthread_create(&t[i], NULL, worker, (void *)i);
    for (int i = 0; i < threads; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < threads; i++)
        printf("thread %d sum %ld\n", i, sums[i]);
    return 0;
}
