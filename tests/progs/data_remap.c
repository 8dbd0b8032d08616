// SPDX-License-Identifier: GPL-2.0-or-later
// Memory that is mapped, used and unmapped before the end: a malloc block
// large enough that glibc maps it (freed: unmapped), then an anonymous
// mapping used and unmapped, and another one mapped over part of its range.
// Each access's region must be the mapping it hit then.
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#define MAPPED (1 << 16)

volatile long sink;

int main(void)
{
    long *big = malloc(1 << 20);            /* above glibc's mmap threshold */
    if (!big)
        return 1;
    for (int i = 0; i < 1000; i++)
        big[i] = i;
    for (int i = 0; i < 1000; i++)
        sink += big[i];
    /* a load and a store that span two pages (glibc puts the block 16 bytes into
     * its mapping): counted once as accesses, on both pages by the heat map */
    volatile long *across = (volatile long *)((char *)big + 2 * 4096 - 16 - 4);
    *across = 7;
    sink += *across;
    free(big);
    char *first = mmap(NULL, 2 * MAPPED, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                       -1, 0);
    if (first == MAP_FAILED)
        return 1;
    for (int i = 0; i < 100; i++)
        first[i * 64] = 1;
    munmap(first, 2 * MAPPED);
    /* the same addresses again, from a page further: another mapping */
    char *second = mmap(first + 4096, MAPPED, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (second == MAP_FAILED)
        return 1;
    for (int i = 0; i < 50; i++)
        second[i * 64] = 2;
    munmap(second, MAPPED);
    printf("%ld %p %p\n", sink, (void *)first, (void *)second);
    return 0;
}
