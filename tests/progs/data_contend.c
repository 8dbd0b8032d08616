/* Threads contending for a lock that lives on a traced page, and a thread
 * blocked in a system call that writes into a traced page.
 * Usage: data_contend mutex | pipe
 * mutex: 4 threads each add into a global counter 4 times under a pthread
 *   mutex; the mutex and the counter share one .bss page (one aligned
 *   struct), and each holds the lock 2 ms, so the others block in futex on it.
 * pipe: a thread blocks in read() on a pipe into a buffer of a .bss page
 *   while 3 threads store into the same page 64 times each; then the main
 *   thread feeds the pipe.
 * Prints what it computed; the output depends only on the mode. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define THREADS 4
#define ADDS 4

static struct {
    pthread_mutex_t lock;
    long counter;
    char buf[64];
    long words[3][8];
} __attribute__((aligned(4096))) page;

static int fds[2];

static void pause_ms(long ms) {
    struct timespec ts = {0, ms * 1000000L};
    nanosleep(&ts, NULL);
}

static void *adder(void *arg) {
    (void)arg;
    for (int i = 0; i < ADDS; i++) {
        pthread_mutex_lock(&page.lock);
        long v = page.counter;
        pause_ms(2);
        page.counter = v + 1;
        pthread_mutex_unlock(&page.lock);
    }
    return NULL;
}

static void *reader(void *arg) {
    (void)arg;
    size_t got = 0;
    while (got < sizeof page.buf) {
        ssize_t n = read(fds[0], page.buf + got, sizeof page.buf - got);
        if (n <= 0) return (void *)1;
        got += (size_t)n;
    }
    return NULL;
}

static void *writer(void *arg) {
    long t = (long)arg;
    for (int i = 0; i < 64; i++) {
        ((volatile long *)page.words[t])[i % 8] += i + t;
        if (i % 16 == 15) pause_ms(1);
    }
    return NULL;
}

static int run_mutex(void) {
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        if (pthread_create(&t[i], NULL, adder, NULL)) return 1;
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    printf("counter %ld\n", page.counter);
    return page.counter != THREADS * ADDS;
}

static int run_pipe(void) {
    if (pipe(fds)) return 1;
    pthread_t r, w[3];
    if (pthread_create(&r, NULL, reader, NULL)) return 1;
    pause_ms(20);                       /* the reader blocks in read() */
    for (long i = 0; i < 3; i++)
        if (pthread_create(&w[i], NULL, writer, (void *)i)) return 1;
    for (int i = 0; i < 3; i++) pthread_join(w[i], NULL);
    char msg[64];
    for (int i = 0; i < 64; i++) msg[i] = (char)('a' + i % 26);
    if (write(fds[1], msg, sizeof msg) != (ssize_t)sizeof msg) return 1;
    void *failed;
    pthread_join(r, &failed);
    long sum = 0;
    for (int t = 0; t < 3; t++)
        for (int i = 0; i < 8; i++) sum += page.words[t][i];
    printf("buffer %s words %ld\n", memcmp(page.buf, msg, sizeof msg) == 0 ? "ok" : "wrong", sum);
    return failed != NULL;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "pipe") == 0) return run_pipe();
    return run_mutex();
}
