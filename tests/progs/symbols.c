// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * Test program for the binary model (tests/test_binary.py).
 *
 * It has initialized and uninitialized global arrays and structs, static
 * (file-scope and function-local) variables, a few functions, and calls
 * through the PLT (malloc, free, printf, strlen, memset).  On start it prints
 * "NAME 0xADDR" lines with run-time addresses the tests use as an oracle,
 * then "ready", then reads stdin until EOF (each line it reads calls
 * compute() once) and exits with status 0.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>

struct config {
    int id;
    char *name;
    double ratio;
    short flags[4];
};

typedef struct point {
    int x;
    int y;
} point_t;

int counters[16];                                   /* .bss */
long initialized_table[8] = {1, 2, 3, 4, 5, 6, 7, 8}; /* .data */
struct config global_config = {7, "default", 0.5, {1, 2, 3, 4}};
point_t points[5];                                  /* .bss */
const char greeting[] = "hello, symbols";           /* .rodata */
int matrix[3][4] = {{1}, {2}, {3}};
volatile unsigned char byte_buffer[100];
char *heap_block;
static int static_counter;                          /* local .bss */
static double static_weights[3] = {0.25, 0.5, 0.25}; /* local .data */

__attribute__((noinline)) static int helper(int a)
{
    static_counter += a;
    return static_counter * 3 + (int)static_weights[a % 3];
}

__attribute__((noinline)) int compute(int x)
{
    int total = 0;
    for (int i = 0; i < 16; i++) {
        counters[i] += x + i;
        total += counters[i];
    }
    return total + helper(x);
}

__attribute__((noinline)) void fill_points(int n)
{
    for (int i = 0; i < n && i < 5; i++) {
        points[i].x = i;
        points[i].y = i * i;
    }
}

int main(void)
{
    static int calls_in_main;
    char line[128];
    int local_on_stack = 42;

    heap_block = malloc(64);
    memset(heap_block, 0, 64);
    strcpy(heap_block, greeting);
    fill_points(5);
    global_config.id += (int)strlen(heap_block);

    printf("heap_block %p\n", (void *)heap_block);
    printf("counters %p\n", (void *)counters);
    printf("counters_3 %p\n", (void *)&counters[3]);
    printf("global_config %p\n", (void *)&global_config);
    printf("global_config_name_2 %p\n", (void *)((char *)&global_config.name + 2));
    printf("points_2_y %p\n", (void *)&points[2].y);
    printf("initialized_table %p\n", (void *)initialized_table);
    printf("greeting %p\n", (void *)greeting);
    printf("matrix_2_1 %p\n", (void *)&matrix[2][1]);
    printf("static_counter %p\n", (void *)&static_counter);
    printf("calls_in_main %p\n", (void *)&calls_in_main);
    printf("compute %p\n", (void *)compute);
    printf("stack %p\n", (void *)&local_on_stack);
    printf("libc_malloc %p\n", dlsym(RTLD_DEFAULT, "malloc"));
    printf("vdso %p\n", (void *)getauxval(AT_SYSINFO_EHDR));
    printf("ready\n");
    fflush(stdout);

    while (fgets(line, sizeof line, stdin)) {
        calls_in_main++;
        byte_buffer[calls_in_main % 100] = (unsigned char)compute((int)strlen(line));
        printf("%d\n", counters[0] + local_on_stack);
        fflush(stdout);
    }
    free(heap_block);
    return 0;
}
