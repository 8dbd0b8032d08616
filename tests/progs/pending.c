/* Calls that are pending while a session ends: two threads each sit inside a
 * function that waits for the main thread.  wait_direct() is only called
 * directly (call-site trampolines), wait_entry() through a pointer (entry
 * patching, its return address goes through an exit stub).  Each line on
 * stdin lets both return once; they call again at once, so at any time each
 * is inside its function, blocked in a futex.  At end of file both return
 * for good and the program prints how many calls each made and exits 0.
 * A session that detaches (or dies) while they wait must leave them
 * returning to their real callers. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static unsigned long generation;
static unsigned long entries;   /* calls that have started waiting */
static int done;

static unsigned long wait_for_next(unsigned long seen) {
    pthread_mutex_lock(&lock);
    entries++;
    pthread_cond_broadcast(&changed);
    while (generation == seen && !done)
        pthread_cond_wait(&changed, &lock);
    seen = generation;
    pthread_mutex_unlock(&lock);
    return seen;
}

__attribute__((noinline, noclone)) unsigned long wait_direct(unsigned long seen) {
    __asm__ volatile("" ::: "memory");
    return wait_for_next(seen);
}

__attribute__((noinline, noclone)) unsigned long wait_entry(unsigned long seen) {
    __asm__ volatile("" ::: "memory");
    return wait_for_next(seen);
}

unsigned long (*volatile entry_pointer)(unsigned long) = wait_entry;

static void *direct_thread(void *arg) {
    unsigned long seen = 0, *calls = arg;
    do {
        seen = wait_direct(seen);
        (*calls)++;
    } while (!__atomic_load_n(&done, __ATOMIC_ACQUIRE));
    return NULL;
}

static void *entry_thread(void *arg) {
    unsigned long seen = 0, *calls = arg;
    do {
        seen = entry_pointer(seen);
        (*calls)++;
    } while (!__atomic_load_n(&done, __ATOMIC_ACQUIRE));
    return NULL;
}

int main(void) {
    unsigned long direct_calls = 0, entry_calls = 0, lines = 0;
    pthread_t a, b;
    pthread_create(&a, NULL, direct_thread, &direct_calls);
    pthread_create(&b, NULL, entry_thread, &entry_calls);
    pthread_mutex_lock(&lock);
    while (entries < 2)
        pthread_cond_wait(&changed, &lock);
    pthread_mutex_unlock(&lock);
    printf("ready\n");
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        pthread_mutex_lock(&lock);
        generation++;
        lines++;
        pthread_cond_broadcast(&changed);
        while (entries < 2 * (lines + 1))     /* both are back inside */
            pthread_cond_wait(&changed, &lock);
        pthread_mutex_unlock(&lock);
        printf("step %lu\n", lines);
        fflush(stdout);
    }
    pthread_mutex_lock(&lock);
    __atomic_store_n(&done, 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&changed);
    pthread_mutex_unlock(&lock);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    printf("lines %lu direct %lu entry %lu\n", lines, direct_calls, entry_calls);
    return 0;
}
