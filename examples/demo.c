/* madtrace's bundled demo: a tiny image filter with globals, heap blocks and
 * a call tree (main -> process -> blur_row / histogram). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define W 64
#define H 16

unsigned char image[H][W];           /* .bss */
int histogram_bins[16];              /* .bss */
const char *title = "madtrace demo"; /* .data */

static void fill(unsigned seed) {
    for (int y = 0; y < H; y++)
        for (int x = 0; x < W; x++) {
            seed = seed * 1103515245u + 12345u;
            image[y][x] = (unsigned char)(seed >> 16);
        }
}

static void blur_row(unsigned char *out, const unsigned char *in) {
    for (int x = 1; x < W - 1; x++) out[x] = (unsigned char)((in[x - 1] + in[x] + in[x + 1]) / 3);
    out[0] = in[0];
    out[W - 1] = in[W - 1];
}

static void histogram(const unsigned char *row) {
    for (int x = 0; x < W; x++) histogram_bins[row[x] >> 4]++;
}

static long process(void) {
    unsigned char *tmp = malloc(W);
    long sum = 0;
    for (int y = 0; y < H; y++) {
        blur_row(tmp, image[y]);
        memcpy(image[y], tmp, W);
        histogram(image[y]);
    }
    for (int i = 0; i < 16; i++) sum += (long)histogram_bins[i] * i;
    free(tmp);
    return sum;
}

int main(void) {
    fill(42);
    long s = process();
    printf("%s: weighted histogram = %ld\n", title, s);
    return 0;
}
