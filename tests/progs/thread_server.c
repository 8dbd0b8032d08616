/* A thread-per-request server on 127.0.0.1: each connection gets a new thread
 * (detached, as http.server's), which reads a number N, calls handle(N) (it
 * calls work() N times) and answers with the sum.  A request "p" is a ping:
 * pong() answers it (load that calls neither handle nor work).  Prints "port
 * P" once it listens; ends at end of file on stdin, printing the requests
 * served and the calls of work() made (its own count: the oracle of a
 * tracer's).
 * Usage: thread_server */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static unsigned long served, works;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

__attribute__((noinline, noclone)) unsigned long work(unsigned long x) {
    __asm__ volatile("" ::: "memory");
    return x * 2654435761u + 7;
}

__attribute__((noinline, noclone)) unsigned long handle(unsigned long n) {
    unsigned long sum = 0;
    for (unsigned long i = 0; i < n; i++)
        sum += work(i);
    return sum;
}

static unsigned long pongs;

__attribute__((noinline, noclone)) int pong(char *out, size_t size) {
    __atomic_add_fetch(&pongs, 1, __ATOMIC_RELAXED);
    return snprintf(out, size, "pong\n");
}

static void *serve(void *arg) {
    int fd = (int)(long)arg;
    char buf[64];
    ssize_t got = read(fd, buf, sizeof buf - 1);
    if (got > 0 && buf[0] == 'p') {
        char out[16];
        int len = pong(out, sizeof out);
        if (write(fd, out, len) != len)
            perror("write");
    } else if (got > 0) {
        buf[got] = 0;
        unsigned long n = strtoul(buf, NULL, 10);
        char out[64];
        int len = snprintf(out, sizeof out, "%lu\n", handle(n));
        pthread_mutex_lock(&lock);        /* counted before the answer goes out */
        served++;
        works += n;
        pthread_mutex_unlock(&lock);
        if (write(fd, out, len) != len)
            perror("write");
    }
    close(fd);
    return NULL;
}

int main(void) {
    int listener = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof addr;
    if (bind(listener, (struct sockaddr *)&addr, sizeof addr) || listen(listener, 64) ||
        getsockname(listener, (struct sockaddr *)&addr, &len))
        return 2;
    printf("port %d\n", ntohs(addr.sin_port));
    fflush(stdout);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    struct pollfd fds[2] = {{listener, POLLIN, 0}, {0, POLLIN, 0}};
    for (;;) {
        if (poll(fds, 2, -1) < 0)
            continue;
        if (fds[1].revents) {
            char c;
            if (read(0, &c, 1) <= 0)
                break;
        }
        if (fds[0].revents & POLLIN) {
            int fd = accept(listener, NULL, NULL);
            pthread_t t;
            if (fd >= 0 && pthread_create(&t, &attr, serve, (void *)(long)fd) != 0)
                return 3;
        }
    }
    pthread_mutex_lock(&lock);
    printf("served %lu works %lu\n", served, works);
    pthread_mutex_unlock(&lock);
    return 0;
}
