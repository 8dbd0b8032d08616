/* SPDX-License-Identifier: GPL-2.0-or-later */
/* Block events: memset/memcpy/memmove calls (sizes unknown to the compiler, so
 * libc's functions run) and write()/read() of traced buffers.
 * Usage: data_blocks N (1..8000).  Writes N bytes of b, then a summary line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

char a[8192], b[8192];
/* through volatile pointers: the compiler cannot inline them, libc's run */
static void *(*volatile set)(void *, int, size_t) = memset;
static void *(*volatile copy)(void *, const void *, size_t) = memcpy;
static void *(*volatile move)(void *, const void *, size_t) = memmove;

int main(int argc, char **argv) {
    size_t n = argc > 1 ? (size_t)atoi(argv[1]) : 5000;
    if (n < 1 || n > 8000) return 2;
    set(a, 'q', n);
    copy(b, a, n);
    move(b + 1, b, n - 1);
    b[0] = '<';
    b[n - 1] = '\n';
    if (write(1, b, n) != (ssize_t)n) return 1;
    int fds[2];
    if (pipe(fds)) return 1;
    if (write(fds[1], "sixteen bytes!!\n", 16) != 16) return 1;
    if (read(fds[0], a, 16) != 16) return 1;
    printf("%.15s %zu\n", a, strlen(b));
    return 0;
}
