/* agentworker's entry into an exec sandbox: the last step before the pinned program.
 *
 * bubblewrap has built the sandbox (namespaces, mounts, the seccomp filter) and
 * runs this as the sandbox's first process. It then, in this order:
 *
 *   -L FD       exits at once if the worker that started the sandbox is gone (the
 *               read end of a pipe whose write end only the worker holds), so a
 *               sandbox whose worker died while it was starting never runs on; then
 *               closes every descriptor but stdin, stdout and stderr;
 *   -r R:S:H    sets resource limit R (its number) to soft S and hard H;
 *   -p N:PATH   writes N to PATH: pid_max of the sandbox's own pid namespace;
 *   -s N        spends the namespace's pids until one is N (300, RESERVED_PIDS; below);
 *   -x PATH     lets PATH be executed (repeated: the program, its ELF interpreter);
 *   -w PATH     lets files be written, made and removed beneath PATH (repeated);
 *   -d PATH     lets existing files beneath PATH be written, nothing made (/dev);
 *
 * then restricts itself with Landlock (execute and every kind of write handled, so
 * anything not named above is refused with EACCES) and executes the program named
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
 * No libc wrapper exists for Landlock in older C libraries, so the system calls and
 * structures are declared here (they are the same on every architecture).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/prctl.h>
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

/* Once a pid namespace has handed out pid 300 (the kernel's RESERVED_PIDS), its pids
 * wrap back to 300, never below: pid_max N then leaves pids 300 to N-1 however many
 * were spent. Before that, every pid from 1 up is free, and a cap of 300 + P let P +
 * 300 processes run at once (review7 finding 04). The last pid cannot be set here
 * (ns_last_pid wants CAP_CHECKPOINT_RESTORE over the namespace, which belongs to the
 * machine's user namespace for a root worker), so threads that end at once take pids
 * 2 to 300, at most SPENDERS alive together: 4 ms with a core free, 10-25 ms on a
 * loaded 2-core machine (each must get a CPU to end). In a plan's cgroup, whose pids
 * they would take, the worker writes ns_last_pid from outside instead (no -s). */
#define SPENDERS 4
#define SPEND_FLAGS 0x350f00ul /* CLONE_VM FS FILES SIGHAND THREAD SYSVSEM PARENT_SETTID CHILD_CLEARTID */
#define FUTEX_WAIT 0 /* not private: the kernel wakes a cleared tid as a shared futex */

struct ruleset_attr { uint64_t handled_access_fs; };
struct __attribute__((packed)) path_beneath { uint64_t allowed_access; int32_t parent_fd; };
struct limit { uint64_t soft, hard; };
struct wait_none { long seconds, nanoseconds; };
struct lifeline { int fd; short events, revents; };

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

#ifdef AGENTWORKER_NOLIBC
/* Starts a thread that ends at once: its pid (written to *tid too, which the kernel
 * clears when the thread is gone), or -errno. The thread shares this stack, so it
 * runs nothing but the system call that ends it: it never touches memory. */
static long start_ending_thread(volatile int *tid) {
    register long r10 __asm__("r10") = (long)tid;
    register long r8 __asm__("r8") = 0;
    long result;
    __asm__ volatile("syscall\n\t"
                     "test %%rax, %%rax\n\t"
                     "jnz 1f\n\t"
                     "mov $60, %%eax\n\t" /* exit: this thread only */
                     "xor %%edi, %%edi\n\t"
                     "syscall\n"
                     "1:\n\t"
                     : "=a"(result)
                     : "a"((long)SYS_clone), "D"(SPEND_FLAGS), "S"(0L), "d"(tid), "r"(r10), "r"(r8)
                     : "rcx", "r11", "memory");
    return result;
}

static void until_gone(volatile int *tid) {
    for (int seen; (seen = *tid) != 0;) SYS4(SYS_futex, tid, FUTEX_WAIT, seen, 0);
}

static void spend_pids(long until) {
    static volatile int tids[SPENDERS];
    long pid = 0;
    for (unsigned n = 0; pid < until; n++) {
        if (n > 2 * until) fail("cannot spend the sandbox's first pids", 0, EAGAIN);
        volatile int *slot = &tids[n % SPENDERS];
        until_gone(slot);
        pid = start_ending_thread(slot);
        if (pid < 0) fail("cannot spend the sandbox's first pids", 0, -pid);
    }
    for (int i = 0; i < SPENDERS; i++) until_gone(&tids[i]);
}
#else
/* With the C library: a child per pid, each reaped before the next (vfork: the child
 * only exits). */
static void spend_pids(long until) {
    long pid = 0;
    for (unsigned n = 0; pid < until; n++) {
        if (n > 2 * until) fail("cannot spend the sandbox's first pids", 0, EAGAIN);
        pid = vfork();
        if (pid == 0) _exit(0);
        if (pid < 0) fail("cannot spend the sandbox's first pids", 0, errno);
        long reaped = SYS4(SYS_wait4, pid, 0, 0, 0);
        if (reaped != pid) fail("cannot reap a spent pid", 0, reaped < 0 ? -reaped : ECHILD);
    }
}
#endif

static int entry(int argc, char **argv, char **envp) {
    long abi = SYS3(NR_create_ruleset, 0, 0, VERSION_FLAG);
    if (abi < 1) fail("Landlock is not available", 0, abi < 0 ? -abi : ENOSYS);
    uint64_t writes = WRITE_FILE | MAKE_AND_REMOVE | (abi >= 2 ? REFER : 0);
    uint64_t truncate = abi >= 3 ? TRUNCATE : 0;
    struct ruleset_attr attr = {.handled_access_fs = EXECUTE | writes | truncate};
    long made = SYS3(NR_create_ruleset, &attr, sizeof attr, 0);
    if (made < 0) fail("cannot create a Landlock ruleset", 0, -made);
    int ruleset = (int)made;

    int at = 1;
    for (; at < argc && !same(argv[at], "--"); at += 2) {
        const char *option = argv[at], *value = argv[at + 1];
        if (option[0] != '-' || !option[1] || option[2]) fail("unknown option", option, EINVAL);
        if (at + 1 >= argc) fail("no value for", option, EINVAL);
        if (option[1] == 'L') {
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
            long fd = SYS4(SYS_openat, AT_FDCWD, path, O_WRONLY | O_CLOEXEC, 0);
            long wrote = fd < 0 ? fd : SYS3(SYS_write, fd, text, size);
            if (wrote != (long)size) fail("cannot cap processes at", path, wrote < 0 ? -wrote : EIO);
            SYS1(SYS_close, fd);
        } else if (option[1] == 's') {
            const char *text = value;
            unsigned long long until = number(&text, 0, option);
            if (until > 4096) fail("too many pids to spend in", option, EINVAL);
            spend_pids((long)until);
        } else if (option[1] == 'x') {
            allow(ruleset, value, EXECUTE);
        } else if (option[1] == 'w') {
            allow(ruleset, value, writes | truncate);
        } else if (option[1] == 'd') {
            allow(ruleset, value, WRITE_FILE | truncate);
        } else {
            fail("unknown option", option, EINVAL);
        }
    }
    if (at + 1 >= argc) fail("no program was named", 0, EINVAL);
    char **program = argv + at + 1;
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
