// SPDX-License-Identifier: GPL-2.0-or-later
// Threads that map, use and unmap memory over and over, side by side: the
// kernel gives a thread the range another thread has just unmapped (or moved
// away from), so one thread's munmap (or mremap) and another's mmap of the same
// pages follow each other closely (a tracer may see their ends in either
// order).  Each round writes and reads every page of its mapping; with
// "mremap", the mapping is moved to twice its size (the space above is taken:
// the kernel moves it) and every page is read and written again before the
// unmap.  A checksum per thread is printed.
// Usage: data_mmap_race THREADS ROUNDS [mremap]
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define PAGES 4
#define PAGE 4096

static long rounds;
static int move;
static long sums[16];

static void *worker(void *arg)
{
    long me = (long)arg, sum = 0;
    for (long r = 0; r < rounds; r++) {
        size_t size = PAGES * PAGE;
        volatile long *p = mmap(NULL, size, PROT_READ | PROT_WRITE,
                                MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            abort();
        for (int i = 0; i < PAGES; i++)
            p[i * PAGE / sizeof(long)] = me * 1000 + r + i;
        if (move) {
            p = mremap((void *)p, size, 2 * size, MREMAP_MAYMOVE);
            if (p == MAP_FAILED)
                abort();
            size *= 2;
        }
        for (size_t i = 0; i < size / PAGE; i++)
            sum += p[i * PAGE / sizeof(long)];
        if (move)
            for (size_t i = 0; i < size / PAGE; i++)
                p[i * PAGE / sizeof(long)] = i;
        munmap((void *)p, size);
    }
    sums[me] = sum;
    return NULL;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 4;
    rounds = argc > 2 ? atol(argv[2]) : 200;
    move = argc > 3 && strcmp(argv[3], "mremap") == 0;
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
