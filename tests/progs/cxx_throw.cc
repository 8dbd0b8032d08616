// C++ exceptions thrown through traced calls must still be caught, with every
// destructor run on the way: madtrace registers unwind information for its
// call-site trampolines with the target's unwinder (madtrace/target/trampoline_unwind.py).
// Paths: a catch in main two trampolines up, a cleanup (destructor) in a frame
// the exception leaves, a catch-and-rethrow in between.
#include <cstdio>
#include <stdexcept>

static int destroyed = 0, rethrown = 0;

struct Guard {
    int value;
    ~Guard() { destroyed += value != 0; }
};

__attribute__((noinline)) int checked(int x) {
    if (x % 7 == 3) throw std::runtime_error("bad value");
    return x * 2;
}

__attribute__((noinline)) int middle(int x) {
    Guard g{x};                       // its destructor runs when checked() throws
    return checked(x) + g.value % 2;
}

__attribute__((noinline)) int relay(int x) {
    try {
        return middle(x);
    } catch (const std::runtime_error &) {
        rethrown++;
        throw;                        // the same exception goes on up
    }
}

int main() {
    int caught = 0, sum = 0;
    for (int i = 0; i < 100; i++) {
        try {
            sum += (i % 2) ? relay(i) : middle(i);
        } catch (const std::exception &) {
            caught++;
        }
    }
    std::printf("sum=%d caught=%d destroyed=%d rethrown=%d\n", sum, caught, destroyed, rethrown);
    return 0;
}
