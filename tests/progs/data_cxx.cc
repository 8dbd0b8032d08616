// SPDX-License-Identifier: GPL-2.0-or-later
// C++ allocations for the allocation tracker: operator new / new[] / delete /
// delete[] (and a std::vector growing through them).  Deterministic output.
#include <cstdio>
#include <vector>

struct Node { Node *next; long value; };

__attribute__((noinline)) long build_and_sum(int n) {
    Node *head = nullptr;
    for (int i = 0; i < n; i++) head = new Node{head, i * 3L};
    long s = 0;
    for (Node *p = head; p; p = p->next) s += p->value;
    while (head) { Node *next = head->next; delete head; head = next; }
    return s;
}

__attribute__((noinline)) long array_sum(int n) {
    long *a = new long[n];
    for (int i = 0; i < n; i++) a[i] = i;
    long s = 0;
    for (int i = 0; i < n; i++) s += a[i];
    delete[] a;
    return s;
}

int main() {
    std::vector<int> v;
    for (int i = 0; i < 100; i++) v.push_back(i);
    std::printf("list=%ld array=%ld vector=%zu\n", build_and_sum(10), array_sum(64), v.size());
    return 0;
}
