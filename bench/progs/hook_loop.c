/* SPDX-License-Identifier: GPL-2.0-or-later
 * Loops that call a function pointer N times (bench/hook_stubs_micro.py): the
 * hook stubs' own cost measured against the functions themselves, in one
 * process, without a tracer.  Built by that script into a temporary directory. */
#include <stddef.h>
#include <stdint.h>
#include <time.h>
typedef void *(*copy_fn)(void *, const void *, size_t);
typedef void *(*alloc_fn)(size_t);
typedef void (*free_fn)(void *);
double copies(copy_fn fn, void *dst, const void *src, size_t n, long iters) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < iters; i++) { fn(dst, src, n); __asm__ volatile("" ::: "memory"); }
    clock_gettime(CLOCK_MONOTONIC, &b);
    return ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / iters;
}
double pairs(alloc_fn al, free_fn fr, long iters) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < iters; i++) { void *p = al(48); __asm__ volatile("" :: "r"(p) : "memory"); fr(p); }
    clock_gettime(CLOCK_MONOTONIC, &b);
    return ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / iters;
}
