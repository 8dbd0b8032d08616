/* SPDX-License-Identifier: GPL-2.0-or-later */
/* Data-tracing benchmark, compute-heavy: a Mandelbrot set over a SIZE x SIZE
 * grid (argv[1], default 1000; iteration limit argv[2], default 256).  Each
 * pixel is iterated in registers; the only data accesses are one store per
 * row to the global array rows[] (.bss) and the final checksum pass over it.
 * Deterministic output. */
#include <stdio.h>
#include <stdlib.h>

#define MAX_ROWS 8192
long rows[MAX_ROWS];                 /* .bss: one result per row */

__attribute__((noinline)) static long row(int y, int size, int limit) {
    double ci = -1.5 + 3.0 * y / size;
    long total = 0;
    for (int x = 0; x < size; x++) {
        double cr = -2.0 + 3.0 * x / size;
        double zr = 0.0, zi = 0.0;
        int n = 0;
        while (n < limit && zr * zr + zi * zi <= 4.0) {
            double t = zr * zr - zi * zi + cr;
            zi = 2.0 * zr * zi + ci;
            zr = t;
            n++;
        }
        total += n;
    }
    return total;
}

int main(int argc, char **argv) {
    int size = argc > 1 ? atoi(argv[1]) : 1000;
    int limit = argc > 2 ? atoi(argv[2]) : 256;
    if (size < 1 || size > MAX_ROWS || limit < 1) {
        fprintf(stderr, "usage: %s [size 1..%d] [limit]\n", argv[0], MAX_ROWS);
        return 2;
    }
    for (int y = 0; y < size; y++)
        rows[y] = row(y, size, limit);
    long sum = 0, max = 0;
    for (int y = 0; y < size; y++) {
        sum += rows[y];
        if (rows[y] > max) max = rows[y];
    }
    printf("size %d limit %d: %ld iterations, busiest row %ld\n", size, limit, sum, max);
    return 0;
}
