/* Threads that allocate, copy and free, and hand blocks to each other: each of
 * THREADS workers mallocs two blocks a round, fills one, copies it into the
 * other (memcpy), reads and frees the copy, and passes the first to the next
 * worker's mailbox (a mutex-protected slot), whose owner reads and frees it;
 * when the mailbox is full it frees the block itself.  So addresses freed by one
 * thread are reused by another.  A correct program: no access to freed memory,
 * every block read once, a total independent of the interleaving.
 * Usage: hooks_threads [ROUNDS] [THREADS]; prints the total and the mallocs. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_THREADS 16

struct mailbox {
    pthread_mutex_t lock;
    unsigned char *block;
    size_t size;
};

static struct mailbox boxes[MAX_THREADS];
static int threads = 4;
static long rounds = 1000;
static unsigned long total, mallocs;
static pthread_mutex_t totals = PTHREAD_MUTEX_INITIALIZER;
/* called through this, so that no optimisation turns it into inline code */
static void *(*volatile copy)(void *, const void *, size_t) = memcpy;

static unsigned long consume(unsigned char *p, size_t n) {
    unsigned long s = 0;
    for (size_t j = 0; j < n; j++)
        s += p[j];
    free(p);
    return s;
}

static void *worker(void *arg) {
    int me = (int)(long)arg, next = (me + 1) % threads;
    unsigned long sum = 0, made = 0;
    for (long i = 0; i < rounds; i++) {
        size_t n = 24 + (size_t)((i + me) % 9) * 16;
        unsigned char *a = malloc(n), *b = malloc(n);
        made += 2;
        for (size_t j = 0; j < n; j++)
            a[j] = (unsigned char)(me * 31 + i + j);
        copy(b, a, n);
        sum += consume(b, n);
        pthread_mutex_lock(&boxes[next].lock);
        if (!boxes[next].block) {
            boxes[next].block = a;
            boxes[next].size = n;
            a = NULL;
        }
        pthread_mutex_unlock(&boxes[next].lock);
        if (a)
            sum += consume(a, n);
        pthread_mutex_lock(&boxes[me].lock);
        unsigned char *got = boxes[me].block;
        size_t size = boxes[me].size;
        boxes[me].block = NULL;
        pthread_mutex_unlock(&boxes[me].lock);
        if (got)
            sum += consume(got, size);
    }
    pthread_mutex_lock(&totals);
    total += sum;
    mallocs += made;
    pthread_mutex_unlock(&totals);
    return NULL;
}

int main(int argc, char **argv) {
    rounds = argc > 1 ? atol(argv[1]) : 1000;
    threads = argc > 2 ? atoi(argv[2]) : 4;
    if (threads < 1 || threads > MAX_THREADS)
        return 2;
    pthread_t ids[MAX_THREADS];
    for (int t = 0; t < threads; t++)
        pthread_mutex_init(&boxes[t].lock, NULL);
    for (int t = 0; t < threads; t++)
        pthread_create(&ids[t], NULL, worker, (void *)(long)t);
    for (int t = 0; t < threads; t++)
        pthread_join(ids[t], NULL);
    for (int t = 0; t < threads; t++)
        if (boxes[t].block)
            total += consume(boxes[t].block, boxes[t].size);
    printf("total=%lu malloc=%lu\n", total, mallocs);
    return 0;
}
