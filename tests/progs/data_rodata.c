/* Loads from constant data (.rodata): a lookup table, floating-point constants
 * and a string table, for --regions '.rodata of PROG' against lackey. */
#include <stdio.h>
#include <stdlib.h>

static const unsigned short table[256] = {
    3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4, 3, 3, 8, 3, 2, 7, 9, 5,
};
static const char *const names[] = {"alpha", "beta", "gamma", "delta"};
long total;

__attribute__((noinline)) double scale(double x) {
    return x * 1.0625 + 0.3125;          /* constants from .rodata at -O0 and -O2 */
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 200;
    double acc = 0;
    for (int i = 0; i < n; i++) {
        total += table[(i * 7) & 255];
        acc = scale(acc) - (double)table[i & 31];
        total += names[i & 3][1];
    }
    printf("total %ld acc %.3f\n", total, acc);
    return 0;
}
