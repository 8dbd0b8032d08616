// operator new throwing std::bad_alloc through the hybrid engine's hook stubs
// (the exception unwinds through the stub of operator new[] and of operator new,
// whose return points madtrace describes to the C++ unwinder), and new/delete
// that succeed.  Prints how many were caught.
#include <cstdio>
#include <new>
#include <cstdlib>
int main(int argc, char **argv) {
    int caught = 0;
    for (int i = 0; i < 3; i++) {
        try {
            char *p = new char[(size_t)1 << 60];
            p[0] = 1;
            delete[] p;
        } catch (const std::bad_alloc &) {
            caught++;
        }
        int *q = new int[10];
        q[3] = i;
        delete[] q;
    }
    std::printf("caught=%d\n", caught);
    return 0;
}
