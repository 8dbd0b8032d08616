/* SPDX-License-Identifier: GPL-2.0-or-later */
/* push with a memory operand (push qword ptr [m]: how compilers pass a
 * stack argument or a struct by value from memory) in a hot loop, on .data,
 * .bss and the heap, RIP-relative and through registers with an index.  Run
 * with the number of rounds (default 2000); prints a checksum on stdout and
 * the heap's range on stderr ("heap LO HI").  "ROUNDS signals": a SIGALRM
 * every 200 microseconds meanwhile (its handler counts), so that signals land
 * inside the pushes' probes. */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

uint64_t data_words[16] = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3};
uint64_t bss_words[16];
uint64_t *heap_words;

/* The pushes below the red zone: the compiler may keep values in it. */
__attribute__((noinline)) uint64_t pushed(const uint64_t *p, long i) {
    uint64_t a, b, c, d;
    __asm__ volatile("lea -128(%%rsp), %%rsp\n\t"
                     "pushq data_words+8(%%rip)\n\t"
                     "pushq 16(%4)\n\t"
                     "pushq (%4,%5,8)\n\t"
                     "pushq (%6,%5,8)\n\t"
                     "popq %0\n\tpopq %1\n\tpopq %2\n\tpopq %3\n\t"
                     "lea 128(%%rsp), %%rsp"
                     : "=&r"(a), "=&r"(b), "=&r"(c), "=&r"(d) : "r"(p), "r"(i), "r"(bss_words)
                     : "memory");
    return a + 3 * b + 7 * c + 11 * d;
}

static volatile sig_atomic_t ticks;

static void tick(int sig) {
    (void)sig;
    ticks++;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 2000;
    int signals = argc > 2 && strcmp(argv[2], "signals") == 0;
    heap_words = malloc(16 * sizeof *heap_words);
    for (int k = 0; k < 16; k++) {
        heap_words[k] = (uint64_t)k * k + 1;
        bss_words[k] = (uint64_t)k + 100;
    }
    if (signals) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = tick;
        sa.sa_flags = SA_RESTART;
        sigaction(SIGALRM, &sa, NULL);
        struct itimerval every = {{0, 200}, {0, 200}};
        setitimer(ITIMER_REAL, &every, NULL);
    }
    uint64_t sum = 0;
    for (int r = 0; r < rounds; r++) {
        for (long i = 0; i < 16; i++) {
            sum = sum * 31 + pushed(data_words, i) + pushed(heap_words, 15 - i);
            bss_words[i] += sum & 7;
        }
    }
    if (signals) {
        struct itimerval off = {{0, 0}, {0, 0}};
        setitimer(ITIMER_REAL, &off, NULL);
        fprintf(stderr, "ticks %d\n", (int)ticks);
    }
    printf("checksum %llu\n", (unsigned long long)sum);
    fprintf(stderr, "heap %p %p\n", (void *)heap_words, (void *)(heap_words + 16));
    free(heap_words);
    return 0;
}
