/* Threads, forks and blocking calls all the time, for tests that run system
 * calls inside the target whatever state its threads are in.
 * Usage: churn ROUNDS [ready]
 * The main thread creates and joins a thread per round (clone events), forks
 * every 4th round and vforks+execs /bin/true every 16th (fork, vfork, exec,
 * vfork-done events); a reader thread blocks in read() on a pipe the main
 * thread feeds (a restartable call), a sleeper thread in nanosleep (restarted
 * through restart_syscall).  Every result is checked; the output depends only
 * on the number of rounds.  With "ready" it prints "ready" and, when ROUNDS is
 * 0, goes on until a line (or EOF) arrives on stdin. */
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int fds[2];
static long rounds;
static long bytes_read, bytes_sum;
static volatile int done;

static void *reader(void *arg) {
    (void)arg;
    for (;;) {
        unsigned char c;
        ssize_t n = read(fds[0], &c, 1);
        if (n == 0) break;
        if (n != 1) { printf("read failed after %ld bytes: %zd\n", bytes_read, n); exit(1); }
        bytes_read++;
        bytes_sum += c;
    }
    return NULL;
}

static void *sleeper(void *arg) {
    (void)arg;
    while (!done) {
        struct timespec ts = {0, 300000};
        if (nanosleep(&ts, NULL) != 0) { printf("nanosleep failed\n"); exit(1); }
    }
    return NULL;
}

static int stdin_has_input(void) {
    struct pollfd p = {0, POLLIN, 0};
    return poll(&p, 1, 0) > 0;
}

static void *square(void *arg) {
    long v = (long)arg;
    return (void *)(v * v);
}

int main(int argc, char **argv) {
    rounds = argc > 1 ? atol(argv[1]) : 200;
    int until_input = rounds == 0;
    if (argc > 2 && strcmp(argv[2], "ready") == 0) {
        printf("ready\n");
        fflush(stdout);
    }
    if (pipe(fds) != 0) return 2;
    pthread_t r, s;
    if (pthread_create(&r, NULL, reader, NULL) || pthread_create(&s, NULL, sleeper, NULL)) return 3;
    long squares = 0, forks = 0, execs = 0;
    long i;
    for (i = 0; until_input ? !stdin_has_input() : i < rounds; i++) {
        pthread_t t;
        int rc = pthread_create(&t, NULL, square, (void *)i);
        if (rc != 0) { printf("pthread_create failed at %ld: %d\n", i, rc); return 4; }
        void *ret;
        if (pthread_join(t, &ret) != 0 || (long)ret != i * i) { printf("join failed at %ld\n", i); return 5; }
        squares += (long)ret;
        unsigned char c = (unsigned char)i;
        if (write(fds[1], &c, 1) != 1) return 6;
        if (i % 4 == 0) {
            pid_t child = fork();
            if (child < 0) { printf("fork failed at %ld\n", i); return 7; }
            if (child == 0) _exit((int)(i & 0x7f));
            int status;
            if (waitpid(child, &status, 0) != child || !WIFEXITED(status) ||
                WEXITSTATUS(status) != (int)(i & 0x7f)) {
                printf("fork child failed at %ld: status %#x\n", i, status);
                return 8;
            }
            forks++;
        }
        if (i % 16 == 0) {
            pid_t child = vfork();
            if (child < 0) { printf("vfork failed at %ld\n", i); return 9; }
            if (child == 0) { execl("/bin/true", "true", (char *)NULL); _exit(127); }
            int status;
            if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                printf("vfork child failed at %ld: status %#x\n", i, status);
                return 10;
            }
            execs++;
        }
    }
    close(fds[1]);
    done = 1;
    pthread_join(r, NULL);
    pthread_join(s, NULL);
    printf("rounds %ld squares %ld bytes %ld/%ld forks %ld execs %ld\n",
           i, squares, bytes_read, bytes_sum, forks, execs);
    return 0;
}
