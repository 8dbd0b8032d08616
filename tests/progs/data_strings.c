/* SPDX-License-Identifier: GPL-2.0-or-later */
/* String instructions in a hot loop, on .data/.bss and the heap: rep movsb
 * (forward, overlapping, with a count of zero), rep stosq, movsq forward and
 * backwards (std), lodsb, repne scasb (a strlen) and repe cmpsb.  Run with the
 * number of rounds (default 2000); prints a checksum on stdout and the heap's
 * range on stderr ("heap LO HI").  "ROUNDS long": rep movsb and rep stosb
 * over 4 KiB heap buffers instead, each round, with a SIGALRM every
 * millisecond (its handler counts, said on stderr): signals land inside the
 * loops; "ROUNDS long quiet": the same without the signals. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

char src[512] = "the quick brown fox jumps over the lazy dog";
char dst[512];
uint64_t words[64];
uint64_t *heap_words;

__attribute__((noinline)) void copy_bytes(void *d, const void *s, size_t n) {
    __asm__ volatile("cld; rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory");
}

__attribute__((noinline)) void fill_words(uint64_t *d, uint64_t value, size_t n) {
    __asm__ volatile("cld; rep stosq" : "+D"(d), "+c"(n) : "a"(value) : "memory");
}

__attribute__((noinline)) void move_words(uint64_t *d, const uint64_t *s, int backwards) {
    if (backwards)
        __asm__ volatile("std; movsq; movsq; cld" : "+D"(d), "+S"(s) : : "memory");
    else
        __asm__ volatile("movsq; movsq; movsq" : "+D"(d), "+S"(s) : : "memory");
}

__attribute__((noinline)) long sum_bytes(const char *s, size_t n) {
    long sum = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c;
        __asm__ volatile("lodsb" : "=a"(c), "+S"(s) : : "memory");
        sum += c;
    }
    return sum;
}

__attribute__((noinline)) size_t length(const char *s) {
    size_t n = (size_t)-1;
    const char *p = s;
    __asm__ volatile("cld; repne scasb" : "+D"(p), "+c"(n) : "a"(0) : "memory");
    return (size_t)(p - s) - 1;
}

__attribute__((noinline)) int same(const char *a, const char *b, size_t n) {
    int equal = 0;
    __asm__ volatile("cld; repe cmpsb; sete %b0" : "+q"(equal), "+S"(a), "+D"(b), "+c"(n)
                     : : "memory", "cc");
    return equal;
}

static volatile sig_atomic_t ticks;

static void tick(int sig) {
    (void)sig;
    ticks++;
}

__attribute__((noinline)) void set_bytes(void *d, int value, size_t n) {
    __asm__ volatile("cld; rep stosb" : "+D"(d), "+c"(n) : "a"(value) : "memory");
}

static int long_copies(int rounds, int signals) {
    size_t n = 4096;
    unsigned char *a = malloc(n), *b = malloc(n);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = tick;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval every = {{0, 1000}, {0, 1000}};
    if (signals)
        setitimer(ITIMER_REAL, &every, NULL);
    unsigned long check = 0;
    for (int r = 0; r < rounds; r++) {
        set_bytes(a, r & 0xff, n);
        a[r % n] = (unsigned char)(r * 7);
        copy_bytes(b, a, n);
        check = check * 31 + b[(r * 13) % n] + b[r % n];
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    printf("check=%lu\n", check);
    fprintf(stderr, "ticks %d\n", (int)ticks);
    free(a);
    free(b);
    return 0;
}

int main(int argc, char **argv) {
    char *lo = sbrk(0);
    int rounds = argc > 1 ? atoi(argv[1]) : 2000;
    if (argc > 2 && strcmp(argv[2], "long") == 0)
        return long_copies(rounds, !(argc > 3 && strcmp(argv[3], "quiet") == 0));
    heap_words = malloc(64 * sizeof *heap_words);
    long check = 0;
    for (int r = 0; r < rounds; r++) {
        copy_bytes(dst, src, 44 + r % 5);
        copy_bytes(dst + 8, dst, 32);                 /* overlapping */
        copy_bytes(dst, src, 0);
        fill_words(words, 0x0101010101010101ull * (uint64_t)(r & 0xff), 32);
        fill_words(heap_words, (uint64_t)r, 48);
        move_words(&words[40], &words[r % 8], 0);
        move_words(&heap_words[63], &words[31], 1);
        check += sum_bytes(src, 16 + r % 3);
        check += (long)length(src + r % 7);
        check += same(src, dst, 8) + same(src, src, 20);
        check += (long)(words[41] + heap_words[62] + (uint64_t)dst[20]);
    }
    printf("check=%ld dst=%.40s\n", check, dst);
    fprintf(stderr, "heap %p %p\n", (void *)lo, sbrk(0));
    free(heap_words);
    return 0;
}
