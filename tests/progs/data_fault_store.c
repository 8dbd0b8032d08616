/* A store left on the data engine's fault path, then read by relocated code.
 *
 * set_value() is code outside any known function for madtrace (assembly with
 * a symbol of size 0 and no unwind entry): the hybrid engine cannot relocate it,
 * so each of its stores is carried out on the fault path.  get_value() is an
 * ordinary function: its first fault relocates it, and from then on it reads
 * the global through the alias without a trap.  A store the fault path has
 * not written to memory yet when get_value() reads the global is seen as the
 * old value: the program counts those reads (0 without madtrace).
 *
 * Modes (argv[1]):
 *   store N: a plain store (mov), N rounds
 *   add N:   a read-modify-write (add) of the counter, N rounds
 *   xchg N:  a locked exchange (xchg with memory), N rounds
 *   threads N: 4 threads each add 1 to the counter N times with a locked add
 *            (on the fault path too) while the main thread reads it through
 *            get_value(); the counter must end at 4 N (atomic for each other)
 * Prints "mode M rounds N stale S value V"; exits 1 if S > 0.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

long shared_value;      /* .bss: traced */
long pad_after[64];

/* void set_value(long v); void add_value(long v); long swap_value(long v) */
__asm__(
    ".text\n"
    ".globl set_value\n"
    ".type set_value, @function\n"
    "set_value:\n"
    "    mov %rdi, shared_value(%rip)\n"
    "    ret\n"
    ".globl add_value\n"
    ".type add_value, @function\n"
    "add_value:\n"
    "    add %rdi, shared_value(%rip)\n"
    "    ret\n"
    ".globl swap_value\n"
    ".type swap_value, @function\n"
    "swap_value:\n"
    "    mov %rdi, %rax\n"
    "    xchg %rax, shared_value(%rip)\n"
    "    ret\n"
    ".globl add_locked\n"
    ".type add_locked, @function\n"
    "add_locked:\n"
    "    lock add %rdi, shared_value(%rip)\n"
    "    ret\n");
void set_value(long v);
void add_value(long v);
long swap_value(long v);
void add_locked(long v);

static long per_thread;

static void *adder(void *arg) {
    (void)arg;
    for (long i = 0; i < per_thread; i++) add_locked(1);
    return NULL;
}

__attribute__((noinline)) long get_value(void) {
    return *(volatile long *)&shared_value;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s store|add|xchg N\n", argv[0]);
        return 2;
    }
    const char *mode = argv[1];
    long rounds = atol(argv[2]), stale = 0;
    if (!strcmp(mode, "threads")) {
        pthread_t threads[4];
        long seen = 0, backwards = 0;
        per_thread = rounds;
        for (int k = 0; k < 4; k++) pthread_create(&threads[k], NULL, adder, NULL);
        for (long i = 0; i < rounds; i++) {     /* the counter never goes back */
            long now = get_value();
            if (now < seen) backwards++;
            seen = now;
        }
        for (int k = 0; k < 4; k++) pthread_join(threads[k], NULL);
        stale = backwards + (get_value() != 4 * rounds);
        printf("mode %s rounds %ld stale %ld value %ld\n", mode, rounds, stale, get_value());
        return stale != 0;
    }
    for (long i = 1; i <= rounds; i++) {
        long want;
        if (!strcmp(mode, "store")) {
            set_value(i);
            want = i;
        } else if (!strcmp(mode, "add")) {
            add_value(1);
            want = i;
        } else {
            long old = swap_value(i);
            if (old != i - 1) stale++;
            want = i;
        }
        if (get_value() != want) stale++;
    }
    printf("mode %s rounds %ld stale %ld value %ld\n", mode, rounds, stale, get_value());
    return stale != 0;
}
