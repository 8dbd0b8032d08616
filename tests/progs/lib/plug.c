/* A library that tests/progs/dlopen_calls.c loads with dlopen: its functions
 * are traced with -f 'libmtplug.so:plug_*' given before the load. */
__attribute__((noinline)) long plug_step(long x) {
    __asm__ volatile("" ::: "memory");
    return x * 5 + 3;
}

long plug_run(long n) {
    long acc = 0;
    for (long i = 0; i < n; i++) acc += plug_step(i);
    return acc;
}
