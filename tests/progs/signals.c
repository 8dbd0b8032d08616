/* The target's own signals must behave as without madtrace.
 * Usage: signals handler   -> installs handlers, raises SIGUSR1 and SIGALRM, prints counts
 *        signals die SIG    -> kills itself with signal SIG (e.g. 6 or 11)
 *        signals segv       -> dereferences NULL (a genuine crash)
 *        signals segvhandler -> its own SIGSEGV handler recovers (siglongjmp) from
 *                             three NULL dereferences between accesses to globals,
 *                             and reads its own action back
 *        signals fork       -> forks a child that prints, waits for it
 *        signals exec PROG  -> execs PROG with argument "from-exec" */
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t usr1, alrm;
static sigjmp_buf recover;
static volatile long faults_seen, last_code;
static volatile uintptr_t last_addr;
long globals[64];
static void on_segv(int s, siginfo_t *si, void *ctx) {
    (void)s; (void)ctx;
    faults_seen++;
    last_code = si->si_code;
    last_addr = (uintptr_t)si->si_addr;
    siglongjmp(recover, 1);
}
static void on_usr1(int s) { (void)s; usr1++; }
static void on_alrm(int s) { (void)s; alrm++; }

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    if (!strcmp(argv[1], "handler")) {
        signal(SIGUSR1, on_usr1);
        signal(SIGALRM, on_alrm);
        for (int i = 0; i < 5; i++) raise(SIGUSR1);
        alarm(1);
        pause();
        printf("usr1=%d alrm=%d\n", (int)usr1, (int)alrm);
        return 0;
    }
    if (!strcmp(argv[1], "segvhandler")) {
        struct sigaction sa, old;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_segv;
        sa.sa_flags = SA_SIGINFO;
        sigaction(SIGSEGV, &sa, NULL);
        sigaction(SIGSEGV, NULL, &old);
        printf("own action: %s\n", old.sa_sigaction == on_segv && (old.sa_flags & SA_SIGINFO)
               ? "yes" : "no");
        long sum = 0;
        for (int round = 0; round < 3; round++) {
            for (int i = 0; i < 64; i++) globals[i] += i + round;
            if (!sigsetjmp(recover, 1)) {
                volatile long *p = (long *)(uintptr_t)(8 * (round + 1));
                sum += *p;
            }
            for (int i = 0; i < 64; i++) sum += globals[i];
        }
        printf("recovered %ld, code %ld, addr %#lx, sum %ld\n", (long)faults_seen, (long)last_code,
               (unsigned long)last_addr, sum);
        return 0;
    }
    if (!strcmp(argv[1], "die")) {
        printf("dying\n");
        fflush(stdout);
        signal(atoi(argv[2]), SIG_DFL);
        raise(atoi(argv[2]));
        return 1;
    }
    if (!strcmp(argv[1], "segv")) {
        printf("crashing\n");
        fflush(stdout);
        volatile int *p = NULL;
        return *p;
    }
    if (!strcmp(argv[1], "fork")) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) { printf("child %d\n", 42); return 7; }
        int status;
        waitpid(pid, &status, 0);
        printf("parent saw child exit %d\n", WEXITSTATUS(status));
        return 0;
    }
    if (!strcmp(argv[1], "exec") && argc > 2) {
        printf("before exec\n");
        fflush(stdout);
        execl(argv[2], argv[2], "from-exec", (char *)NULL);
        return 127;
    }
    return 2;
}
