// C++ exceptions thrown through traced functions must still be caught:
// madtrace does not patch modules that use C++ exceptions (and says so).
#include <cstdio>
#include <stdexcept>

__attribute__((noinline)) int checked(int x) {
    if (x % 7 == 3) throw std::runtime_error("bad value");
    return x * 2;
}

__attribute__((noinline)) int middle(int x) { return checked(x) + 1; }

int main() {
    int caught = 0, sum = 0;
    for (int i = 0; i < 100; i++) {
        try {
            sum += middle(i);
        } catch (const std::exception &) {
            caught++;
        }
    }
    std::printf("sum=%d caught=%d\n", sum, caught);
    return 0;
}
