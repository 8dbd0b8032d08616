// SPDX-License-Identifier: GPL-2.0-or-later
/* Thread A (main): read(2) into a buffer of a traced page, over and over: the
 * fault engine opens the page for each call while thread B runs.  Thread B
 * stores twice to a word of that page and checks, each round, that the word
 * kept the value it stored last.  A fault of B taken just before a call opened
 * the page, handled after, must not go through a data slot: B would go on with
 * the page open, and the slot's write-back would undo its later store
 * ("stale N after N+1").  Prints "errors N rounds M"; exits 1 on an error. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static struct {
    char buf[64];
    volatile long v;
    volatile int done;
} page __attribute__((aligned(4096)));

static long errors, rounds;

static void *storer(void *arg) {
    (void)arg;
    long last = 0;
    for (long i = 1; !page.done; i++) {
        long seen = page.v;
        if (seen != last) {
            if (errors++ < 5)
                printf("stale %ld after %ld\n", seen, last);
            fflush(stdout);
        }
        page.v = 2 * i;
        page.v = 2 * i + 1;
        last = 2 * i + 1;
        rounds++;
    }
    return NULL;
}

int main(int argc, char **argv) {
    int calls = argc > 1 ? atoi(argv[1]) : 2000;
    int fd = open("/dev/zero", O_RDONLY);
    pthread_t t;
    if (fd < 0 || pthread_create(&t, NULL, storer, NULL) != 0)
        return 2;
    for (int i = 0; i < calls; i++)
        if (read(fd, page.buf, 8) != 8)
            return 3;
    page.done = 1;
    pthread_join(t, NULL);
    printf("errors %ld rounds %ld\n", errors, rounds);
    return errors ? 1 : 0;
}
