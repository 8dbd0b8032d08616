/* Both sides of a fork write the same global and the same heap block, and call
 * the same function; each must see only its own writes.  For --follow-forks:
 * per-process calls and accesses against callgrind/lackey --trace-children=yes.
 * Prints its pid in each process on stderr ("pid N parent|child") so that a
 * test can tell lackey's per-process logs apart. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

long counter;                 /* .bss */
long table[64] = {1};         /* .data */

__attribute__((noinline)) long bump(long *p, long by) {
    *p += by;
    return *p;
}

static long walk(long *block, int n, long by) {
    long sum = 0;
    for (int i = 0; i < n; i++) {
        bump(&counter, by);
        block[i % 16] += i * by;
        table[i % 64] += by;
        sum += block[i % 16] + table[i % 64];
    }
    return sum;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 100;
    long *block = calloc(16, sizeof(long));
    long before = walk(block, 10, 1);
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) return 2;
    if (pid == 0) {
        fprintf(stderr, "pid %d child block %p\n", (int)getpid(), (void *)block);
        long s = walk(block, n * 3, 7);
        printf("child: before %ld sum %ld counter %ld block0 %ld table0 %ld\n", before, s, counter,
               block[0], table[0]);
        free(block);
        return 5;
    }
    fprintf(stderr, "pid %d parent block %p\n", (int)getpid(), (void *)block);
    long s = walk(block, n, 3);
    int status;
    waitpid(pid, &status, 0);
    printf("parent: before %ld sum %ld counter %ld block0 %ld table0 %ld child-exit %d\n", before, s,
           counter, block[0], table[0], WEXITSTATUS(status));
    free(block);
    return 0;
}
