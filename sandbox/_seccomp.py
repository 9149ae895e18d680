"""A seccomp filter for sandboxed programs: the kernel's doors no allowlisted tool needs.

bubblewrap installs it (`--seccomp FD`) just before it starts the program, so it
holds for the program and everything the program starts, and can never be lifted.
It refuses, with EPERM, the calls that attack the kernel or the sandbox itself
rather than do a tool's work: tracing other processes (ptrace, process_vm_*),
mounting and namespaces (mount, the new mount API, unshare, setns, clone with a
namespace flag, pivot_root, chroot), kernel keyrings, BPF, perf events,
userfaultfd and io_uring (the usual routes of kernel exploits), module and kexec
loading, clocks, swap, reboot, and file handles that bypass path checks
(open_by_handle_at). `clone3` answers ENOSYS, so the C library falls back to
`clone`, whose flags a filter can see, and so does `io_setup` (Linux's native AIO,
whose contexts take events from a pool of the whole machine, fs.aio-max-nr: programs
that use it through libaio fall back to threads; glibc's POSIX aio never uses it),
and `vmsplice`, whose page references in a pipe kept whole huge pages (below).
ioctl TIOCSTI (typing into the terminal)
is refused too, and XFS's space requests (EOPNOTSUPP: they reserve blocks as fallocate
does), and so is `fallocate`, with EOPNOTSUPP as a file system without it
answers (glibc's posix_fallocate then writes): blocks kept past a file's end
(FALLOC_FL_KEEP_SIZE) and a range inserted into a file (FALLOC_FL_INSERT_RANGE, which
grows it unchecked) escape RLIMIT_FSIZE, the one bound on what a program's file may
take, and even plain fallocate takes disk faster than any watch of a workspace can
look (1 GiB in 0.07 s, file after file). Setting an extended attribute answers
EOPNOTSUPP too: a tmpfs (the sandbox's /tmp and /dev/shm) keeps xattrs beside its
size=, in kernel memory. So are memfd_create and System V shared
memory, message queues and semaphores (memory RLIMIT_AS does not count, though not
the only such memory: socket and pipe buffers, below), and prctl PR_SET_DUMPABLE: a
process that is not dumpable hides its open files from a worker that is not root, and
the watch of a workspace counts what they hold (sandbox.held_open). fcntl F_SETSIG is refused: with
O_ASYNC it has the kernel send the process a signal of its choosing on an event, and
SIGCONT so sent undid the stop that holds a plan's programs still while their
workspace is counted (review7 finding 03; defence in depth: a POSIX timer or
mq_notify can still send one, which no filter sees in a sigevent). fcntl F_SETLEASE
answers EACCES: a program's lease on a shared file held every open of it by the
person's programs for 45 s (review8 finding 13).

Socket and pipe buffers are kernel memory no rlimit counts: a socketpair written to
and never read holds its send buffer in the kernel (review7 finding 02). So
setsockopt SO_SNDBUF and SO_RCVBUF answer success and change nothing (the kernel
clamps them silently to net.core.[wr]mem_max anyway: here every socket keeps the
system's default, about 208 KiB, not up to 8 MiB), SO_SNDBUFFORCE and
SO_RCVBUFFORCE answer EPERM (as they do without CAP_NET_ADMIN), and fcntl
F_SETPIPE_SZ answers EPERM (as it does past pipe-max-size; a pipe keeps its 16
slots of 4 KiB pages, since vmsplice, whose slots held references to whole 2 MiB huge
pages, answers ENOSYS). That bounds each socket and pipe, not their number: where a
plan has no memory cgroup (rlimits mode) its programs can still pin about 100-200 MiB
of buffers per process within RLIMIT_NOFILE; only a cgroup bounds the plan's.

socket(2) is allowed, not refused by list: AF_INET and AF_INET6, of type SOCK_STREAM
or SOCK_DGRAM (with SOCK_NONBLOCK and SOCK_CLOEXEC) and protocol 0, TCP or UDP. Any
other family answers EAFNOSUPPORT, as a kernel without it does: AF_VSOCK above all,
which no network namespace holds, so a sandbox with the network off bound the
machine's vsock ports and could reach the VM's host at CID 2 (review9 finding 01),
and netlink (glibc's getaddrinfo then assumes both IPv4 and IPv6, as it does where
NETLINK_ROUTE cannot be opened); any other type or protocol (raw, MPTCP, UDP-Lite,
SCTP, ping) answers EPROTONOSUPPORT, as a kernel without MPTCP does. That keeps every
socket a sandbox makes in the plan's socket sum (sandbox.sockets: AF_UNIX, TCP and UDP
only), which MPTCP's, UDP-Lite's and netlink's buffers escaped (review9 finding 03).

socket(AF_UNIX, ...) is refused with EPERM. A unix socket is a door to whatever
listens on it, and what listens runs outside the sandbox, as the person: a named
socket in a shared folder, even one shared read-only (connect needs no write on
the mount, and Landlock's file rules of this kernel do not cover it: its right for
that, LANDLOCK_ACCESS_FS_RESOLVE_UNIX, came in 2026, after Linux 6.18): Docker's
socket, gpg and ssh agents, editors' IPC (review8 finding 15); and, where a rule
keeps the network (the machine's network namespace, which abstract sockets belong
to), the person's X server at @/tmp/.X11-unix/X0, which lets the person's uid in
(review8 finding 14). No allowlisted tool needs one: glibc's lookups through nscd
or systemd-resolved fall back to the files and DNS, syslog(3) drops its line.
socketpair(2), a call of its own that programs use for their own pipes
(multiprocessing, asyncio, ssh, rsync), is allowed for AF_UNIX SOCK_STREAM and
SOCK_SEQPACKET, whose ends answer EISCONN to connect; a SOCK_DGRAM pair answers
EPERM: its ends sendto and connect any named datagram socket they resolve, read-only
shares included, descriptors passed with them (review9 finding 02). A rule that says
`unix_sockets = true` gets socket(AF_UNIX) and every AF_UNIX socketpair; the other
families stay refused.

The filter is classic BPF, built here from syscall numbers (standard library only,
no libseccomp). It knows x86-64 and AArch64; any other architecture, and the
32-bit and x32 system-call tables of x86-64, get every call refused, so no ABI
slips past the list. `filter_for_machine()` is None where no table is known: the
worker then says, once, that exec runs without the filter.
"""

from __future__ import annotations

import errno
import functools
import os
import struct
from collections.abc import Mapping
from typing import Final

# (x86-64, AArch64 / the generic table) numbers, from the kernel's unistd headers.
DENIED: Final[Mapping[str, tuple[int | None, int | None]]] = {
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "pidfd_getfd": (438, 438),
    "kcmp": (312, 272),
    "mount": (165, 40),
    "umount2": (166, 39),
    "pivot_root": (155, 41),
    "chroot": (161, 51),
    "unshare": (272, 97),
    "setns": (308, 268),
    "fsopen": (430, 430),
    "fsconfig": (431, 431),
    "fsmount": (432, 432),
    "fspick": (433, 433),
    "move_mount": (429, 429),
    "open_tree": (428, 428),
    "mount_setattr": (442, 442),
    "keyctl": (250, 219),
    "add_key": (248, 217),
    "request_key": (249, 218),
    "bpf": (321, 280),
    "perf_event_open": (298, 241),
    "userfaultfd": (323, 282),
    "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427),
    "kexec_load": (246, 104),
    "kexec_file_load": (320, 294),
    "init_module": (175, 105),
    "finit_module": (313, 273),
    "delete_module": (176, 106),
    "swapon": (167, 224),
    "swapoff": (168, 225),
    "reboot": (169, 142),
    "acct": (163, 89),
    "quotactl": (179, 60),
    "quotactl_fd": (443, 443),
    "open_by_handle_at": (304, 265),
    "name_to_handle_at": (303, 264),
    "lookup_dcookie": (212, 18),
    "vhangup": (153, 58),
    "syslog": (103, 116),
    "iopl": (172, None),
    "ioperm": (173, None),
    "uselib": (134, None),
    "settimeofday": (164, 170),
    "clock_settime": (227, 112),
    "clock_adjtime": (305, 266),
    "adjtimex": (159, 171),
    "fanotify_init": (300, 262),
    "memfd_secret": (447, 447),
    "migrate_pages": (256, 238),
    "move_pages": (279, 239),
    "process_madvise": (440, 440),
    # Memory no file-system bound or count sees: anonymous files and System V shared
    # memory, message queues and semaphores (a private IPC namespace's live as long as
    # its sandbox, and its limits are the machine's: an array of 32,000 semaphores is 2
    # MiB of kernel memory, 32,000 arrays of them; review8 finding 07).
    "memfd_create": (319, 279),
    "shmget": (29, 194),
    "msgget": (68, 186),
    "semget": (64, 190),
}
_CLONE: Final[tuple[int, int]] = (56, 220)
_CLONE3: Final[tuple[int, int]] = (435, 435)
# Calls that answer ENOSYS, as a kernel built without them does, so that a program that
# asks falls back to what it does without them: clone3 (to clone, whose flags the filter
# sees), and io_setup: each context takes its events from the machine's fs.aio-max-nr,
# shared by every user, and one sandbox took all 65,536 of them (review8 finding 06).
# And vmsplice: it puts references to the caller's own pages into a pipe, and a reference
# to one 4 KiB piece of a huge page keeps all 2 MiB of it, after munmap too: 16 slots kept
# 32 MiB per pipe, 1.47 GB from 48 pipes under a 128 MiB RLIMIT_AS (review8 finding 01).
# Programs that use it (rare: none of the shipped tools, nor glibc) fall back to write.
ABSENT: Final[Mapping[str, tuple[int, int]]] = {
    "clone3": _CLONE3,
    "io_setup": (206, 0),
    "vmsplice": (278, 75),
}
_IOCTL: Final[tuple[int, int]] = (16, 29)
TIOCSTI: Final = 0x5412
# ioctl requests refused, and how: typing into the terminal, btrfs' subvolume requests
# (below), and XFS's space requests,
# which any file system of the fallocate family takes (RESVSP64 is fallocate with
# FALLOC_FL_KEEP_SIZE: 256 MiB under a 1 MiB file limit, review6 finding 08).
REFUSED_IOCTLS: Final[Mapping[int, str]] = {
    TIOCSTI: "eperm",
    0x4030580A: "eopnotsupp",  # XFS_IOC_ALLOCSP
    0x4030580B: "eopnotsupp",  # XFS_IOC_FREESP
    0x40305824: "eopnotsupp",  # XFS_IOC_ALLOCSP64
    0x40305825: "eopnotsupp",  # XFS_IOC_FREESP64
    0x40305828: "eopnotsupp",  # XFS_IOC_RESVSP
    0x40305829: "eopnotsupp",  # XFS_IOC_UNRESVSP
    0x4030582A: "eopnotsupp",  # XFS_IOC_RESVSP64
    0x4030582B: "eopnotsupp",  # XFS_IOC_UNRESVSP64
    0x40305839: "eopnotsupp",  # XFS_IOC_ZERO_RANGE
    # btrfs subvolumes (any user's in a folder it may write): a read-only snapshot in a
    # workspace can be removed by no one but root with btrfs' own tools, and teardown
    # left it and its quota's worth of disk behind for good (review7 finding 10).
    0x50009401: "eopnotsupp",  # BTRFS_IOC_SNAP_CREATE
    0x5000940E: "eopnotsupp",  # BTRFS_IOC_SUBVOL_CREATE
    0x5000940F: "eopnotsupp",  # BTRFS_IOC_SNAP_DESTROY
    0x40089413: "eopnotsupp",  # BTRFS_IOC_DEFAULT_SUBVOL
    0x50009417: "eopnotsupp",  # BTRFS_IOC_SNAP_CREATE_V2
    0x50009418: "eopnotsupp",  # BTRFS_IOC_SUBVOL_CREATE_V2
    0x4008941A: "eopnotsupp",  # BTRFS_IOC_SUBVOL_SETFLAGS
    0x5000943F: "eopnotsupp",  # BTRFS_IOC_SNAP_DESTROY_V2
}
_FALLOCATE: Final[tuple[int, int]] = (285, 47)
# Calls that answer EOPNOTSUPP, as a file system without them does: fallocate in every
# mode (review5 finding 07), and setting extended attributes. A tmpfs charges its xattrs
# to its inodes' space, not its size=: 768 MiB of user.* xattrs went into the sandbox's
# 256 MiB /tmp (review8 finding 11). The filter cannot read the name nor the file
# system, so every set is refused; programs treat it as a file system without xattrs
# (cp -a, shutil.copy2 and rsync -a go on without them). Reading and removing them work.
UNSUPPORTED: Final[Mapping[str, tuple[int, int]]] = {
    "fallocate": _FALLOCATE,
    "setxattr": (188, 5),
    "lsetxattr": (189, 6),
    "fsetxattr": (190, 7),
    "setxattrat": (463, 463),
}
_PRCTL: Final[tuple[int, int]] = (157, 167)
PR_SET_DUMPABLE: Final = 4
_FCNTL: Final[tuple[int, int]] = (72, 25)
F_SETSIG: Final = 10
F_SETLEASE: Final = 1024
F_SETPIPE_SZ: Final = 1031
# fcntl commands refused (its second argument, an unsigned int), and how. A lease on a
# file the program owns (a shared folder's, the person's for a desktop worker) made
# every open of it by the person's own programs wait lease-break-time, 45 s, while the
# program ignored SIGIO (review8 finding 13): EACCES, as the kernel answers for a file
# not the caller's (programs that try one, Samba's kernel oplocks, go on without).
REFUSED_FCNTLS: Final[Mapping[int, str]] = {
    F_SETSIG: "eperm",
    F_SETLEASE: "eacces",
    F_SETPIPE_SZ: "eperm",
}
_SETSOCKOPT: Final[tuple[int, int]] = (54, 208)
_SOCKET: Final[tuple[int, int]] = (41, 198)
_SOCKETPAIR: Final[tuple[int, int]] = (53, 199)
AF_UNIX: Final = 1
AF_INET: Final = 2
AF_INET6: Final = 10
AF_NETLINK: Final = 16
NETLINK_SOCK_DIAG: Final = 4
SOCK_RAW: Final = 3
SOCK_STREAM: Final = 1
SOCK_DGRAM: Final = 2
SOCK_SEQPACKET: Final = 5
SOCK_TYPE_MASK: Final = 0xF  # a socket type's low bits; the flags above them
SOCK_FLAGS: Final = 0o4000 | 0o2000000  # SOCK_NONBLOCK | SOCK_CLOEXEC
# socket(domain, type, protocol) is allowed, not refused by list (review9 findings 01, 03):
# the internet families, a stream or datagram type with its flags, and protocol 0, TCP or
# UDP, which the sandbox's own loopback and, with `network = true`, the machine's network
# take; whatever else a kernel has (vsock, which no network namespace holds; netlink;
# MPTCP and UDP-Lite, whose buffers the plan's socket sum does not see; raw, packet,
# XDP, AF_ALG and whatever comes next) is not a tool's. See the module's text.
SOCKET_DOMAINS: Final[tuple[int, ...]] = (AF_INET, AF_INET6)
SOCKET_TYPES: Final[tuple[int, ...]] = (SOCK_STREAM, SOCK_DGRAM)
SOCKET_PROTOCOLS: Final[tuple[int, ...]] = (0, 6, 17)  # the type's own, IPPROTO_TCP, _UDP
# With `diag` (the entry helper sends the worker a sock_diag socket of the sandbox,
# sandbox/entry.c's -n), socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_SOCK_DIAG),
# exactly as the helper asks, is let through too: the helper then adds a filter of its
# own that refuses every netlink socket before the program starts.
DIAG_SOCKET: Final[tuple[int, int, int]] = (AF_NETLINK, SOCK_RAW | 0o2000000, NETLINK_SOCK_DIAG)
# socketpair(AF_UNIX, type): a program's own pipe, stream or seqpacket, whose ends cannot
# be connected elsewhere (EISCONN). A datagram end can: sendto and connect reach any
# named datagram socket it resolves (review9 finding 02), so it is refused as
# socket(AF_UNIX) is (EPERM).
SOCKETPAIR_TYPES: Final[tuple[int, ...]] = (SOCK_STREAM, SOCK_SEQPACKET)
SOL_SOCKET: Final = 1
# setsockopt(fd, SOL_SOCKET, option) refused (its third argument, an int), and how:
# "ignore" answers success without doing it.
REFUSED_SOCKOPTS: Final[Mapping[int, str]] = {
    7: "ignore",  # SO_SNDBUF
    8: "ignore",  # SO_RCVBUF
    32: "eperm",  # SO_SNDBUFFORCE
    33: "eperm",  # SO_RCVBUFFORCE
}
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET (and NEWTIME, 0x80).
CLONE_NAMESPACES: Final = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000
CLONE_NAMESPACES_ALL: Final = CLONE_NAMESPACES | 0x10000000 | 0x20000000 | 0x40000000 | 0x80

AUDIT_ARCH: Final = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_X32_BIT: Final = 0x40000000

# BPF opcodes (linux/filter.h) and seccomp return values (linux/seccomp.h).
_LD_W_ABS: Final = 0x20
_JEQ_K: Final = 0x15
_JGE_K: Final = 0x35
_JSET_K: Final = 0x45
_AND_K: Final = 0x54  # BPF_ALU | BPF_AND | BPF_K
_RET_K: Final = 0x06
RET_ALLOW: Final = 0x7FFF0000
RET_ERRNO: Final = 0x00050000
_DENY: Final = RET_ERRNO | errno.EPERM
_IGNORED: Final = RET_ERRNO | 0  # the call answers 0 (success), not run
_NOSYS: Final = RET_ERRNO | errno.ENOSYS
_NOTSUP: Final = RET_ERRNO | errno.EOPNOTSUPP
_NOACCESS: Final = RET_ERRNO | errno.EACCES
_NOFAMILY: Final = RET_ERRNO | errno.EAFNOSUPPORT
_NOPROTOCOL: Final = RET_ERRNO | errno.EPROTONOSUPPORT
# struct seccomp_data: nr, arch, instruction_pointer, args[6]
_NR, _ARCH, _ARG0, _ARG1, _ARG2 = 0, 4, 16, 24, 32


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


# What the filter answers for a number of the native table (see `build`).
_ALLOW, _EPERM, _ENOSYS, _NOTSUPP = "allow", "eperm", "enosys", "eopnotsupp"
_EACCES = "eacces"
_EAFNOSUPPORT, _EPROTONOSUPPORT = "eafnosupport", "eprotonosupport"
_IGNORE = "ignore"
_CLONE_FLAGS, _IOCTL_CMD = "clone", "ioctl"
_PRCTL_OPTION, _FCNTL_CMD, _SOCKOPT = "prctl", "fcntl", "setsockopt"
_SOCKET_DOMAIN, _SOCKETPAIR_DOMAIN = "socket", "socketpair"
_NEXT: Final = "next"  # a jump's target: the next instruction


def verdicts(machine: str, unix_sockets: bool = False) -> dict[int, str]:
    """Each number of the native table the filter does not simply allow, and what it
    answers: EPERM, ENOSYS, EOPNOTSUPP, or a look at clone's flags, ioctl's request,
    prctl's option, fcntl's command, setsockopt's level and option, or socket's and
    socketpair's domain, type and protocol."""
    column = 0 if machine == "x86_64" else 1
    said = {number: _EPERM for pair in DENIED.values() if (number := pair[column]) is not None}
    said.update({pair[column]: _ENOSYS for pair in ABSENT.values()})
    said[_CLONE[column]] = _CLONE_FLAGS
    said[_IOCTL[column]] = _IOCTL_CMD
    said.update({pair[column]: _NOTSUPP for pair in UNSUPPORTED.values()})
    said[_PRCTL[column]] = _PRCTL_OPTION
    said[_FCNTL[column]] = _FCNTL_CMD
    said[_SETSOCKOPT[column]] = _SOCKOPT
    said[_SOCKET[column]] = _SOCKET_DOMAIN
    said[_SOCKETPAIR[column]] = _SOCKETPAIR_DOMAIN
    return said


def runs(machine: str, unix_sockets: bool = False) -> list[tuple[int, str]]:
    """The native table's number line (0 to 2**32 - 1) as runs of one answer: each
    run's first number and its answer, in order."""
    said = verdicts(machine, unix_sockets)

    def answer(number: int) -> str:
        if machine == "x86_64" and number >= _X32_BIT:
            return _EPERM  # the x32 ABI's numbers: refused whole
        return said.get(number, _ALLOW)

    edges = {0, *said, *(number + 1 for number in said)}
    if machine == "x86_64":
        edges.add(_X32_BIT)
    return [
        (number, answer(number))
        for number in sorted(edges)
        if number == 0 or answer(number) != answer(number - 1)
    ]


def build(machine: str, unix_sockets: bool = False, diag: bool = False) -> bytes | None:
    """The filter program for `machine` (os.uname().machine), or None if unknown;
    with `unix_sockets`, one that lets socket(AF_UNIX) and every socketpair(AF_UNIX)
    through; with `diag`, the entry helper's sock_diag socket (DIAG_SOCKET).

    Only the machine's native table is let through: any other ABI is refused whole.
    The call's number then goes down a balanced tree of `JGE` tests over `runs`, to
    the answer of the run it falls in: about ten steps for any number, where a
    list of tests takes one per refused call before it. When it installs a filter,
    the kernel runs it once for every number of the table (interrupts off) to learn
    which calls it may let through unfiltered; over a list of 55 that walk was most
    of what the filter cost each exec (see docs/architecture.md, The exec sandbox).
    """
    if machine not in AUDIT_ARCH:
        return None
    # (code, k, jt, jf), a jump's targets as labels: _NEXT, an answer, or a test's index.
    prog: list[tuple[int, int, object, object]] = [
        (_LD_W_ABS, _ARCH, _NEXT, _NEXT),
        (_JEQ_K, AUDIT_ARCH[machine], _NEXT, _EPERM),
        (_LD_W_ABS, _NR, _NEXT, _NEXT),
    ]
    line = runs(machine, unix_sockets)

    def test(lo: int, hi: int) -> object:
        """The label that tells line[lo:hi] apart: the answer of a single run, else a
        test of the middle run's first number, emitted here (its subtrees after it)."""
        if hi - lo == 1:
            return line[lo][1]
        mid = (lo + hi) // 2
        at = len(prog)
        prog.append((_JGE_K, line[mid][0], _NEXT, _NEXT))
        below = test(lo, mid)
        prog[at] = (_JGE_K, line[mid][0], test(mid, hi), below)
        return at

    test(0, len(line))
    labels: dict[object, int] = {}
    # clone with any namespace flag (its first argument's low word), ioctl's refused requests,
    # prctl PR_SET_DUMPABLE (its option, the first), fcntl's refused commands, setsockopt's
    # buffer sizes.
    labels[_CLONE_FLAGS] = len(prog)
    prog += [(_LD_W_ABS, _ARG0, _NEXT, _NEXT), (_JSET_K, CLONE_NAMESPACES_ALL, _EPERM, _ALLOW)]
    labels[_IOCTL_CMD] = len(prog)
    prog.append((_LD_W_ABS, _ARG1, _NEXT, _NEXT))
    *first, (last, its) = REFUSED_IOCTLS.items()
    prog += [(_JEQ_K, request, answer, _NEXT) for request, answer in first]
    prog.append((_JEQ_K, last, its, _ALLOW))
    labels[_PRCTL_OPTION] = len(prog)
    prog += [(_LD_W_ABS, _ARG0, _NEXT, _NEXT), (_JEQ_K, PR_SET_DUMPABLE, _EPERM, _ALLOW)]
    labels[_FCNTL_CMD] = len(prog)  # fcntl's refused commands (its second argument)
    prog.append((_LD_W_ABS, _ARG1, _NEXT, _NEXT))
    *before, (final, said) = REFUSED_FCNTLS.items()
    prog += [(_JEQ_K, command, answer, _NEXT) for command, answer in before]
    prog.append((_JEQ_K, final, said, _ALLOW))
    labels[_SOCKOPT] = len(prog)  # setsockopt: the level (second), then the option (third)
    prog += [(_LD_W_ABS, _ARG1, _NEXT, _NEXT), (_JEQ_K, SOL_SOCKET, _NEXT, _ALLOW)]
    prog.append((_LD_W_ABS, _ARG2, _NEXT, _NEXT))
    *options, (last_option, its_answer) = REFUSED_SOCKOPTS.items()
    prog += [(_JEQ_K, option, answer, _NEXT) for option, answer in options]
    prog.append((_JEQ_K, last_option, its_answer, _ALLOW))
    # socket: the domain (the first argument), then for the internet ones the type
    # (second: no flag but SOCK_NONBLOCK and SOCK_CLOEXEC, then its low bits) and the
    # protocol (third). A family not allowed answers EAFNOSUPPORT, as a kernel without it
    # does (programs then try the next); a type or protocol EPROTONOSUPPORT, as a kernel
    # without MPTCP answers (Go and curl then use TCP); AF_UNIX EPERM, as before.
    labels[_SOCKET_DOMAIN] = len(prog)
    prog.append((_LD_W_ABS, _ARG0, _NEXT, _NEXT))
    prog += [(_JEQ_K, domain, "socket type", _NEXT) for domain in SOCKET_DOMAINS]
    if diag:
        prog.append((_JEQ_K, DIAG_SOCKET[0], "diag socket", _NEXT))
    prog.append((_JEQ_K, AF_UNIX, _ALLOW if unix_sockets else _EPERM, _EAFNOSUPPORT))
    if diag:
        labels["diag socket"] = len(prog)
        prog.append((_LD_W_ABS, _ARG1, _NEXT, _NEXT))
        prog.append((_JEQ_K, DIAG_SOCKET[1], _NEXT, _EAFNOSUPPORT))
        prog.append((_LD_W_ABS, _ARG2, _NEXT, _NEXT))
        prog.append((_JEQ_K, DIAG_SOCKET[2], _ALLOW, _EAFNOSUPPORT))
    labels["socket type"] = len(prog)
    prog.append((_LD_W_ABS, _ARG1, _NEXT, _NEXT))
    prog.append((_JSET_K, ~(SOCK_TYPE_MASK | SOCK_FLAGS) & 0xFFFFFFFF, _EPROTONOSUPPORT, _NEXT))
    prog.append((_AND_K, SOCK_TYPE_MASK, _NEXT, _NEXT))
    *types, last_type = SOCKET_TYPES
    prog += [(_JEQ_K, kind, "socket protocol", _NEXT) for kind in types]
    prog.append((_JEQ_K, last_type, "socket protocol", _EPROTONOSUPPORT))
    labels["socket protocol"] = len(prog)
    prog.append((_LD_W_ABS, _ARG2, _NEXT, _NEXT))
    *protocols, last_protocol = SOCKET_PROTOCOLS
    prog += [(_JEQ_K, protocol, _ALLOW, _NEXT) for protocol in protocols]
    prog.append((_JEQ_K, last_protocol, _ALLOW, _EPROTONOSUPPORT))
    # socketpair: AF_UNIX only (the one family with pairs, but TIPC's), any of its types
    # with `unix_sockets`, else a stream or seqpacket type with no other flags.
    labels[_SOCKETPAIR_DOMAIN] = len(prog)
    prog.append((_LD_W_ABS, _ARG0, _NEXT, _NEXT))
    prog.append((_JEQ_K, AF_UNIX, _ALLOW if unix_sockets else _NEXT, _EAFNOSUPPORT))
    if not unix_sockets:
        prog.append((_LD_W_ABS, _ARG1, _NEXT, _NEXT))
        prog.append((_JSET_K, ~(SOCK_TYPE_MASK | SOCK_FLAGS) & 0xFFFFFFFF, _EPERM, _NEXT))
        prog.append((_AND_K, SOCK_TYPE_MASK, _NEXT, _NEXT))
        *kinds, last_kind = SOCKETPAIR_TYPES
        prog += [(_JEQ_K, kind, _ALLOW, _NEXT) for kind in kinds]
        prog.append((_JEQ_K, last_kind, _ALLOW, _EPERM))
    answers = (
        (_ALLOW, RET_ALLOW),
        (_EPERM, _DENY),
        (_ENOSYS, _NOSYS),
        (_NOTSUPP, _NOTSUP),
        (_EACCES, _NOACCESS),
        (_EAFNOSUPPORT, _NOFAMILY),
        (_EPROTONOSUPPORT, _NOPROTOCOL),
        (_IGNORE, _IGNORED),
    )
    for answer, value in answers:
        labels[answer] = len(prog)
        prog.append((_RET_K, value, _NEXT, _NEXT))

    def skip(at: int, target: object) -> int:
        if target == _NEXT:
            return 0
        to = target if isinstance(target, int) else labels[target]
        if not 0 <= to - at - 1 <= 255:  # classic BPF jumps only forward, by a byte
            raise ValueError(f"a seccomp jump from {at} to {to} cannot be encoded")
        return to - at - 1

    return b"".join(
        _insn(code, k, skip(at, jt), skip(at, jf)) for at, (code, k, jt, jf) in enumerate(prog)
    )


@functools.cache
def filter_for_machine(unix_sockets: bool = False, diag: bool = False) -> bytes | None:
    """This machine's filter, or None when its architecture has no table here (built
    once of each kind: every exec installs one of the same four)."""
    return build(os.uname().machine, unix_sockets, diag)
