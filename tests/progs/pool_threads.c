/* Threads made while a live session has functions instrumented (the ring
 * pool, calls/thread_pool.py).  Prints "ready", then obeys one command per
 * line on stdin, answering one line each:
 *   join N K   creates and joins N threads one after another (glibc gives
 *              each the previous one's TCB), each calling work() K times;
 *              answers "joined N calls C sum S" (C: its own count of work())
 *   wait       a thread that calls work() once, then blocks until "go" (its
 *              TracerPid can be read meanwhile); answers "waiting TID"
 *   go         the waiting thread calls work() once more and ends; "gone"
 *   fork K     a new thread calls work() K times, then forks: the child calls
 *              work() K times too, looks for madtrace's mappings in its own
 *              maps and exits with their number; answers "forked CHILD status
 *              S calls C" (C: work() calls of the parent's thread)
 *   exec       a new thread calls work() once and execs this program with
 *              "execd" (which prints "execd", then obeys commands as ever)
 *   quit       answers "total T" (work() calls in this image) and exits 0
 * Usage: pool_threads [execd] */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static unsigned long total;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t gate = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t opened = PTHREAD_COND_INITIALIZER;
static int go, tid_ready;
static long waiting_tid;
static char self_path[4096];

__attribute__((noinline, noclone)) unsigned long work(unsigned long x) {
    __asm__ volatile("" ::: "memory");
    return x * 2654435761u + 7;
}

static unsigned long calls(unsigned long k) {
    unsigned long sum = 0;
    for (unsigned long i = 0; i < k; i++)
        sum += work(i);
    pthread_mutex_lock(&lock);
    total += k;
    pthread_mutex_unlock(&lock);
    return sum;
}

static void *joined(void *arg) {
    return (void *)calls((unsigned long)arg);
}

static void *waiter(void *arg) {
    (void)arg;
    calls(1);
    pthread_mutex_lock(&gate);
    waiting_tid = syscall(SYS_gettid);
    tid_ready = 1;
    pthread_cond_broadcast(&opened);
    while (!go)
        pthread_cond_wait(&opened, &gate);
    pthread_mutex_unlock(&gate);
    calls(1);
    return NULL;
}

static int madtrace_mappings(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[4096];
    int n = 0;
    while (f && fgets(line, sizeof line, f))
        if (strstr(line, "/memfd:madtrace-"))   /* madtrace's own memfds, not a path */
            n++;
    if (f)
        fclose(f);
    return n;
}

struct fork_result { unsigned long k; int child, status; };

static void *forker(void *arg) {
    struct fork_result *r = arg;
    calls(r->k);
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        unsigned long before = total;
        calls(r->k);
        _exit(total == before + r->k ? madtrace_mappings() : 100);
    }
    int status = -1;
    waitpid(child, &status, 0);
    r->child = child;
    r->status = WIFEXITED(status) ? WEXITSTATUS(status) : 200 + WTERMSIG(status);
    return NULL;
}

static void *execer(void *arg) {
    (void)arg;
    calls(1);
    fflush(stdout);
    char *argv[] = {self_path, "execd", NULL};
    execv(self_path, argv);
    perror("execv");
    exit(3);
}

int main(int argc, char **argv) {
    char line[128];
    pthread_t t, w;
    ssize_t n = readlink("/proc/self/exe", self_path, sizeof self_path - 1);
    if (n <= 0)
        return 2;
    self_path[n] = 0;
    printf(argc > 1 && strcmp(argv[1], "execd") == 0 ? "execd\n" : "ready\n");
    fflush(stdout);
    while (fgets(line, sizeof line, stdin)) {
        unsigned long a = 0, b = 0;
        if (sscanf(line, "join %lu %lu", &a, &b) == 2) {
            unsigned long before = total, sum = 0;
            for (unsigned long i = 0; i < a; i++) {
                void *ret;
                if (pthread_create(&t, NULL, joined, (void *)b) != 0 || pthread_join(t, &ret) != 0)
                    return 4;
                sum += (unsigned long)ret;
            }
            printf("joined %lu calls %lu sum %lu\n", a, total - before, sum);
        } else if (strncmp(line, "wait", 4) == 0) {
            go = tid_ready = 0;
            if (pthread_create(&w, NULL, waiter, NULL) != 0)
                return 4;
            pthread_mutex_lock(&gate);
            while (!tid_ready)
                pthread_cond_wait(&opened, &gate);
            pthread_mutex_unlock(&gate);
            printf("waiting %ld\n", waiting_tid);
        } else if (strncmp(line, "go", 2) == 0) {
            pthread_mutex_lock(&gate);
            go = 1;
            pthread_cond_broadcast(&opened);
            pthread_mutex_unlock(&gate);
            pthread_join(w, NULL);
            printf("gone\n");
        } else if (sscanf(line, "fork %lu", &a) == 1) {
            struct fork_result r = {a, 0, -1};
            unsigned long before = total;
            if (pthread_create(&t, NULL, forker, &r) != 0 || pthread_join(t, NULL) != 0)
                return 4;
            printf("forked %d status %d calls %lu\n", r.child, r.status, total - before);
        } else if (strncmp(line, "exec", 4) == 0) {
            if (pthread_create(&t, NULL, execer, NULL) != 0)
                return 4;
            pause();                /* the exec ends this image */
        } else if (strncmp(line, "quit", 4) == 0) {
            printf("total %lu\n", total);
            return 0;
        } else {
            printf("unknown command\n");
        }
        fflush(stdout);
    }
    return 0;
}
