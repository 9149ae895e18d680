/* agentworker's entry into an exec sandbox: the last step before the pinned program.
 *
 * bubblewrap has built the sandbox (namespaces, mounts, the seccomp filter) and
 * runs this as the sandbox's first process. It then, in this order:
 *
 *   -n FD       sends the worker, over the socket FD, a sock_diag netlink socket of
 *               the sandbox's own network namespace (the worker sums what the
 *               sandbox's sockets hold in kernel buffers through it: no rlimit
 *               counts that; see sandbox/sockets.py), then adds a seccomp filter
 *               that refuses every netlink socket after it (refuse_netlink);
 *   -L FD       exits at once if the worker that started the sandbox is gone (the
 *               read end of a pipe whose write end only the worker holds), so a
 *               sandbox whose worker died while it was starting never runs on; then
 *               closes every descriptor but stdin, stdout and stderr;
 *   -r R:S:H    sets resource limit R (its number) to soft S and hard H;
 *   -p N:PATH   writes N to PATH: pid_max of the sandbox's own pid namespace;
 *   -x PATH     lets PATH be executed (repeated: the program, its ELF interpreter);
 *   -w PATH     lets files be written, made and removed beneath PATH (repeated);
 *   -d PATH     lets existing files beneath PATH be written, nothing made (/dev);
 *
 * Given `-W FD` first (a sandbox built ahead of its call, see sandbox/warm.py), it
 * first waits for the call: it reads from FD the message's length (4 bytes, little
 * endian) and that many bytes of NUL-ended strings, closes FD, and takes the strings as
 * more options after its own line, in the same order as above, where two more are
 * let through:
 *
 *   -C DIR      starts the program in DIR (as bubblewrap's --chdir would);
 *   -e NAME=VALUE  one variable of the program's environment (repeated: all of it;
 *               the environment bubblewrap gave this process is not passed on);
 *
 * and `--` with the program. A message cut short, or FD closed before it came (the
 * worker gone), exits 125 with nothing run. Nothing of the line above is done before
 * the message came: the limits, the pid cap and Landlock are set after, as without -W.
 *
 * then restricts itself with Landlock (execute and every kind of write handled, so
 * anything not named above is refused with EACCES; from ABI 6 on, scoped too: no
 * abstract unix socket and no process outside the sandbox's domain can be reached,
 * EPERM) and executes the program named
 * after `--`. Landlock holds for the program and everything it starts, and can
 * never be lifted. Any failure exits 125 with a line starting "agentworker-entry:"
 * on stderr: it never runs the program with less than it was asked for.
 *
 * It makes system calls only, through `sys` below. Built with AGENTWORKER_NOLIBC
 * (x86-64; see sandbox/_entry.py) it has no C library at all: its own start and
 * system-call instruction. That saves each exec the C library's start, which asks
 * the processor for its features with dozens of CPUID instructions (each traps to
 * the hypervisor on a virtual machine: 0.2-0.3 ms of each exec there), and the
 * dynamic loader's. Built without it, the C library's syscall() makes the calls.
 *
 * Run outside the sandbox as `-O FD [-N LAST] [-u NAME:VALUE]...`, it does the
 * worker's part of the sandbox's start while bubblewrap holds it at its start line
 * (after its namespaces exist, before the program runs); FD is a pidfd of the
 * sandbox's first process. It exits 0, or 125 with its message.
 *
 *   -N LAST     (a root worker) sets the last pid of the sandbox's pid namespace to
 *               LAST (300). Once a pid namespace has handed out pid 300 (the kernel's
 *               RESERVED_PIDS), its pids wrap back to 300, never below: pid_max N then
 *               leaves pids 300 to N-1. Before that every pid from 1 up is free, and a
 *               cap of 300 + P let P + 300 processes run at once (review7 finding 04).
 *               The sandbox cannot set its own last pid (ns_last_pid wants
 *               CAP_CHECKPOINT_RESTORE over the namespace, which belongs to the
 *               machine's user namespace for a root worker; spending pids 2 to 300 with
 *               threads instead took 4 ms an exec with a core free, 25 ms at load 20).
 *               The worker may, but only from a process of that namespace, which reads
 *               its own namespace's sysctl: this joins it (setns: for its children) and
 *               forks one child that writes /proc/sys/kernel/ns_last_pid and exits (only
 *               where its own pid there is below LAST: a fresh namespace, never the
 *               machine's), and reaps it. Before any -u: once in the sandbox's user
 *               namespace it holds no capability over the pid namespace's.
 *   -u NAME:VALUE  writes VALUE to /proc/sys/user/NAME of the sandbox's own user
 *               namespace: per-user counts the kernel keeps per user namespace and
 *               charges up the chain to the machine's (inotify instances and watches:
 *               one sandbox took all 128 of its user's instances, review8 finding 02).
 *               Writing them wants CAP_SYS_RESOURCE over that namespace, which the
 *               sandbox has dropped and its owner, the worker (root, or the person),
 *               holds: this joins it (setns, once; refused for the namespace it is
 *               already in, so never the machine's) and writes each. The program, with
 *               no capability there, cannot raise them again.
 *
 * One small static process, not nsenter and tee.
 *
 * No libc wrapper exists for Landlock in older C libraries, so the system calls and
 * structures are declared here (they are the same on every architecture).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>

#define NR_create_ruleset 444
#define NR_add_rule 445
#define NR_restrict_self 446
#define NR_close_range 436
#define RULE_PATH_BENEATH 1
#define VERSION_FLAG 1u

#define EXECUTE (1ull << 0)
#define WRITE_FILE (1ull << 1)
#define MAKE_AND_REMOVE (0x1ff0ull) /* REMOVE_DIR, REMOVE_FILE, MAKE_CHAR ... MAKE_SYM */
#define REFER (1ull << 13)          /* ABI 2 */
#define TRUNCATE (1ull << 14)       /* ABI 3 */
/* ABI 6: the sandbox may connect to no abstract unix socket, and signal no process,
 * made outside its own Landlock domain (review8 finding 14: with the network kept,
 * the machine's abstract sockets, the person's X server among them, are in reach). */
#define SCOPE_ABSTRACT_UNIX_SOCKET (1ull << 0)
#define SCOPE_SIGNAL (1ull << 1)

#define NEWPID 0x20000000 /* CLONE_NEWPID, for setns */
#define NEWUSER 0x10000000 /* CLONE_NEWUSER, for setns */
#define CHILD_EXITS 17    /* SIGCHLD: the fork's child tells its parent when it ends */
#define LAST_PID "/proc/sys/kernel/ns_last_pid"
#define USER_SYSCTLS "/proc/sys/user/"
#define NAME_MOST 48 /* the longest name a -u may give (max_inotify_instances: 21) */

#define CALL_MOST (64 * 1024) /* -W: the longest message of a call (sandbox/warm.py) */
#define WORDS_MOST 8192       /* -W: the most strings its line and the message hold */

struct ruleset_attr { uint64_t handled_access_fs, handled_access_net, scoped; };
struct __attribute__((packed)) path_beneath { uint64_t allowed_access; int32_t parent_fd; };
struct limit { uint64_t soft, hard; };
struct wait_none { long seconds, nanoseconds; };
struct lifeline { int fd; short events, revents; };
#define NETLINK_FAMILY 16 /* AF_NETLINK */
#define NETLINK_SOCK_DIAG 4
/* classic BPF for seccomp (linux/filter.h), our own names */
struct filter_insn { uint16_t code; uint8_t jt, jf; uint32_t k; };
struct filter_prog { unsigned short len; const struct filter_insn *insns; };

#ifdef AGENTWORKER_NOLIBC
#if !defined(__x86_64__)
#error "the build without a C library is for x86-64 only"
#endif
/* A system call: the result, or -errno. */
static long sys(long n, long a, long b, long c, long d, long e, long f) {
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    register long r9 __asm__("r9") = f;
    long result;
    __asm__ volatile("syscall"
                     : "=a"(result)
                     : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                     : "rcx", "r11", "memory");
    return result;
}
#else
#include <unistd.h>
static long sys(long n, long a, long b, long c, long d, long e, long f) {
    long result = syscall(n, a, b, c, d, e, f);
    return result == -1 ? -errno : result;
}
#endif

#define SYS1(n, a) sys((n), (long)(a), 0, 0, 0, 0, 0)
#define SYS2(n, a, b) sys((n), (long)(a), (long)(b), 0, 0, 0, 0)
#define SYS3(n, a, b, c) sys((n), (long)(a), (long)(b), (long)(c), 0, 0, 0)
#define SYS4(n, a, b, c, d) sys((n), (long)(a), (long)(b), (long)(c), (long)(d), 0, 0)
#define SYS5(n, a, b, c, d, e) sys((n), (long)(a), (long)(b), (long)(c), (long)(d), (long)(e), 0)

static int same(const char *a, const char *b) {
    while (*a && *a == *b) a++, b++;
    return *a == *b;
}

static const char *said(long err) {
    switch (err) {
    case EPERM: return "Operation not permitted";
    case ENOENT: return "No such file or directory";
    case EBADF: return "Bad file descriptor";
    case ENOMEM: return "Cannot allocate memory";
    case EACCES: return "Permission denied";
    case EFAULT: return "Bad address";
    case ENOTDIR: return "Not a directory";
    case EISDIR: return "Is a directory";
    case EINVAL: return "Invalid argument";
    case EMFILE: return "Too many open files";
    case ETXTBSY: return "Text file busy";
    case EROFS: return "Read-only file system";
    case EPIPE: return "Broken pipe";
    case E2BIG: return "Argument list too long";
    case ENOEXEC: return "Exec format error";
    case ENAMETOOLONG: return "File name too long";
    case ENOSYS: return "Function not implemented";
    case ELOOP: return "Too many levels of symbolic links";
    case EOPNOTSUPP: return "Operation not supported";
    case EAGAIN: return "Resource temporarily unavailable";
    case ECHILD: return "No child processes";
    case EINTR: return "Interrupted system call";
    case EIO: return "Input/output error";
    default: return 0;
    }
}

/* Appends `text` to the message being built in `line` (at most `room` bytes long). */
static unsigned long put(char *line, unsigned long at, unsigned long room, const char *text) {
    while (*text && at < room) line[at++] = *text++;
    return at;
}

static unsigned long put_number(char *line, unsigned long at, unsigned long room,
                                unsigned long long n) {
    char digits[24];
    int i = sizeof digits;
    digits[--i] = 0;
    do digits[--i] = (char)('0' + n % 10); while ((n /= 10) && i > 0);
    return put(line, at, room, digits + i);
}

static void leave(int code) {
    for (;;) SYS1(SYS_exit_group, code);
}

/* "agentworker-entry: WHAT[ DETAIL]: ERROR" on stderr, then exit 125. */
static void fail(const char *what, const char *detail, long err) {
    char line[1024];
    unsigned long room = sizeof line - 1, at = put(line, 0, room, "agentworker-entry: ");
    at = put(line, at, room, what);
    if (detail) at = put(line, put(line, at, room, " "), room, detail);
    at = put(line, at, room, ": ");
    if (said(err)) at = put(line, at, room, said(err));
    else at = put_number(line, put(line, at, room, "error "), room, (unsigned long long)err);
    line[at++] = '\n';
    SYS3(SYS_write, 2, line, at);
    leave(125);
}

/* A decimal number from *text on, which ends at `end` (a character, or 0 for the
 * string's end); *text is left just past that character. */
static unsigned long long number(const char **text, char end, const char *option) {
    const char *at = *text;
    unsigned long long n = 0;
    if (*at < '0' || *at > '9') fail("not a number in", option, EINVAL);
    for (; *at >= '0' && *at <= '9'; at++) {
        if (n > (~0ull - (unsigned)(*at - '0')) / 10) fail("too large a number in", option, EINVAL);
        n = n * 10 + (unsigned)(*at - '0');
    }
    if (*at != end) fail("not a number in", option, EINVAL);
    *text = end ? at + 1 : at;
    return n;
}

static void allow(int ruleset, const char *path, uint64_t access) {
    struct path_beneath rule = {.allowed_access = access};
    long fd = SYS4(SYS_openat, AT_FDCWD, path, O_PATH | O_CLOEXEC, 0);
    if (fd < 0) fail("cannot open", path, -fd);
    rule.parent_fd = (int32_t)fd;
    long done = SYS4(NR_add_rule, ruleset, RULE_PATH_BENEATH, &rule, 0);
    if (done) fail("cannot allow", path, -done);
    SYS1(SYS_close, fd);
}

static void close_all_but(int keep) { /* every descriptor above stderr, except `keep` */
    long below = keep > 3 ? SYS3(NR_close_range, 3, keep - 1, 0) : 0;
    if (below == 0 && SYS3(NR_close_range, keep + 1, ~0u, 0) == 0) return;
    for (int fd = 3; fd < 4096; fd++) /* before Linux 5.9: one at a time */
        if (fd != keep) SYS1(SYS_close, fd);
}

/* Sends a new sock_diag socket of this network namespace over the socket `to`. */
static void send_diag(int to) {
    long made = SYS3(SYS_socket, NETLINK_FAMILY, SOCK_RAW | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (made < 0) fail("cannot make a sock_diag socket", 0, -made);
    int diag = (int)made;
    char byte = 'n';
    struct iovec part = {.iov_base = &byte, .iov_len = 1};
    union { struct cmsghdr header; char room[CMSG_SPACE(sizeof(int))]; } control;
    for (unsigned long i = 0; i < sizeof control.room; i++) control.room[i] = 0;
    control.header.cmsg_len = CMSG_LEN(sizeof(int));
    control.header.cmsg_level = SOL_SOCKET;
    control.header.cmsg_type = SCM_RIGHTS;
    *(int *)CMSG_DATA(&control.header) = diag;
    struct msghdr message = {
        .msg_iov = &part, .msg_iovlen = 1, .msg_control = control.room,
        .msg_controllen = sizeof control.room,
    };
    long sent = SYS3(SYS_sendmsg, to, &message, MSG_NOSIGNAL);
    if (sent != 1) fail("cannot send the sock_diag socket", 0, sent < 0 ? -sent : EIO);
    SYS1(SYS_close, diag);
    SYS1(SYS_close, to);
}

/* After send_diag: no more netlink sockets. The worker's filter lets socket(AF_NETLINK,
 * SOCK_RAW | SOCK_CLOEXEC, NETLINK_SOCK_DIAG) through for send_diag alone (it is
 * installed before this runs); this second filter, which holds for the program and all
 * it starts as the first does, answers EAFNOSUPPORT to every socket(AF_NETLINK) from
 * now on, as a kernel without netlink would (review9 finding 03: the plan's socket sum
 * does not see netlink buffers). The first filter has refused other architectures. */
static void refuse_netlink(void) {
    static const struct filter_insn insns[] = {
        {0x20, 0, 0, 0},                               /* A = the call's number */
        {0x15, 0, 3, SYS_socket},                      /* socket? else let through */
        {0x20, 0, 0, 16},                              /* A = its domain (the low word) */
        {0x15, 0, 1, NETLINK_FAMILY},                  /* AF_NETLINK? */
        {0x06, 0, 0, 0x00050000u | EAFNOSUPPORT},      /* SECCOMP_RET_ERRNO */
        {0x06, 0, 0, 0x7fff0000u},                     /* SECCOMP_RET_ALLOW */
    };
    struct filter_prog prog = {sizeof insns / sizeof insns[0], insns};
    long done = SYS5(SYS_prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    if (!done) done = SYS3(SYS_prctl, PR_SET_SECCOMP, 2 /* SECCOMP_MODE_FILTER */, &prog);
    if (done) fail("cannot refuse netlink sockets", 0, -done);
}

/* Writes `text` (`size` bytes) to the sysctl at `path`, or fails saying `what`. */
static void write_sysctl(const char *path, const char *text, unsigned long size, const char *what) {
    long fd = SYS4(SYS_openat, AT_FDCWD, path, O_WRONLY | O_CLOEXEC, 0);
    long wrote = fd < 0 ? fd : SYS3(SYS_write, fd, text, size);
    if (wrote != (long)size) fail(what, path, wrote < 0 ? -wrote : EIO);
    SYS1(SYS_close, fd);
}

/* `-N LAST`, outside the sandbox, for the sandbox whose first process `pidfd` names:
 * see the top of this file. 0, or 125 with its message said. */
static int set_last_pid(long pidfd, const char *value) {
    const char *text = value;
    unsigned long long last = number(&text, 0, "-N");
    if (last > 4096) fail("too large a last pid in", "-N", EINVAL);
    char line[24];
    unsigned long size = put_number(line, 0, sizeof line - 1, last);
    line[size++] = '\n';
    long none[4] = {0, 0, 0, 0}; /* SIGCHLD at its default: ignored, the child would reap itself */
    SYS4(SYS_rt_sigaction, CHILD_EXITS, none, 0, 8);
    long done = SYS2(SYS_setns, pidfd, NEWPID);
    if (done) fail("cannot join the sandbox's pid namespace", 0, -done);
    long pid = SYS5(SYS_clone, CHILD_EXITS, 0, 0, 0, 0); /* a fork: its own copy of memory */
    if (pid < 0) fail("cannot start a process in the sandbox's pid namespace", 0, -pid);
    if (pid == 0) {
        /* Only ever forward, and only in a namespace that has not yet handed out LAST:
         * never the machine's own, were it given a pidfd of a process outside. */
        long own = SYS1(SYS_getpid, 0);
        if (own < 1 || (unsigned long long)own >= last)
            fail("not a fresh pid namespace (its pids are past the last one asked for)", 0, EINVAL);
        write_sysctl(LAST_PID, line, size, "cannot set the sandbox's last pid at");
        leave(0);
    }
    int status = 0;
    long reaped = SYS4(SYS_wait4, pid, &status, 0, 0);
    if (reaped != pid) fail("cannot reap the process that set the last pid", 0, reaped < 0 ? -reaped : ECHILD);
    if ((status & 0x7f) != 0) fail("the process that set the last pid was killed", 0, EINTR);
    return (status >> 8) & 0xff; /* 0, or 125 with its message said */
}

/* `-u NAME:VALUE`: VALUE into /proc/sys/user/NAME of the sandbox's user namespace,
 * joined first unless `*joined` (see the top of this file). */
static void set_user_limit(long pidfd, const char *value, int *joined) {
    char path[sizeof USER_SYSCTLS + NAME_MOST];
    unsigned long at = put(path, 0, sizeof path - 1, USER_SYSCTLS), start = at;
    const char *text = value;
    for (; *text && *text != ':'; text++) {
        if ((*text < 'a' || *text > 'z') && *text != '_') fail("not a limit's name in", "-u", EINVAL);
        if (at - start >= NAME_MOST) fail("too long a limit's name in", "-u", EINVAL);
        path[at++] = *text;
    }
    path[at] = 0;
    if (at == start || *text != ':') fail("not a limit's name in", "-u", EINVAL);
    text++;
    unsigned long long limit = number(&text, 0, "-u");
    if (limit > 0x7fffffffull) fail("too large a limit in", "-u", EINVAL);
    char line[24];
    unsigned long size = put_number(line, 0, sizeof line - 1, limit);
    line[size++] = '\n';
    if (!*joined) {
        long done = SYS2(SYS_setns, pidfd, NEWUSER);
        if (done) fail("cannot join the sandbox's user namespace", 0, -done);
        *joined = 1;
    }
    write_sysctl(path, line, size, "cannot set the sandbox's limit at");
}

/* `-O FD ...`, outside the sandbox: see the top of this file. */
static int outside(int argc, char **argv) {
    const char *text = argv[2];
    long pidfd = (long)number(&text, 0, "-O");
    int joined = 0, limits = 0;
    for (int at = 3; at < argc; at += 2) { /* the whole line read before anything is done */
        if (at + 1 >= argc) fail("no value for", argv[at], EINVAL);
        if (same(argv[at], "-u")) limits = 1;
        else if (!same(argv[at], "-N")) fail("unknown option outside the sandbox", argv[at], EINVAL);
        else if (limits) fail("-N comes before every -u", 0, EINVAL);
    }
    for (int at = 3; at < argc; at += 2) {
        if (same(argv[at], "-N")) {
            int code = set_last_pid(pidfd, argv[at + 1]);
            if (code) return code;
        } else {
            set_user_limit(pidfd, argv[at + 1], &joined);
        }
    }
    return 0;
}

static char call[CALL_MOST + 1];
static char *words[WORDS_MOST + 1];
static char *environment[WORDS_MOST + 1];

/* Reads exactly `size` bytes of `fd` into `into`; fails (nothing run) on an end before. */
static void read_exactly(int fd, char *into, unsigned long size) {
    for (unsigned long at = 0; at < size;) {
        long got = SYS3(SYS_read, fd, into + at, size - at);
        if (got == -EINTR) continue;
        if (got <= 0) fail("no call came: the worker is gone", 0, got < 0 ? -got : EPIPE);
        at += (unsigned long)got;
    }
}

/* `-W FD`: waits for the call (see the top of this file). Its line without `-W FD`,
 * then the message's strings, become the line the options are read from: its count. */
static int wait_for_call(int argc, char **argv) {
    const char *text = argv[2];
    int fd = (int)number(&text, 0, "-W");
    unsigned char head[4];
    read_exactly(fd, (char *)head, sizeof head);
    unsigned long size = head[0] | (unsigned long)head[1] << 8 | (unsigned long)head[2] << 16 |
                         (unsigned long)head[3] << 24;
    if (size == 0 || size > CALL_MOST) fail("a call of the wrong length", "-W", E2BIG);
    read_exactly(fd, call, size);
    SYS1(SYS_close, fd);
    if (call[size - 1] != 0) fail("a call not ended", "-W", EINVAL);
    int count = 0;
    words[count++] = argv[0];
    for (int at = 3; at < argc; at++) {
        if (count >= WORDS_MOST) fail("too many options", "-W", E2BIG);
        words[count++] = argv[at];
    }
    for (unsigned long at = 0; at < size; at++) {
        if (count >= WORDS_MOST) fail("too many options", "-W", E2BIG);
        words[count++] = call + at;
        while (call[at]) at++;
    }
    words[count] = 0;
    return count;
}

static int entry(int argc, char **argv, char **envp) {
    if (argc >= 3 && same(argv[1], "-O")) return outside(argc, argv);
    int waited = argc >= 3 && same(argv[1], "-W");
    const char *folder = 0;
    int variables = 0;
    if (waited) {
        argc = wait_for_call(argc, argv);
        argv = words;
    }
    long abi = SYS3(NR_create_ruleset, 0, 0, VERSION_FLAG);
    if (abi < 1) fail("Landlock is not available", 0, abi < 0 ? -abi : ENOSYS);
    uint64_t writes = WRITE_FILE | MAKE_AND_REMOVE | (abi >= 2 ? REFER : 0);
    uint64_t truncate = abi >= 3 ? TRUNCATE : 0;
    struct ruleset_attr attr = {.handled_access_fs = EXECUTE | writes | truncate};
    unsigned long size = sizeof attr.handled_access_fs; /* what ABIs 1 to 3 know */
    if (abi >= 6) {
        attr.scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL;
        size = sizeof attr;
    }
    long made = SYS3(NR_create_ruleset, &attr, size, 0);
    if (made < 0) fail("cannot create a Landlock ruleset", 0, -made);
    int ruleset = (int)made;

    int at = 1;
    for (; at < argc && !same(argv[at], "--"); at += 2) {
        const char *option = argv[at], *value = argv[at + 1];
        if (option[0] != '-' || !option[1] || option[2]) fail("unknown option", option, EINVAL);
        if (at + 1 >= argc) fail("no value for", option, EINVAL);
        if (option[1] == 'n') {
            const char *text = value;
            send_diag((int)number(&text, 0, option));
            refuse_netlink();
        } else if (option[1] == 'L') {
            const char *text = value;
            long fd = (long)number(&text, 0, option);
            struct lifeline line = {.fd = (int)fd, .events = 1 /* POLLIN */};
            struct wait_none none = {0, 0};
            if (SYS5(SYS_ppoll, &line, 1, &none, 0, 0) != 0) fail("the worker is gone", 0, EPIPE);
            close_all_but(ruleset);
        } else if (option[1] == 'r') {
            const char *text = value;
            int resource = (int)number(&text, ':', option);
            struct limit limit;
            limit.soft = number(&text, ':', option);
            limit.hard = number(&text, 0, option);
            long done = SYS4(SYS_prlimit64, 0, resource, &limit, 0);
            if (done) fail("cannot set resource limit", value, -done);
        } else if (option[1] == 'p') {
            const char *path = value;
            unsigned long long cap = number(&path, ':', option);
            char text[24];
            unsigned long size = put_number(text, 0, sizeof text - 1, cap);
            text[size++] = '\n';
            write_sysctl(path, text, size, "cannot cap processes at");
        } else if (option[1] == 'x') {
            allow(ruleset, value, EXECUTE);
        } else if (option[1] == 'w') {
            allow(ruleset, value, writes | truncate);
        } else if (option[1] == 'd') {
            allow(ruleset, value, WRITE_FILE | truncate);
        } else if (option[1] == 'C' && waited) {
            folder = value;
        } else if (option[1] == 'e' && waited) {
            if (variables >= WORDS_MOST) fail("too many variables", 0, E2BIG);
            environment[variables++] = (char *)value;
        } else {
            fail("unknown option", option, EINVAL);
        }
    }
    if (at + 1 >= argc) fail("no program was named", 0, EINVAL);
    char **program = argv + at + 1;
    if (waited) {
        if (!folder) fail("no folder to start in", "-W", EINVAL);
        long moved = SYS1(SYS_chdir, folder);
        if (moved) fail("cannot start in", folder, -moved);
        environment[variables] = 0;
        envp = environment;
    }
    long done = SYS5(SYS_prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    if (done) fail("cannot set no_new_privs", 0, -done);
    done = SYS2(NR_restrict_self, ruleset, 0);
    if (done) fail("cannot apply Landlock", 0, -done);
    SYS1(SYS_close, ruleset);
    done = SYS3(SYS_execve, program[0], program, envp);
    fail("cannot execute", program[0], -done);
    return 125;
}

#ifdef AGENTWORKER_NOLIBC
/* The process starts here, its stack holding argc, then argv, a null, envp, a null. */
__attribute__((noreturn, used)) void agentworker_start(long *stack) {
    int argc = (int)stack[0];
    char **argv = (char **)(stack + 1);
    leave(entry(argc, argv, argv + argc + 1));
    __builtin_unreachable();
}
__asm__(".text\n"
        ".global _start\n"
        "_start:\n"
        "  xor %rbp, %rbp\n"
        "  mov %rsp, %rdi\n"
        "  and $-16, %rsp\n"
        "  call agentworker_start\n"
        "  hlt\n");
#else
int main(int argc, char **argv, char **envp) { return entry(argc, argv, envp); }
#endif
