/* dlopen a library of our own (path in argv[1]), call into it, dlclose it.
 * Usage: dlopen_calls LIBPATH N */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) long local_work(long x) {
    __asm__ volatile("" ::: "memory");
    return x + 1;
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    long n = atol(argv[2]);
    long before = 0;
    for (long i = 0; i < n; i++) before += local_work(i);
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) { printf("dlopen failed: %s\n", dlerror()); return 3; }
    long (*run)(long) = (long (*)(long))dlsym(lib, "plug_run");
    long (*step)(long) = (long (*)(long))dlsym(lib, "plug_step");
    if (!run || !step) return 4;
    long r = run(n) + step(7);
    dlclose(lib);
    printf("before %ld plug %ld\n", before, r);
    return 0;
}
