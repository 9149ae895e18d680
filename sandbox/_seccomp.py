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
`clone`, whose flags a filter can see. ioctl TIOCSTI (typing into the terminal)
is refused too.

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
}
_CLONE: Final[tuple[int, int]] = (56, 220)
_CLONE3: Final[tuple[int, int]] = (435, 435)
_IOCTL: Final[tuple[int, int]] = (16, 29)
TIOCSTI: Final = 0x5412
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
_RET_K: Final = 0x06
RET_ALLOW: Final = 0x7FFF0000
RET_ERRNO: Final = 0x00050000
_DENY: Final = RET_ERRNO | errno.EPERM
_NOSYS: Final = RET_ERRNO | errno.ENOSYS
# struct seccomp_data: nr, arch, instruction_pointer, args[6]
_NR, _ARCH, _ARG0, _ARG1 = 0, 4, 16, 24


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def build(machine: str) -> bytes | None:
    """The filter program for `machine` (os.uname().machine), or None if unknown."""
    if machine not in AUDIT_ARCH:
        return None
    column = 0 if machine == "x86_64" else 1
    denied = sorted({number for pair in DENIED.values() if (number := pair[column]) is not None})
    prog: list[bytes] = []
    # 1. Only this machine's native table: any other ABI is refused whole.
    prog += [_insn(_LD_W_ABS, _ARCH), _insn(_JEQ_K, AUDIT_ARCH[machine], 1, 0), _ret(_DENY)]
    prog.append(_insn(_LD_W_ABS, _NR))
    if machine == "x86_64":
        prog += [_insn(_JGE_K, _X32_BIT, 0, 1), _ret(_DENY)]
    # 2. The plain list.
    for number in denied:
        prog += [_insn(_JEQ_K, number, 0, 1), _ret(_DENY)]
    # 3. clone3's flags live in memory, out of a filter's sight: make libc use clone.
    prog += [_insn(_JEQ_K, _CLONE3[column], 0, 1), _ret(_NOSYS)]
    # 4. clone with any namespace flag (flags are clone's first argument, low word).
    prog += [
        _insn(_JEQ_K, _CLONE[column], 0, 3),
        _insn(_LD_W_ABS, _ARG0),
        _insn(_JSET_K, CLONE_NAMESPACES_ALL, 0, 1),
        _ret(_DENY),
        _insn(_LD_W_ABS, _NR),  # back to the number for the next test
    ]
    # 5. ioctl(fd, TIOCSTI, ...): pushing input into a terminal.
    prog += [
        _insn(_JEQ_K, _IOCTL[column], 0, 3),
        _insn(_LD_W_ABS, _ARG1),
        _insn(_JEQ_K, TIOCSTI, 0, 1),
        _ret(_DENY),
    ]
    prog.append(_ret(RET_ALLOW))
    return b"".join(prog)


def _ret(value: int) -> bytes:
    return _insn(_RET_K, value)


@functools.cache
def filter_for_machine() -> bytes | None:
    """This machine's filter, or None when its architecture has no table here (built
    once: every exec installs the same bytes)."""
    return build(os.uname().machine)
