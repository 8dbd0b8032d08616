/* Signals that land while a traced call's record is being written.
 * Usage: signal_calls N
 * A second thread asks the main thread to call leaf() in a loop and, once it
 * does, sends it SIGUSR1, N times (each once the last was handled); the
 * handler calls handled() and ends the loop, which also ends after 1024 calls
 * (the signal then lands while the main thread waits).
 * Prints the calls of each: "leaf=L handled=H".  When traced, the signals
 * interrupt leaf()'s calls, so most of them land in a trampoline. */
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

static volatile long handled_calls, calls, rounds;
static volatile int done, armed;
static pid_t main_tid;

__attribute__((noinline)) long handled(long x) {
    __asm__ volatile("" ::: "memory");
    return x + 1;
}

__attribute__((noinline)) long leaf(long x) {
    __asm__ volatile("" ::: "memory");
    return x * 3 + 1;
}

static void on_usr1(int signum) {
    (void)signum;
    armed = 0;
    handled_calls = handled(handled_calls);
}

static void *sender(void *arg) {
    long n = (long)arg;
    for (long i = 0; i < n; i++) {
        long before = handled_calls, made = calls;
        rounds++;
        armed = 1;
        while (calls == made)       /* until the main thread is in its loop of calls */
            sched_yield();
        syscall(SYS_tgkill, getpid(), main_tid, SIGUSR1);
        while (handled_calls == before)
            sched_yield();
    }
    done = 1;
    return NULL;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 10000;
    main_tid = (pid_t)syscall(SYS_gettid);
    struct sigaction action = {0};
    action.sa_handler = on_usr1;
    action.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &action, NULL);
    pthread_t thread;
    if (pthread_create(&thread, NULL, sender, (void *)n) != 0)
        return 1;
    long acc = 0;
    long burst = 0, round = 0;
    while (!done) {
        if (rounds != round) {
            round = rounds;
            burst = 0;
        }
        if (!armed || burst == 1024) {      /* at most that many calls per signal */
            sched_yield();
            continue;
        }
        acc = leaf(acc);
        calls++;
        burst++;
    }
    pthread_join(thread, NULL);
    printf("leaf=%ld handled=%ld check=%ld\n", calls, handled_calls, acc & 0xff);
    return 0;
}
