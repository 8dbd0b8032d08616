/* SPDX-License-Identifier: GPL-2.0-or-later */
/* Memory semantics a data tracer must keep (argv[1] picks one; argv[2]: rounds):
 *   fork      parent and child write the same global and heap block after fork
 *   brk       the heap grows and shrinks with sbrk; regrown memory reads zeros
 *   madvise   MADV_DONTNEED / MADV_FREE on an anonymous mapping and on .bss read zeros
 *   realloc   a large block (its own mapping) grows by realloc, which moves it (mremap)
 *   threads   several threads write their own slots and one shared counter
 *   segv      the program's own SIGSEGV handler recovers from NULL dereferences
 *             between passes over traced data
 *   sigloop   a SIGALRM handler touches a traced global in the middle of a hot loop
 *   altstack  an alternate signal stack in the heap and a SIGSEGV handler on it (as
 *             python3 -X faulthandler has), never called, then passes over traced data
 * Each prints what it observed; the output is deterministic. */
#define _GNU_SOURCE
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#define PAGE 4096
long shared_global = 1;                                  /* .data */
static char bss_pages[4 * PAGE] __attribute__((aligned(PAGE)));   /* .bss */
long counter;                                            /* .bss */
long slots[8][8];                                        /* .bss: one line per thread */

__attribute__((noinline)) static long sum_bytes(const unsigned char *p, long n) {
    long s = 0;
    for (long i = 0; i < n; i++) s += p[i];
    return s;
}

__attribute__((noinline)) static void fill(unsigned char *p, long n, int v) {
    for (long i = 0; i < n; i++) p[i] = (unsigned char)(v + i);
}

static int do_fork(int rounds) {
    long *block = malloc(64 * sizeof *block);
    for (int i = 0; i < 64; i++) block[i] = i;
    fflush(stdout);
    pid_t child = fork();
    long mine = child == 0 ? 1000 : 2000;
    for (int r = 0; r < rounds; r++) {
        shared_global += mine;
        for (int i = 0; i < 64; i++) block[i] += mine;
        if (child == 0 && r == rounds / 2) usleep(1000);   /* interleave with the parent */
    }
    long s = 0;
    for (int i = 0; i < 64; i++) s += block[i];
    if (child == 0) {
        printf("child: global %ld block sum %ld\n", shared_global, s);
        fflush(stdout);
        _exit(0);
    }
    int status;
    waitpid(child, &status, 0);
    printf("parent: global %ld block sum %ld child status %d\n", shared_global, s, status);
    return 0;
}

static int do_brk(int rounds) {
    for (int r = 0; r < rounds; r++) {
        char *base = sbrk(0);
        char *grown = sbrk(8 * PAGE);
        if (grown == (void *)-1) { printf("sbrk failed\n"); return 1; }
        fill((unsigned char *)grown, 8 * PAGE, r);
        long before = sum_bytes((unsigned char *)grown, 8 * PAGE);
        sbrk(-6 * PAGE);                           /* shrink: 6 pages go back */
        long kept = sum_bytes((unsigned char *)grown, 2 * PAGE);
        char *again = sbrk(6 * PAGE);              /* regrown: zeros */
        long zeros = sum_bytes((unsigned char *)again, 6 * PAGE);
        sbrk(-8 * PAGE);
        if (r == 0 || r == rounds - 1)
            printf("brk round %d: %ld kept %ld regrown %ld (same base %d)\n", r, before, kept,
                   zeros, sbrk(0) == base);
    }
    return 0;
}

static int do_madvise(int rounds) {
    unsigned char *m = mmap(NULL, 4 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                            -1, 0);
    long totals[4] = {0};
    for (int r = 0; r < rounds; r++) {
        fill(m, 4 * PAGE, r + 1);
        fill((unsigned char *)bss_pages, 4 * PAGE, r + 2);
        madvise(m + PAGE, PAGE, MADV_DONTNEED);
        madvise(bss_pages + 2 * PAGE, PAGE, MADV_DONTNEED);
        totals[0] += sum_bytes(m + PAGE, PAGE);                   /* 0 */
        totals[1] += sum_bytes(m, PAGE);                          /* kept */
        totals[2] += sum_bytes((unsigned char *)bss_pages + 2 * PAGE, PAGE);   /* 0 */
        madvise(m + 2 * PAGE, 2 * PAGE, MADV_FREE);
        m[3 * PAGE] = 7;                   /* written again after MADV_FREE: kept */
        totals[3] += m[3 * PAGE];
    }
    printf("madvise: dontneed %ld kept %ld bss %ld free-then-written %ld\n", totals[0], totals[1],
           totals[2], totals[3]);
    return 0;
}

/* one long per page of [p, p + n) */
__attribute__((noinline)) static void touch_pages(long *p, long n, long v) {
    for (long i = 0; i < n / (long)sizeof *p; i += PAGE / sizeof *p) p[i] = v + i;
}

__attribute__((noinline)) static long sum_pages(const long *p, long n) {
    long s = 0;
    for (long i = 0; i < n / (long)sizeof *p; i += PAGE / sizeof *p) s += p[i];
    return s;
}

static int do_realloc(int rounds) {
    size_t n = 256 * 1024;                         /* above the mmap threshold */
    long *p = malloc(n);
    touch_pages(p, (long)n, 3);
    int moved = 0;
    long total = 0;
    for (int r = 0; r < rounds; r++) {
        long *q = realloc(p, n * 2);
        moved += q != p;
        touch_pages(q + n / sizeof *q, (long)n, r);
        p = q;
        n *= 2;
        total += sum_pages(p, (long)n);
        if (n > (16u << 20)) {
            p = realloc(p, 256 * 1024);
            n = 256 * 1024;
        }
    }
    printf("realloc: %d rounds, %s, sum %ld\n", rounds, moved ? "moved" : "never moved", total);
    fprintf(stderr, "stack %p\n", (void *)&total);     /* for an oracle: not data */
    free(p);
    return 0;
}

static int rounds_per_thread;

static void *worker(void *arg) {
    long id = (long)(intptr_t)arg;
    for (int r = 0; r < rounds_per_thread; r++) {
        slots[id][0] += r;
        slots[id][1] ^= r;
        __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

static int do_threads(int rounds) {
    enum { N = 4 };
    pthread_t t[N];
    rounds_per_thread = rounds;
    for (long i = 0; i < N; i++) pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i);
    for (int i = 0; i < N; i++) pthread_join(t[i], NULL);
    long s = 0;
    for (int i = 0; i < N; i++) s += slots[i][0] + slots[i][1];
    printf("threads: counter %ld slots %ld\n", counter, s);
    return 0;
}

static sigjmp_buf recover;
static int argc_zero = 1;            /* keeps the NULL pointer opaque to the compiler */
static volatile long recoveries;

static void on_segv(int sig) {
    (void)sig;
    recoveries++;
    shared_global += 3;                            /* the handler touches traced data */
    siglongjmp(recover, 1);
}

static int do_segv(int rounds) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_segv;
    sigaction(SIGSEGV, &sa, NULL);
    long total = 0;
    for (int r = 0; r < rounds; r++) {
        fill((unsigned char *)bss_pages, PAGE, r);
        total += sum_bytes((unsigned char *)bss_pages, PAGE);
        if (sigsetjmp(recover, 1) == 0) {
            volatile long *null = (long *)(uintptr_t)(r % 2 ? 0 : 8) + (argc_zero - 1);
            total += *null;
        }
    }
    printf("segv: %ld recoveries, global %ld, total %ld\n", recoveries, shared_global, total);
    return 0;
}

long x;                                                  /* .bss */
volatile long ticks;                                     /* .bss */

static void on_alarm(int sig) {
    (void)sig;
    ticks++;
    *(volatile long *)&x += 1000000;               /* a traced global, mid-loop */
}

__attribute__((noinline)) static void hot(long n) {
    for (long i = 0; i < n; i++) {
        long v = *(volatile long *)&x;             /* a load... */
        *(volatile long *)&x = v + 1;              /* ...and a store a signal may fall between */
    }
}

/* Not deterministic (timer): prints x, the ticks and the iterations, so that a
 * trace can be checked against them (an update of the handler's is lost when
 * it fell between the loop's load and store). */
static int do_sigloop(int rounds) {
    signal(SIGALRM, on_alarm);
    struct itimerval it = {{0, 1000}, {0, 1000}};
    setitimer(ITIMER_REAL, &it, NULL);
    long iterations = 0;
    while (ticks < 5 || iterations < rounds) {
        hot(1000);
        iterations += 1000;
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    printf("sigloop: x %ld ticks %ld iterations %ld\n", x, ticks, iterations);
    return 0;
}

static void on_segv_onstack(int sig) {
    (void)sig;
    _exit(3);
}

static int do_altstack(int rounds) {
    stack_t ss = {.ss_sp = malloc(64 * 1024), .ss_size = 64 * 1024, .ss_flags = 0};
    if (sigaltstack(&ss, NULL) != 0) { perror("sigaltstack"); return 1; }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_segv_onstack;
    sa.sa_flags = SA_NODEFER | SA_ONSTACK;
    sigaction(SIGSEGV, &sa, NULL);
    long *buf = calloc(8192, sizeof(long));
    long sum = 0;
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < 8192; i++) {
            buf[i] += i ^ r;
            sum += buf[i] + bss_pages[i % sizeof bss_pages];
        }
    printf("altstack: sum %ld\n", sum);
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    int rounds = argc > 2 ? atoi(argv[2]) : 100;
    setvbuf(stdout, NULL, _IOLBF, 0);
    argc_zero = argc > 0;
    if (!strcmp(mode, "fork")) return do_fork(rounds);
    if (!strcmp(mode, "brk")) return do_brk(rounds);
    if (!strcmp(mode, "madvise")) return do_madvise(rounds);
    if (!strcmp(mode, "realloc")) return do_realloc(rounds);
    if (!strcmp(mode, "threads")) return do_threads(rounds);
    if (!strcmp(mode, "segv")) return do_segv(rounds);
    if (!strcmp(mode, "sigloop")) return do_sigloop(rounds);
    if (!strcmp(mode, "altstack")) return do_altstack(rounds);
    fprintf(stderr, "usage: %s fork|brk|madvise|realloc|threads|segv|sigloop|altstack [rounds]\n",
            argv[0]);
    return 2;
}
