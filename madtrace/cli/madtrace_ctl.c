// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * madtrace-ctl: the `madtrace daemon PID ...`, `madtrace ctl ...` and
 * `madtrace record ... -- CMD` commands without starting a Python interpreter
 * (built by the Makefile as build/bin/madtrace-ctl).
 *
 *   madtrace-ctl daemon PID [OPTIONS]     as madtrace daemon PID [OPTIONS]
 *   madtrace-ctl ctl PID COMMAND [ARGS]   as madtrace ctl PID COMMAND [ARGS]
 *   madtrace-ctl record [OPTIONS] -- CMD  as madtrace record [OPTIONS] -- CMD (not --repl)
 *   madtrace-ctl ANYTHING ELSE            as madtrace ANYTHING ELSE
 *
 * It speaks the resident process's protocol (madtrace/daemon/resident.py): one
 * JSON line {"argv", "cwd", "env", "umask", "package", "client"} with its
 * stdin, stdout and stderr passed along (SCM_RIGHTS); the resident forks a
 * worker that runs the very same command line with them (same messages, same
 * terminal) and answers {"exit": N} (the command's exit code) or
 * {"refused": "why"}.  For record, the program is forked here first (see
 * fork_program) and goes along as "child" with its two pipes; the worker
 * answers {"worker": PID} once it has taken it, then {"exit": N}.  Without a resident process, when it refuses, for
 * every other command, and when anything here fails, it runs the Python
 * command instead (exec: same pid, same arguments, environment and file
 * descriptors), which then does what `madtrace` always did and says so.
 * Strings go as JSON the way Python's json.dumps(..., ensure_ascii=False)
 * would have sent them: valid UTF-8 as it is, any other byte as the lone
 * surrogate U+DCxx (Python's surrogateescape), so the worker sees the same
 * str values as a Python client's sys.argv and os.environ.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

/* Built by the Makefile for a checkout: -DMADTRACE_PYTHON="/path/to/python"
 * -DMADTRACE_PACKAGE="/path/to/madtrace".  Built for an installed package (pip, pipx:
 * setup.py) with -DMADTRACE_PYTHON_VERSION="3.11" instead: installed beside the
 * environment's python in its bin/, it finds both from where it is. */
#ifdef MADTRACE_PYTHON
static const char *python_path(void) { return MADTRACE_PYTHON; }
static const char *package_path(void) { return MADTRACE_PACKAGE; }
#elif defined(MADTRACE_PYTHON_VERSION)
static char found_python[PATH_MAX + 64], found_package[PATH_MAX + 64];   /* exe dir + a name */
static void locate(void) {
    if (found_python[0])
        return;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        strcpy(found_python, "python3");
        strcpy(found_package, "");
        return;
    }
    exe[n] = 0;
    char *slash = strrchr(exe, '/');             /* <prefix>/bin/madtrace-ctl */
    *slash = 0;
    snprintf(found_python, sizeof found_python, "%s/python", exe);
    if (access(found_python, X_OK) != 0)
        snprintf(found_python, sizeof found_python, "%s/python3", exe);
    slash = strrchr(exe, '/');
    if (slash)
        *slash = 0;                               /* <prefix> */
    snprintf(found_package, sizeof found_package, "%s/lib/python%s/site-packages/madtrace", exe,
             MADTRACE_PYTHON_VERSION);
}
static const char *python_path(void) { locate(); return found_python; }
static const char *package_path(void) { locate(); return found_package; }
#else
#error "build with -DMADTRACE_PYTHON=... -DMADTRACE_PACKAGE=..., or -DMADTRACE_PYTHON_VERSION=..."
#endif

#define INTERNAL_ERROR 70   /* madtrace.cli.main.INTERNAL_ERROR_EXIT */
#define TRACER_INTERNAL_ERROR 20   /* madtrace.errors.TracerInternalError.exit_code */

extern char **environ;

/* ------------------------------------------------------------ JSON text */
struct buf {
    char *data;
    size_t len, cap;
};

static void put(struct buf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (b->len + n + 1 > cap)
            cap *= 2;
        char *data = realloc(b->data, cap);
        if (!data) {
            fputs("madtrace: out of memory\n", stderr);
            exit(INTERNAL_ERROR);
        }
        b->data = data;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
}

static void puts_(struct buf *b, const char *s) { put(b, s, strlen(s)); }

/* the length of the valid UTF-8 sequence at s (as Python's decoder takes it), 0 if none */
static size_t utf8_len(const unsigned char *s) {
    unsigned c = s[0];
    size_t n;
    unsigned lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf)
        n = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        n = 3;
        if (c == 0xe0) lo = 0xa0;
        if (c == 0xed) hi = 0x9f;          /* no encoded surrogates */
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4;
        if (c == 0xf0) lo = 0x90;
        if (c == 0xf4) hi = 0x8f;
    } else
        return 0;
    if (s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < n; i++)
        if (s[i] < 0x80 || s[i] > 0xbf)
            return 0;
    return n;
}

static void put_string(struct buf *b, const char *str) {
    const unsigned char *s = (const unsigned char *)str;
    char esc[16];
    put(b, "\"", 1);
    while (*s) {
        unsigned c = *s;
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            put(b, esc, 2);
            s++;
        } else if (c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            puts_(b, esc);
            s++;
        } else if (c < 0x80) {
            put(b, (const char *)s, 1);
            s++;
        } else {
            size_t n = utf8_len(s);
            if (n) {
                put(b, (const char *)s, n);
                s += n;
            } else {
                snprintf(esc, sizeof esc, "\\udc%02x", c);
                puts_(b, esc);
                s++;
            }
        }
    }
    put(b, "\"", 1);
}

/* ------------------------------------------------------------ the resident */
static int runtime_socket(char *path, size_t size) {
    const char *base = getenv("XDG_RUNTIME_DIR");
    int n = base && *base ? snprintf(path, size, "%s/madtrace/resident.sock", base)
                          : snprintf(path, size, "/tmp/madtrace-%u/resident.sock", (unsigned)getuid());
    return n > 0 && (size_t)n < size;
}

/* a connection to the resident process, or -1 (none listens: a stale socket is removed) */
static int connect_resident(void) {
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (!runtime_socket(addr.sun_path, sizeof addr.sun_path))
        return -1;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0)
        return fd;
    if (errno == ECONNREFUSED)
        unlink(addr.sun_path);      /* left by a resident that died */
    close(fd);
    return -1;
}

static void build_request(struct buf *b, int argc, char **argv, pid_t child) {
    char cwd[8192];
    mode_t mask = umask(0);
    umask(mask);
    puts_(b, "{\"argv\": [");
    for (int i = 1; i < argc; i++) {
        if (i > 1)
            puts_(b, ", ");
        put_string(b, argv[i]);
    }
    puts_(b, "], \"cwd\": ");
    if (!getcwd(cwd, sizeof cwd)) {
        perror("madtrace: getcwd");
        exit(INTERNAL_ERROR);
    }
    put_string(b, cwd);
    puts_(b, ", \"env\": {");
    int first = 1;
    for (char **e = environ; *e; e++) {
        char *eq = strchr(*e, '=');
        if (!eq || eq == *e)
            continue;               /* Python's os.environ skips these too */
        if (!first)
            puts_(b, ", ");
        first = 0;
        *eq = 0;
        put_string(b, *e);
        *eq = '=';
        puts_(b, ": ");
        put_string(b, eq + 1);
    }
    char tail[64];
    snprintf(tail, sizeof tail, "}, \"umask\": %u, \"package\": ", (unsigned)mask);
    puts_(b, tail);
    put_string(b, package_path());
    puts_(b, ", \"python\": ");
    put_string(b, python_path());
    if (child > 0) {
        snprintf(tail, sizeof tail, ", \"child\": %d", (int)child);
        puts_(b, tail);
    }
    puts_(b, ", \"client\": \"madtrace-ctl\"}\n");
}

/* the request, with stdin, stdout, stderr and the nfds - 3 descriptors in fds[3...] */
static int send_request(int fd, struct buf *b, int *fds, int nfds) {
    char control[CMSG_SPACE(5 * sizeof(int))];
    memset(control, 0, sizeof control);
    fds[0] = 0;
    fds[1] = 1;
    fds[2] = 2;
    struct iovec iov = {.iov_base = b->data, .iov_len = b->len};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                         .msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int))};
    struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
    memcpy(CMSG_DATA(cmsg), fds, (size_t)nfds * sizeof(int));
    ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n < 0)
        return -1;
    size_t done = (size_t)n;
    while (done < b->len) {          /* the descriptors went with the first bytes */
        n = send(fd, b->data + done, b->len - done, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        done += (size_t)n;
    }
    return 0;
}

/* one reply line ("" if the connection closed first); byte by byte: a record's
   worker sends two, the second when the program has ended */
static void read_reply(int fd, struct buf *line) {
    char c;
    for (;;) {
        ssize_t n = read(fd, &c, 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return;
        put(line, &c, 1);
        if (c == '\n')
            return;
    }
}

static void run_python(char **argv) {
    int argc = 0;
    while (argv[argc])
        argc++;
    char **args = calloc((size_t)argc + 3, sizeof *args);
    if (!args) {
        fputs("madtrace: out of memory\n", stderr);
        exit(INTERNAL_ERROR);
    }
    args[0] = (char *)python_path();
    args[1] = "-m";
    args[2] = "madtrace.cli.main";
    for (int i = 1; i < argc; i++)
        args[i + 2] = argv[i];
    execv(args[0], args);
    fprintf(stderr, "madtrace: cannot run %s: %s\n", args[0], strerror(errno));
    exit(INTERNAL_ERROR);
}

/* the resident closed the connection without an answer */
static int resident_failed(void) {
    const char *base = getenv("XDG_RUNTIME_DIR");
    if (base && *base)
        fprintf(stderr, "madtrace: the resident madtrace process failed while running the "
                        "command (see %s/madtrace/resident.log)\n", base);
    else
        fprintf(stderr, "madtrace: the resident madtrace process failed while running the "
                        "command (see /tmp/madtrace-%u/resident.log)\n", (unsigned)getuid());
    return TRACER_INTERNAL_ERROR;
}

/* the commands a worker of the resident runs as they would run here: clients of a
   daemon (1), and `record ... -- CMD ARGS` (2: the index of CMD is returned in *cmd) */
static int for_resident(int argc, char **argv, int *cmd) {
    if (argc < 3)
        return 0;
    if (strcmp(argv[1], "ctl") == 0)
        return 1;
    if (strcmp(argv[1], "record") == 0) {
        for (int i = 2; i < argc; i++) {
            if (strcmp(argv[i], "--") == 0) {
                *cmd = i + 1;
                return i + 1 < argc ? 2 : 0;
            }
            /* the REPL reads the terminal; help and version print and end */
            if (strcmp(argv[i], "--repl") == 0 || strcmp(argv[i], "--batch") == 0 ||
                strncmp(argv[i], "--batch=", 8) == 0 || strcmp(argv[i], "-h") == 0 ||
                strcmp(argv[i], "--help") == 0)
                return 0;
        }
        return 0;
    }
    if (strcmp(argv[1], "daemon") != 0)
        return 0;
    for (int i = 2; i < argc; i++)
        if (strcmp(argv[i], "--resident") == 0 || strcmp(argv[i], "--stop-resident") == 0 ||
            strcmp(argv[i], "--") == 0)
            return 0;
    return 1;
}

/* ----------------------------------------------------- record: the program */
/* The program to record, forked here (madtrace/process/spawn_proxy.py): in this
   session, process group and terminal, with this process's descriptors, limits
   and signal state.  It waits for the path to exec on go[0] (the worker writes it
   once it has seized the child; none: the command failed first, it exits 127),
   then execs; a failed exec's errno goes to err[1].  Both pipes close on exec. */
static pid_t fork_program(char **cmd, int sock, int go[2], int err[2]) {
    if (pipe2(go, O_CLOEXEC) < 0)
        return -1;
    if (pipe2(err, O_CLOEXEC) < 0) {
        close(go[0]);
        close(go[1]);
        return -1;
    }
    struct ucred peer;
    socklen_t len = sizeof peer;
    pid_t resident = getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &peer, &len) == 0 ? peer.pid : 0;
    pid_t pid = fork();
    if (pid != 0) {
        close(go[0]);
        close(err[1]);
        if (pid < 0) {
            close(go[1]);
            close(err[0]);
        }
        return pid;
    }
    close(go[1]);
    close(err[0]);
    /* with Yama's ptrace_scope 1, the resident's worker (its descendant) may seize us */
    if (resident > 0)
        prctl(PR_SET_PTRACER, (unsigned long)resident, 0, 0, 0);
    char path[PATH_MAX + 1];
    size_t n = 0;
    while (n < PATH_MAX) {
        ssize_t r = read(go[0], path + n, PATH_MAX - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    if (n == 0 || n >= PATH_MAX)
        _exit(127);
    path[n] = 0;
    execv(path, cmd);
    int e = errno;
    if (write(err[1], &e, sizeof e) < 0)
        _exit(127);
    _exit(127);
}

static volatile sig_atomic_t worker_pid;

static void forward(int sig) {
    if (worker_pid > 0)
        kill(worker_pid, sig);
}

/* `record ... -- CMD ARGS` through the resident: returns the command's exit code */
static int record(int fd, int argc, char **argv, int cmd) {
    int go[2], err[2];
    pid_t child = fork_program(argv + cmd, fd, go, err);
    if (child < 0) {
        close(fd);
        run_python(argv);
    }
    /* the program is reaped by the system when it ends (the tracer saw its end
       first); its own disposition of SIGCHLD is the one it was forked with */
    struct sigaction reap = {.sa_handler = SIG_IGN};
    sigemptyset(&reap.sa_mask);
    struct sigaction before;
    sigaction(SIGCHLD, &reap, &before);
    struct buf request = {0};
    build_request(&request, argc, argv, child);
    fflush(stdout);
    fflush(stderr);
    int fds[5];
    fds[3] = go[1];
    fds[4] = err[0];
    int sent = send_request(fd, &request, fds, 5);
    close(go[1]);               /* the worker holds them now */
    close(err[0]);
    struct buf reply = {0};
    if (sent == 0)
        read_reply(fd, &reply);
    if (strncmp(reply.data ? reply.data : "", "{\"worker\": ", 11) != 0) {
        /* not taken: the child sees its pipe close and exits without exec */
        close(fd);
        waitpid(child, NULL, 0);
        sigaction(SIGCHLD, &before, NULL);
        if (reply.len && strncmp(reply.data, "{\"refused\": ", 12) != 0)
            fprintf(stderr, "madtrace: unexpected answer of the resident process\n");
        run_python(argv);       /* refused or gone: the Python command, which says why */
    }
    /* as the Python command once it launched the program: Ctrl-C reaches the
       program (same process group), SIGTERM and SIGHUP make the tracer detach */
    worker_pid = (pid_t)atoi(reply.data + 11);
    struct sigaction sa = {.sa_handler = forward, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGINT, SIG_IGN);
    reply.len = 0;
    read_reply(fd, &reply);
    close(fd);
    if (!reply.len)
        return resident_failed();
    if (strncmp(reply.data, "{\"exit\": ", 9) == 0)
        return atoi(reply.data + 9);
    fprintf(stderr, "madtrace: unexpected answer of the resident process\n");
    return TRACER_INTERNAL_ERROR;
}

int main(int argc, char **argv) {
    int cmd = 0;
    int kind = for_resident(argc, argv, &cmd);
    if (!kind)
        run_python(argv);
    int fd = connect_resident();
    if (fd < 0)
        run_python(argv);           /* no resident: the Python command says so */
    if (kind == 2)
        return record(fd, argc, argv, cmd);
    struct buf request = {0};
    build_request(&request, argc, argv, 0);
    fflush(stdout);
    fflush(stderr);
    int fds[3];
    if (send_request(fd, &request, fds, 3) < 0) {
        close(fd);
        run_python(argv);
    }
    struct buf reply = {0};
    read_reply(fd, &reply);
    close(fd);
    if (!reply.len)
        return resident_failed();
    const char *exit_at = strstr(reply.data, "{\"exit\": ");
    if (exit_at == reply.data)
        return atoi(exit_at + 9);
    run_python(argv);               /* refused: the Python command starts it here, and says why */
    return INTERNAL_ERROR;
}
