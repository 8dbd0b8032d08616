// SPDX-License-Identifier: GPL-2.0-or-later
// Calls through memory in a hot loop: a table of function pointers in .data
// and a struct of callbacks on the heap (as CPython calls through its type
// objects' slots).  Under the hybrid data engine each such call takes a
// probe (the load of its target recorded), not a fault.  Prints its sums on
// stdout and the brk heap range on stderr ("heap LO HI").
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static long counter;
static long add1(long x) { counter += 1; return x + 1; }
static long twice(long x) { counter += 2; return x * 2; }
static long neg(long x) { counter += 3; return -x; }

long (*table[3])(long) = {add1, twice, neg};

struct ops { long (*first)(long); long (*second)(long); };

__attribute__((noinline)) long run(struct ops *ops, long n) {
    long s = 0;
    for (long i = 0; i < n; i++) {
        s += table[i % 3](i);
        s += ops->first(i) - ops->second(i);
    }
    return s;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000;
    char *lo = sbrk(0);
    struct ops *ops = malloc(sizeof *ops);
    ops->first = twice;
    ops->second = add1;
    long s = run(ops, n);
    printf("sum=%ld counter=%ld\n", s, counter);
    fprintf(stderr, "heap %p %p\n", (void *)lo, sbrk(0));
    free(ops);
    return 0;
}
