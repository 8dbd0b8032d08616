// SPDX-License-Identifier: GPL-2.0-or-later
/* dlopen a library after the start (path in argv[1]) and let it work on a heap
 * buffer: data tracing meets code of a module it did not know when it began.
 * The library stays loaded (the trace names its code from the maps at the end).
 * Usage: data_dlopen LIBPATH N ROUNDS.  Prints the library's sum. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    if (argc < 4)
        return 2;
    long n = atol(argv[2]), rounds = atol(argv[3]);
    long *buf = calloc(n, sizeof(long));
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (!buf || !lib) {
        printf("dlopen failed: %s\n", dlerror());
        return 3;
    }
    long (*run)(volatile long *, long, long) =
        (long (*)(volatile long *, long, long))dlsym(lib, "fill_run");
    if (!run)
        return 4;
    printf("sum %ld\n", run(buf, n, rounds));
    free(buf);
    return 0;
}
