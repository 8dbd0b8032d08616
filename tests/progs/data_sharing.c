/* Threads and cache lines, for report --kind sharing: two threads each store
 * to their own field of one struct (false sharing: pair.left, pair.right on
 * one line), both add to a counter under a mutex (true sharing), and each
 * stores to its own slot of a padded array (one line each: not shared).
 * main touches none of them but the counter: each thread returns what it
 * stored, and main prints that.  Usage: data_sharing [ROUNDS] (default 20000). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static int ROUNDS = 20000; /* argv[1] */

struct pair {
    long left;
    long right;
} __attribute__((aligned(64)));

struct slot {
    long value;
    char pad[56];
} __attribute__((aligned(64)));

struct pair pair;
long counter __attribute__((aligned(64)));
struct slot slots[2];
pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void *left(void *arg) {
    (void)arg;
    for (int i = 0; i < ROUNDS; i++) {
        ((volatile struct pair *)&pair)->left += 1;
        ((volatile struct slot *)&slots[0])->value += 2;
        if (i % 100 == 0) {
            pthread_mutex_lock(&lock);
            counter++;
            pthread_mutex_unlock(&lock);
        }
    }
    return (void *)((pair.left << 32) | slots[0].value); /* rounds < 2^31 */
}

static void *right(void *arg) {
    (void)arg;
    for (int i = 0; i < ROUNDS; i++) {
        ((volatile struct pair *)&pair)->right += 1;
        ((volatile struct slot *)&slots[1])->value += 3;
        if (i % 100 == 0) {
            pthread_mutex_lock(&lock);
            counter++;
            pthread_mutex_unlock(&lock);
        }
    }
    return (void *)((pair.right << 32) | slots[1].value);
}

int main(int argc, char **argv) {
    if (argc > 1) ROUNDS = atoi(argv[1]);
    pthread_t a, b;
    void *l, *r;
    pthread_create(&a, NULL, left, NULL);
    pthread_create(&b, NULL, right, NULL);
    pthread_join(a, &l);
    pthread_join(b, &r);
    printf("left=%ld right=%ld counter=%ld slots=%ld,%ld\n", (long)l >> 32, (long)r >> 32, counter,
           (long)l & 0xffffffffL, (long)r & 0xffffffffL);
    return 0;
}
