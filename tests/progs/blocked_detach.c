// SPDX-License-Identifier: GPL-2.0-or-later
/* Threads blocked in system calls on traced memory while madtrace detaches:
 * the main thread reads its commands with read(2) into a global buffer
 * (.bss), a second thread waits on a condition variable in .bss with an
 * absolute timeout (a futex wait the kernel restarts through restart_syscall).
 * Each line read is answered "got LINE"; "quit" ends both threads ("bye").
 * A read or a wait that fails (EFAULT once madtrace's alias is gone) ends
 * the program with its errno. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char line[256];
static pthread_mutex_t gate = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t woken = PTHREAD_COND_INITIALIZER;
static int stopping, wait_error;

static void *sleeper(void *arg) {
    (void)arg;
    pthread_mutex_lock(&gate);
    while (!stopping) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 60;
        int rc = pthread_cond_timedwait(&woken, &gate, &until);
        if (rc != 0 && rc != ETIMEDOUT) {
            wait_error = rc;
            break;
        }
    }
    pthread_mutex_unlock(&gate);
    return NULL;
}

int main(void) {
    pthread_t t;
    if (pthread_create(&t, NULL, sleeper, NULL) != 0)
        return 2;
    printf("ready\n");
    fflush(stdout);
    for (;;) {
        ssize_t n = read(0, line, sizeof line - 1);
        if (n <= 0) {
            printf("read %zd errno %d\n", n, errno);
            return 3;
        }
        line[n] = 0;
        if (strncmp(line, "quit", 4) == 0)
            break;
        printf("got %s", line);
        fflush(stdout);
    }
    pthread_mutex_lock(&gate);
    stopping = 1;
    pthread_cond_signal(&woken);
    pthread_mutex_unlock(&gate);
    pthread_join(t, NULL);
    printf(wait_error ? "wait error %d\n" : "bye\n", wait_error);
    return wait_error ? 4 : 0;
}
