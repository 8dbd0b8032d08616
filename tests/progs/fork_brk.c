// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * The heap grows (brk) while traced, then the program forks: the child reads
 * and writes the grown part.  Under the hybrid engine the heap is aliased when
 * tracing starts and each growth joins the alias (data/hybrid/alias.py extend);
 * the grown pages must be in the fork child too.
 *
 *   fork_brk [KB]   grows the heap by KB (default 256) after start-up
 *
 * Prints the parent's and the child's sums over the grown part.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    long kb = argc > 1 ? atol(argv[1]) : 256;
    char *first = malloc(64);                 /* the heap exists (and is traced) first */
    first[0] = 1;
    char *start = sbrk(0);
    if (sbrk(kb * 1024) == (void *)-1)
        return 2;
    for (long i = 0; i < kb * 1024; i++)
        start[i] = (char)(i * 7 + 3);
    uint64_t sum = 0;
    for (long i = 0; i < kb * 1024; i += 64)
        sum += (unsigned char)start[i];
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        uint64_t child = 0;
        for (long i = 0; i < kb * 1024; i += 64) {
            child += (unsigned char)start[i];
            start[i] = 1;                     /* private: the parent keeps its bytes */
        }
        printf("child %llu\n", (unsigned long long)child);
        return 0;
    }
    int status;
    waitpid(pid, &status, 0);
    uint64_t after = 0;
    for (long i = 0; i < kb * 1024; i += 64)
        after += (unsigned char)start[i];
    printf("parent %llu after %llu child_status %d first %d\n", (unsigned long long)sum,
           (unsigned long long)after, status, first[0]);
    return 0;
}
