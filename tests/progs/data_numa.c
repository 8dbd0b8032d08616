/* NUMA test program: threads bound to CPU 0 or CPU 1 (sched_setaffinity)
 * or left with the process's mask, first-touching and then reading three
 * mmap'd arrays, one phase at a time (each thread is joined before the next
 * starts), so every access's thread binding and page owner are known:
 *   fill_a   thread on CPU 0 stores a[]        (first touch of a's pages)
 *   fill_b   thread on CPU 1 stores b[]        (first touch of b's pages)
 *   fill_u   main thread (process mask) stores u[]  (first touch of u's pages)
 *   sum_b    thread on CPU 0 loads b[]
 *   sum_a    thread with the process mask loads a[]
 *   sum_u    thread on CPU 1 loads u[]
 * Each loop makes exactly N accesses to its array (the array pointer is
 * copied into a local first).  u is unmapped before the end.  Exits 77 when
 * CPU 1 cannot be used. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#define N 4096                       /* ints per array: 4 pages */
int *a, *b, *u;
long results[3];

static void bind_cpu(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) {
        perror("sched_setaffinity");
        exit(77);
    }
}

__attribute__((noinline)) void *fill_a(void *arg) {
    (void)arg;
    bind_cpu(0);
    int *p = a;
    for (int i = 0; i < N; i++) p[i] = i;
    return NULL;
}

__attribute__((noinline)) void *fill_b(void *arg) {
    (void)arg;
    bind_cpu(1);
    int *p = b;
    for (int i = 0; i < N; i++) p[i] = 2 * i;
    return NULL;
}

__attribute__((noinline)) void fill_u(void) {
    int *p = u;
    for (int i = 0; i < N; i++) p[i] = 3 * i;
}

__attribute__((noinline)) void *sum_b(void *arg) {
    (void)arg;
    bind_cpu(0);
    const int *p = b;
    long s = 0;
    for (int i = 0; i < N; i++) s += p[i];
    results[0] = s;
    return NULL;
}

__attribute__((noinline)) void *sum_a(void *arg) {
    (void)arg;
    const int *p = a;
    long s = 0;
    for (int i = 0; i < N; i++) s += p[i];
    results[1] = s;
    return NULL;
}

__attribute__((noinline)) void *sum_u(void *arg) {
    (void)arg;
    bind_cpu(1);
    const int *p = u;
    long s = 0;
    for (int i = 0; i < N; i++) s += p[i];
    results[2] = s;
    return NULL;
}

static void run(void *(*fn)(void *)) {
    pthread_t t;
    if (pthread_create(&t, NULL, fn, NULL) != 0) exit(2);
    pthread_join(t, NULL);
}

/* one mmap call site per array: three allocation sites */
#define MAP_ARRAY() mmap(NULL, N * sizeof(int), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)

int main(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0 || !CPU_ISSET(0, &set) || !CPU_ISSET(1, &set)) {
        fprintf(stderr, "needs CPUs 0 and 1\n");
        return 77;
    }
    a = MAP_ARRAY();
    b = MAP_ARRAY();
    u = MAP_ARRAY();
    if (a == MAP_FAILED || b == MAP_FAILED || u == MAP_FAILED) return 2;
    run(fill_a);
    run(fill_b);
    fill_u();
    run(sum_b);
    run(sum_a);
    run(sum_u);
    munmap(u, N * sizeof(int));    /* u's pages are gone before the end: their node was taken
                                      at the munmap */
    printf("sums %ld %ld %ld\n", results[0], results[1], results[2]);
    return 0;
}
