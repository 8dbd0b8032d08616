/* Data-access test program (globals only): array sums, a global lookup
 * table used for a string search, struct field updates, read-modify-write.
 * Deterministic output. */
#include <stdio.h>
#include <string.h>

#define N 200
int values[N];                       /* .bss */
long total;                          /* .bss */
unsigned char table[256] = {1, 2, 3};/* .data */
struct point { int x, y; } points[8];
const char text[] = "madtrace traces memory accesses of functions";

__attribute__((noinline)) void fill(void) {
    for (int i = 0; i < N; i++) values[i] = i * 3;
}

__attribute__((noinline)) long sum(void) {
    long s = 0;
    for (int i = 0; i < N; i++) s += values[i];
    total += s;                      /* read-modify-write */
    return s;
}

__attribute__((noinline)) int count_vowels(void) {
    for (int c = 0; c < 256; c++) table[c] = 0;
    table['a'] = table['e'] = table['i'] = table['o'] = table['u'] = 1;
    int n = 0;
    for (size_t i = 0; i < sizeof text - 1; i++) n += table[(unsigned char)text[i]];
    return n;
}

__attribute__((noinline)) void move_points(void) {
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 8; i++) { points[i].x += i; points[i].y -= k; }
}

int main(void) {
    fill();
    long s = sum();
    int v = count_vowels();
    move_points();
    printf("sum=%ld total=%ld vowels=%d p7=%d,%d\n", s, total, v, points[7].x, points[7].y);
    return 0;
}
