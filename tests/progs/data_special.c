/* SPDX-License-Identifier: GPL-2.0-or-later */
/* Data-access test program for the instructions and address-space changes the
 * data engine treats specially: string instructions (rep movsb/stosq, movsq
 * backwards, an overlapping rep movsb), calls and jumps through pointers kept
 * in .data, push of a global, locked and exchanging instructions, SSE moves, a
 * large malloc block (its own anonymous mapping), an mmap'd region the
 * program mprotects read-only and back, and a realloc that moves a large block
 * (mremap).  Prints results on stdout, and on stderr the ranges an oracle
 * needs: "heap LO HI", "mmap LO HI" (each anonymous region, in order). */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

char src[512] = "the quick brown fox jumps over the lazy dog";
char dst[512];
uint64_t words[64];
long counter;
long swapped = 5;
long (*table[3])(long);
void *jump_to;
double vec[8] = {1, 2, 3, 4, 5, 6, 7, 8};

__attribute__((noinline)) long twice(long x) { return 2 * x; }
__attribute__((noinline)) long plus1(long x) { return x + 1; }
__attribute__((noinline)) long neg(long x) { return -x; }

__attribute__((noinline)) void strings(void) {
    size_t n = 300;
    void *d = dst, *s = src;
    __asm__ volatile("cld; rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory");
    uint64_t value = 0x0101010101010101ull;
    d = words;
    n = 32;
    __asm__ volatile("cld; rep stosq" : "+D"(d), "+c"(n) : "a"(value) : "memory");
    /* movsq backwards: words[63] = words[31], then words[62] = words[30] */
    d = &words[63];
    s = &words[31];
    __asm__ volatile("std; movsq; movsq; cld" : "+D"(d), "+S"(s) : : "memory");
    /* overlapping forward copy: the first 8 bytes repeat over dst[8..40) */
    d = dst + 8;
    s = dst;
    n = 32;
    __asm__ volatile("cld; rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory");
}

__attribute__((noinline)) long through_pointers(long x) {
    for (int i = 0; i < 3; i++) {
        long (*f)(long) = table[i];
        __asm__ volatile("" : "+r"(f));
        x = f(x);
    }
    long r;
    /* an indirect call and jump straight through the .data pointers */
    __asm__ volatile("mov %1, %%rdi\n\t"
                     "call *table+8(%%rip)\n\t"
                     "lea 1f(%%rip), %%rcx\n\t"
                     "mov %%rcx, jump_to(%%rip)\n\t"
                     "jmp *jump_to(%%rip)\n\t"
                     "ud2\n"
                     "1:\tmov %%rax, %0"
                     : "=r"(r) : "r"(x) : "rax", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10",
                       "r11", "memory");
    return r;
}

__attribute__((noinline)) long atomics(void) {
    __atomic_fetch_add(&counter, 3, __ATOMIC_SEQ_CST);        /* lock xadd / lock add */
    long old = __atomic_exchange_n(&swapped, 9, __ATOMIC_SEQ_CST);   /* xchg */
    long expected = 9;
    __atomic_compare_exchange_n(&swapped, &expected, 11, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    long pushed;
    __asm__ volatile("push counter(%%rip)\n\tpop %0" : "=r"(pushed) : : "memory");
    return old + counter + swapped + pushed;
}

__attribute__((noinline)) double sse(void) {
    double out[8];
    __asm__ volatile("movupd vec(%%rip), %%xmm0\n\t"
                     "movupd vec+16(%%rip), %%xmm1\n\t"
                     "addpd %%xmm1, %%xmm0\n\t"
                     "movupd %%xmm0, vec+32(%%rip)\n\t"
                     : : : "xmm0", "xmm1", "memory");
    memcpy(out, vec, sizeof out);
    return out[4] + out[5];
}

__attribute__((noinline)) long big_block(void) {
    size_t n = 64 * 1024;                      /* 512 KiB: malloc maps it */
    long *big = malloc(n * sizeof *big);
    fprintf(stderr, "mmap %p %p\n", (void *)big, (void *)(big + n));
    for (size_t i = 0; i < n; i += 512) big[i] = (long)i;
    long s = 0;
    for (size_t i = 0; i < n; i += 512) s += big[i];
    long *moved = realloc(big, 2 * n * sizeof *moved);   /* mremap */
    fprintf(stderr, "mmap %p %p\n", (void *)moved, (void *)(moved + 2 * n));
    for (size_t i = n; i < 2 * n; i += 512) moved[i] = 1;
    for (size_t i = 0; i < 2 * n; i += 1024) s += moved[i];
    free(moved);
    return s;
}

__attribute__((noinline)) long protected_region(void) {
    long page = sysconf(_SC_PAGESIZE);
    long *region = mmap(NULL, 4 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (region == MAP_FAILED) return -1;
    fprintf(stderr, "mmap %p %p\n", (void *)region, (void *)((char *)region + 4 * page));
    long per_page = page / (long)sizeof(long);
    for (int i = 0; i < 4; i++) region[i * per_page] = i + 1;
    mprotect(region, 2 * page, PROT_READ);          /* the program's own protection */
    long s = region[0] + region[per_page];
    mprotect(region, 2 * page, PROT_READ | PROT_WRITE);
    region[0] = 40;
    s += region[0] + region[3 * per_page];
    munmap(region + 2 * per_page, 2 * page);        /* half of it goes away */
    s += region[per_page];
    munmap(region, 2 * page);
    return s;
}

int main(void) {
    char *lo = sbrk(0);
    table[0] = twice;
    table[1] = plus1;
    table[2] = neg;
    strings();
    long p = through_pointers(20);
    long a = atomics();
    double v = sse();
    long b = big_block();
    long r = protected_region();
    printf("dst=%.48s words=%016llx,%016llx,%016llx p=%ld a=%ld v=%g b=%ld r=%ld\n", dst,
           (unsigned long long)words[0], (unsigned long long)words[62],
           (unsigned long long)words[63], p, a, v, b, r);
    fprintf(stderr, "heap %p %p\n", (void *)lo, sbrk(0));
    return 0;
}
