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
 * No libc wrapper exists for Landlock in older C libraries, so the system calls and
 * structures are declared here (they are the same on every architecture).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

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

struct ruleset_attr { uint64_t handled_access_fs; };
struct __attribute__((packed)) path_beneath { uint64_t allowed_access; int32_t parent_fd; };

static void fail(const char *what, const char *detail) {
    fprintf(stderr, "agentworker-entry: %s%s%s: %s\n", what, detail ? " " : "",
            detail ? detail : "", strerror(errno));
    exit(125);
}

static void allow(int ruleset, const char *path, uint64_t access) {
    struct path_beneath rule = {.allowed_access = access};
    rule.parent_fd = open(path, O_PATH | O_CLOEXEC);
    if (rule.parent_fd < 0) fail("cannot open", path);
    if (syscall(NR_add_rule, ruleset, RULE_PATH_BENEATH, &rule, 0)) fail("cannot allow", path);
    close(rule.parent_fd);
}

static void close_all_but(int keep) { /* every descriptor above stderr, except `keep` */
    long below = keep > 3 ? syscall(NR_close_range, 3, keep - 1, 0) : 0;
    if (below == 0 && syscall(NR_close_range, keep + 1, ~0u, 0) == 0) return;
    for (int fd = 3; fd < 4096; fd++) /* before Linux 5.9: one at a time */
        if (fd != keep) close(fd);
}

int main(int argc, char **argv) {
    long abi = syscall(NR_create_ruleset, NULL, 0, VERSION_FLAG);
    if (abi < 1) fail("Landlock is not available", NULL);
    uint64_t writes = WRITE_FILE | MAKE_AND_REMOVE | (abi >= 2 ? REFER : 0);
    uint64_t truncate = abi >= 3 ? TRUNCATE : 0;
    struct ruleset_attr attr = {.handled_access_fs = EXECUTE | writes | truncate};
    int ruleset = (int)syscall(NR_create_ruleset, &attr, sizeof attr, 0);
    if (ruleset < 0) fail("cannot create a Landlock ruleset", NULL);

    int opt;
    while ((opt = getopt(argc, argv, "+L:r:p:x:w:d:")) != -1) {
        char *rest;
        if (opt == 'L') {
            int fd = atoi(optarg);
            struct pollfd lifeline = {.fd = fd, .events = POLLIN};
            if (poll(&lifeline, 1, 0) != 0) { errno = EPIPE; fail("the worker is gone", NULL); }
            close_all_but(ruleset);
        } else if (opt == 'r') {
            int resource = (int)strtol(optarg, &rest, 10);
            struct rlimit limit;
            limit.rlim_cur = strtoull(rest + 1, &rest, 10);
            limit.rlim_max = strtoull(rest + 1, NULL, 10);
            if (setrlimit(resource, &limit)) fail("cannot set resource limit", optarg);
        } else if (opt == 'p') {
            long cap = strtol(optarg, &rest, 10);
            int fd = open(rest + 1, O_WRONLY | O_CLOEXEC);
            if (fd < 0 || dprintf(fd, "%ld\n", cap) < 0) fail("cannot cap processes at", rest + 1);
            close(fd);
        } else if (opt == 'x') {
            allow(ruleset, optarg, EXECUTE);
        } else if (opt == 'w') {
            allow(ruleset, optarg, writes | truncate);
        } else if (opt == 'd') {
            allow(ruleset, optarg, WRITE_FILE | truncate);
        } else {
            errno = EINVAL;
            fail("unknown option", NULL);
        }
    }
    if (optind >= argc) { errno = EINVAL; fail("no program was named", NULL); }
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) fail("cannot set no_new_privs", NULL);
    if (syscall(NR_restrict_self, ruleset, 0)) fail("cannot apply Landlock", NULL);
    close(ruleset);
    execv(argv[optind], &argv[optind]);
    fail("cannot execute", argv[optind]);
}
