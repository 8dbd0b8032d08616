// SPDX-License-Identifier: GPL-2.0-or-later
/* Functions shorter than the 5 bytes of a jump, touching traced data, called
 * in a hot loop.  get_y() is `mov eax, [rdi + 4]; ret` (4 bytes) followed by
 * the compiler's alignment padding: its entry's jump to the copy takes the
 * padding.  tight_a() (3 bytes, `mov eax, [rdi]; ret`) is followed at once by
 * tight_b(), with no padding between (written in assembly): its entry cannot
 * take the jump, every call enters the original code.  Prints a checksum.
 * argv[1]: iterations (default 100000). */
#include <stdio.h>
#include <stdlib.h>

struct pair { int x, y; };
struct pair pairs[64];                     /* .bss: traced */

__attribute__((noinline)) int get_y(const struct pair *p) { return p->y; }
__attribute__((noinline)) long scaled(long x) { return x * 7 + pairs[0].x; }

int tight_a(const struct pair *p);
int tight_b(const struct pair *p);
__asm__(".text\n.p2align 4\n"
        ".globl tight_a\n.type tight_a, @function\ntight_a:\n"
        "\tmovl (%rdi), %eax\n\tret\n.size tight_a, .-tight_a\n"
        ".globl tight_b\n.type tight_b, @function\ntight_b:\n"
        "\tmovl 4(%rdi), %eax\n\taddl $1, %eax\n\tret\n.size tight_b, .-tight_b\n");

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 100000, sum = 0;
    for (int i = 0; i < 64; i++) {
        pairs[i].x = i;
        pairs[i].y = 3 * i;
    }
    for (long i = 0; i < n; i++) {
        const struct pair *p = &pairs[i & 63];
        sum += get_y(p) + tight_a(p) + tight_b(p);
    }
    printf("sum %ld\n", scaled(sum));
    return 0;
}
