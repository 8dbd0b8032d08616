// SPDX-License-Identifier: GPL-2.0-or-later
// C++ exceptions through functions the hybrid data engine relocates: their
// calls return into the copies, so the copies need unwind information of
// their own (madtrace/data/hybrid/copy_unwind.py), registered with the program's
// unwinder.  Every function here touches traced globals in a loop (it is
// relocated at its first fault) and is on the path of an exception:
//   checked() throws; middle() has a destructor to run (cleanup landing pad);
//   relay() catches and rethrows (a catch landing pad, a type table entry);
//   main() catches by base class; sorter() throws through libc's qsort (a C
//   function with unwind information and no exception tables) from the
//   comparator, and catches it.
// Prints its own sums: the output must be the same with and without tracing.
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

static long table[4096];
static long total;
static int destroyed, rethrown, sorted_aborts;
static int values[512];

struct Guard {
    long v;
    ~Guard() {
        destroyed += v != 0;
        total += v & 3;
    }
};

__attribute__((noinline)) long checked(long i) {
    table[i & 4095] += i;
    if (i % 97 == 13) throw std::runtime_error("bad value");
    return table[(i * 7) & 4095];
}

__attribute__((noinline)) long middle(long i) {
    Guard g{i};
    long s = 0;
    for (int k = 0; k < 8; k++) s += table[(i + k) & 4095];
    return s + checked(i);
}

__attribute__((noinline)) long relay(long i) {
    try {
        return middle(i);
    } catch (const std::runtime_error &) {
        rethrown++;
        total += table[i & 4095] & 1;
        throw;
    }
}

static int compare(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    total++;
    if (x == 4242) throw std::out_of_range("found 4242");
    return (x > y) - (x < y);
}

__attribute__((noinline)) void sorter(int round) {
    for (int k = 0; k < 512; k++) values[k] = (k * 7919 + round * 31) % 5000;
    if (round % 3 == 0) values[(round * 13) % 512] = 4242;
    try {
        qsort(values, 512, sizeof values[0], compare);
    } catch (const std::out_of_range &) {
        sorted_aborts++;
    }
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 20000;
    long sum = 0, caught = 0;
    for (long i = 0; i < n; i++) {
        try {
            sum += (i & 1) ? relay(i) : middle(i);
        } catch (const std::exception &) {
            caught++;
        }
        if (i % 1000 == 0) sorter((int)(i / 1000));
    }
    std::printf("sum=%ld caught=%ld destroyed=%d rethrown=%d aborts=%d total=%ld\n", sum, caught,
                destroyed, rethrown, sorted_aborts, total);
    return 0;
}
