/* Allocation and block-copy churn, for the hybrid engine's hook stubs: ROUNDS
 * rounds of malloc, a fill loop, memcpy (heap to heap, heap to a global),
 * memset of a global and free.  The number of ptrace stops must not grow with
 * ROUNDS.  Usage: hooks_churn [ROUNDS] [MODE]; prints a checksum and the calls
 * it made, and on stderr "heap LO HI" (its brk heap, for lackey).  MODE:
 *   plain     the rounds alone
 *   fork      fork first (both processes churn), posix_spawn /bin/true now and then
 *   signals   a SIGVTALRM handler (every 50 us of the program's own CPU time)
 *             copies a global with memcpy, in the middle of the rounds' hooked
 *             calls; its count goes to stderr
 *   storm     the same handler, SIGVTALRM sent by a second thread to the main one
 *             over and over (each once the last was handled) while it churns: many
 *             signals land while a hook stub writes its records
 *   longjmp   every 50th round a memcpy from an unmapped address, left by
 *             siglongjmp from the program's own SIGSEGV handler
 *   readonly  each round also copies from a page the program made read-only
 * and, for bench/bench_hooks.py, one kind of call alone, ROUNDS times:
 *   pairs     malloc(48) and free
 *   copies    memcpy of 64 bytes between two heap blocks
 *   untraced  memcpy of 64 bytes between two stack buffers
 *   bulk      memcpy of 100000 bytes between two heap blocks (a thread is most of
 *             its time inside memcpy: detached there, tests/test_hooks.py); with
 *             ROUNDS 0, until SIGUSR1 (it prints the rounds it made)
 */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;
static char global_buf[512], handler_buf[64];
static volatile sig_atomic_t handler_copies;
static sigjmp_buf escape;
/* called through pointers in .data: no optimisation turns them into inline code,
 * and no call goes through the PLT (its GOT shares a page with .data here: every
 * PLT jump would be a fault of the data engine's, whatever the hooks do) */
static void *(*volatile copy)(void *, const void *, size_t) = memcpy;
static void *(*volatile fill)(void *, int, size_t) = memset;
static void *(*volatile alloc)(size_t) = malloc;
static void (*volatile release)(void *) = free;

static void on_alarm(int sig) {
    (void)sig;
    copy(handler_buf, global_buf + 8, sizeof handler_buf);
    handler_copies++;
}

static volatile int storm_over;
static pid_t main_tid;
static void *storm(void *arg) {
    (void)arg;
    while (!storm_over) {
        int before = handler_copies;
        syscall(SYS_tgkill, getpid(), main_tid, SIGVTALRM);
        while (handler_copies == before && !storm_over)
            sched_yield();
    }
    return NULL;
}

static volatile sig_atomic_t stop;
static void on_usr1(int sig) {
    (void)sig;
    stop = 1;
}

static void on_segv(int sig) {
    (void)sig;
    siglongjmp(escape, 1);
}

/* one kind of call alone (bench/bench_hooks.py) */
static int alone(const char *mode, long rounds) {
    char stack_a[64], stack_b[64];
    char *a = alloc(64), *b = alloc(64);
    unsigned long sum = 0;
    int pairs = !strcmp(mode, "pairs"), copies = !strcmp(mode, "copies");
    if (!strcmp(mode, "bulk")) {
        size_t n = 100000;
        char *big_a = alloc(n), *big_b = alloc(n);
        long i = 0;
        for (size_t j = 0; j < n; j++)
            big_a[j] = (char)(j * 7);
        signal(SIGUSR1, on_usr1);
        if (rounds == 0)
            printf("ready\n");
        fflush(stdout);
        for (; rounds ? i < rounds : !stop; i++) {
            big_a[(size_t)i % n] ^= 1;
            copy(big_b, big_a, n);
            sum += (unsigned char)big_b[((size_t)i * 4097) % n];
        }
        printf("%s rounds=%ld sum=%lu\n", mode, i, sum);
        return 0;
    }
    memset(stack_a, 1, sizeof stack_a);
    memset(a, 1, 64);
    for (long i = 0; i < rounds; i++) {
        if (pairs) {
            char *p = alloc(48);
            sum += (unsigned long)p & 0xff;
            release(p);
        } else if (copies) {
            copy(b, a, 64);
        } else {
            copy(stack_b, stack_a, 64);
        }
    }
    sum += (unsigned char)b[63] + (unsigned char)stack_b[63];
    release(a);
    release(b);
    printf("%s rounds=%ld sum=%lu\n", mode, rounds, sum % 3);
    return 0;
}

int main(int argc, char **argv) {
    long rounds = argc > 1 ? atol(argv[1]) : 1000;
    const char *mode = argc > 2 ? argv[2] : "plain";
    if (!strcmp(mode, "pairs") || !strcmp(mode, "copies") || !strcmp(mode, "untraced") ||
        !strcmp(mode, "bulk"))
        return alone(mode, rounds);
    int jumps = !strcmp(mode, "longjmp"), storming = !strcmp(mode, "storm");
    int signals = !strcmp(mode, "signals") || storming;
    pthread_t sender;
    unsigned long sum = 0, mallocs = 0, frees = 0, copies = 0, sets = 0, escapes = 0;
    char *keep[8] = {0}, *page = NULL;
    pid_t child = -1;
    char *heap = sbrk(0);
    if (!strcmp(mode, "fork"))
        child = fork();
    if (signals) {
        signal(SIGVTALRM, on_alarm);
        struct itimerval every = {{0, 50}, {0, 50}};
        if (storming) {
            main_tid = (pid_t)syscall(SYS_gettid);
            if (pthread_create(&sender, NULL, storm, NULL) != 0)
                return 1;
            while (handler_copies == 0)      /* the storm has begun (a fast run could */
                sched_yield();               /* otherwise end before the sender starts) */
        } else
            setitimer(ITIMER_VIRTUAL, &every, NULL);
    }
    if (jumps)
        signal(SIGSEGV, on_segv);
    if (!strcmp(mode, "readonly")) {
        page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        for (int j = 0; j < 4096; j++)
            page[j] = (char)(j * 7);
        mprotect(page, 4096, PROT_READ);
    }
    for (long i = 0; i < rounds; i++) {
        size_t n = 16 + (size_t)(i % 7) * 24, m = 8 + (size_t)(i % 61);
        char *a = alloc(n), *b = alloc(n);
        mallocs += 2;
        for (size_t j = 0; j < n; j++)
            a[j] = (char)(i + j);
        copy(b, a, n);
        copy(global_buf, b, n);
        copies += 2;
        fill(global_buf + 256, (int)(i & 0x7f), m);
        sets++;
        if (page) {
            copy(a, page + (i % 64) * 8, n);
            copies++;
        }
        if (jumps && i % 50 == 0) {
            if (!sigsetjmp(escape, 1))
                copy(a, (const char *)16, n);      /* faults in memcpy */
            else
                escapes++;
            copies++;
        }
        if (child >= 0 && i % (rounds / 4 + 1) == 0) {
            pid_t pid;
            char *args[] = {"/bin/true", NULL};
            if (posix_spawn(&pid, "/bin/true", NULL, NULL, args, environ) == 0)
                waitpid(pid, NULL, 0);
        }
        sum += (unsigned char)b[n - 1] + (unsigned char)global_buf[3] +
               (unsigned char)global_buf[256 + m - 1] + (unsigned char)a[n / 2];
        release(a);
        frees++;
        if (keep[i % 8]) {
            release(keep[i % 8]);
            frees++;
        }
        keep[i % 8] = b;
    }
    for (int k = 0; k < 8; k++)
        if (keep[k]) {
            release(keep[k]);
            frees++;
        }
    if (signals) {
        struct itimerval off = {{0, 0}, {0, 0}};
        setitimer(ITIMER_VIRTUAL, &off, NULL);
        if (storming) {
            storm_over = 1;
            pthread_join(sender, NULL);
        }
        fprintf(stderr, "handler memcpy=%d\n", (int)handler_copies);
    }
    if (child > 0)
        waitpid(child, NULL, 0);
    fprintf(stderr, "heap %p %p\n", (void *)heap, sbrk(0));
    printf("%s%s sum=%lu malloc=%lu free=%lu memcpy=%lu memset=%lu escapes=%lu\n",
           child == 0 ? "child " : "", mode, sum, mallocs, frees, copies, sets, escapes);
    return 0;
}
