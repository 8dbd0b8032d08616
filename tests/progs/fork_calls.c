/* Traced functions called before and after fork, in parent and child.
 * The child must run untouched (madtrace restores its code) and the parent's
 * counts must not include the child's calls. Prints deterministic lines. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

__attribute__((noinline, noclone)) int work(int x) {
    __asm__ volatile("" ::: "memory");
    return x * 3 + 1;
}

int main(void) {
    int acc = 0;
    for (int i = 0; i < 10; i++) acc += work(i);            /* 10 calls */
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int c = 0;
        for (int i = 0; i < 1000; i++) c += work(i);         /* child: not counted */
        printf("child %d\n", c);
        return 3;
    }
    int status;
    waitpid(pid, &status, 0);
    for (int i = 0; i < 5; i++) acc += work(i);             /* 5 more calls */
    printf("parent %d child-exit %d\n", acc, WEXITSTATUS(status));
    return 0;
}
