"""The openat2(2) system call, reached through ctypes.

Python's standard library has no openat2 wrapper, yet it is the one call that lets
the kernel itself keep a lookup beneath a directory (RESOLVE_BENEATH), immune to
races a userspace walk has to reason about. Kernels before 5.6 (or seccomp filters
that hide the call) lack it; `available()` probes once so callers can fall back.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import platform
import sys
from collections.abc import Callable

# openat2 has the same number on both architectures we support.
_SYS_OPENAT2 = 437
_ARCHES = frozenset({"x86_64", "amd64", "aarch64", "arm64"})

# Bits for open_how.resolve, from <linux/openat2.h>.
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_BENEATH = 0x08


class _OpenHow(ctypes.Structure):
    _fields_ = (
        ("flags", ctypes.c_uint64),
        ("mode", ctypes.c_uint64),
        ("resolve", ctypes.c_uint64),
    )


@functools.cache
def _syscall() -> Callable[..., int]:
    func = ctypes.CDLL(None, use_errno=True).syscall
    func.restype = ctypes.c_long  # syscall() is variadic: no argtypes, every argument typed below
    return func


def openat2(dir_fd: int, path: str, flags: int, mode: int, resolve: int) -> int:
    """Open `path` relative to `dir_fd`; raise OSError as os.open would."""
    # The kernel refuses a non-zero mode unless a file may be created. (O_TMPFILE
    # includes the O_DIRECTORY bit, so it must be matched whole.)
    tmpfile = getattr(os, "O_TMPFILE", 0)
    creating = flags & os.O_CREAT or (tmpfile and flags & tmpfile == tmpfile)
    how = _OpenHow(flags, mode if creating else 0, resolve)
    raw = os.fsencode(path)
    while True:
        fd = _syscall()(
            ctypes.c_long(_SYS_OPENAT2),
            ctypes.c_long(dir_fd),
            ctypes.c_char_p(raw),
            ctypes.byref(how),
            ctypes.c_size_t(ctypes.sizeof(how)),
        )
        if fd >= 0:
            return int(fd)
        err = ctypes.get_errno()
        if err != errno.EINTR:  # os.open retries EINTR too (PEP 475)
            raise OSError(err, os.strerror(err))


@functools.cache
def available() -> bool:
    """Whether this kernel answers openat2; probed once per process."""
    if not sys.platform.startswith("linux") or platform.machine().lower() not in _ARCHES:
        return False
    try:
        fd = openat2(-100, ".", os.O_PATH | os.O_CLOEXEC, 0, RESOLVE_BENEATH)  # -100: AT_FDCWD
    except OSError as exc:
        # ENOSYS: kernel too old. EPERM: a seccomp filter refuses unknown calls.
        # Anything else (say EACCES on the working directory) still proves the call exists.
        return exc.errno not in (errno.ENOSYS, errno.EPERM, errno.EINVAL, errno.E2BIG)
    os.close(fd)
    return True
