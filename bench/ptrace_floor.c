// SPDX-License-Identifier: GPL-2.0-or-later
/* The floor under any ptrace-driven data tracer on this machine: a child
 * stops N times (int3) and a C tracer resumes it; with "full", each stop also
 * makes the requests madtrace's fault loop makes (GETSIGINFO, GETREGS, one
 * 8-byte pread of /proc/PID/mem, POKEUSER of rip).  Both on one CPU, as
 * madtrace pins them.  With "inproc", no tracer at all: the program takes N
 * faults on a PROT_NONE page in its own SIGSEGV handler, which only moves rip
 * past the faulting load (the floor of any fault-per-access design, even one
 * that runs entirely inside the target).  Prints microseconds per stop.
 * usage: ptrace_floor bare|full|inproc N */
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <ucontext.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* the faulting load is "mov eax, [rdi]" (2 bytes): the handler skips it */
static void skip_load(int sig, siginfo_t *si, void *uc) {
    (void)sig, (void)si;
    ((ucontext_t *)uc)->uc_mcontext.gregs[REG_RIP] += 2;
}

static int in_process(int n) {
    void *page = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = skip_load;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    if (page == MAP_FAILED || sigaction(SIGSEGV, &sa, NULL)) return 1;
    double start = now();
    for (int i = 0; i < n; i++)
        __asm__ volatile(".byte 0x8b, 0x07" : : "D"(page) : "eax", "memory");
    printf("%.2f\n", (now() - start) / n * 1e6);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    int full = !strcmp(argv[1], "full"), n = atoi(argv[2]);
    if (!strcmp(argv[1], "inproc")) return in_process(n);
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(sched_getcpu(), &set);
    sched_setaffinity(0, sizeof set, &set);
    pid_t child = fork();
    if (child == 0) {
        ptrace(PTRACE_TRACEME, 0, 0, 0);
        raise(SIGSTOP);
        for (int i = 0; i < n; i++) __asm__ volatile("int3");
        _exit(0);
    }
    int status;
    waitpid(child, &status, 0);
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/mem", child);
    FILE *mem = fopen(path, "r");
    if (!mem) return 1;
    ptrace(PTRACE_CONT, child, 0, 0);
    double start = now();
    int stops = 0;
    for (;;) {
        waitpid(child, &status, __WALL);
        if (WIFEXITED(status)) break;
        stops++;
        if (full) {
            siginfo_t si;
            struct user_regs_struct regs;
            char buf[8];
            ptrace(PTRACE_GETSIGINFO, child, 0, &si);
            ptrace(PTRACE_GETREGS, child, 0, &regs);
            if (pread(fileno(mem), buf, 8, (off_t)regs.rsp) != 8) return 1;
            ptrace(PTRACE_POKEUSER, child, (void *)offsetof(struct user_regs_struct, rip),
                   (void *)regs.rip);
        }
        ptrace(PTRACE_CONT, child, 0, 0);
    }
    printf("%.2f\n", (now() - start) / stops * 1e6);
    return 0;
}
