/* A library that tests/progs/data_dlopen.c loads with dlopen after its start:
 * its code touches the program's heap, so data tracing must relocate functions
 * of a module that was not mapped when tracing began.  fill_odd() is internal
 * (static): in the stripped copy (strip --strip-all) it has no symbol left, only
 * its .eh_frame entry. */
__attribute__((noinline)) void fill_add(volatile long *buf, long n, long x)
{
    for (long i = 0; i < n; i++)
        buf[i] += x + i;
}

__attribute__((noinline)) static void fill_odd(volatile long *buf, long n)
{
    for (long i = 1; i < n; i += 2)
        buf[i] ^= i;
}

long fill_run(volatile long *buf, long n, long rounds)
{
    long sum = 0;
    for (long r = 0; r < rounds; r++) {
        fill_add(buf, n, r);
        fill_odd(buf, n);
    }
    for (long i = 0; i < n; i++)
        sum += buf[i];
    return sum;
}
