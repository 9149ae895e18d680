"""A FUSE file system that never answers a lookup: what a mount whose server is gone
(sshfs, rclone, NFS or CIFS without its server) looks like to the kernel's callers.
A lookup beneath it waits until the server process ends (then ENOTCONN).

A few lines of the FUSE protocol over /dev/fuse, no library: the server answers INIT,
GETATTR of its root and STATFS, reports the name of each LOOKUP on a pipe (so a test
waits for the lookup to be under way, never for a time), and answers none. The kernel
sends the lookups of one folder one at a time: the others wait in the kernel for the
first (in fuse_lock_inode), which hangs them as surely. With `parallel`, the server
asks for parallel lookups (FUSE_PARALLEL_DIROPS), so each one reaches it, and a test
can wait until every one of its lookups is under way.

Mounting needs root and /dev/fuse. Mount only in a private mount namespace of your own
(`unshare -m --propagation private`): a hung mount in the machine's namespace would
hang whatever else walks past it. The server dies with the process that started it
(PR_SET_PDEATHSIG), which ends every lookup waiting on it.

Run as a program, it is the server: `python hung_fuse.py <fuse fd> <report fd>`.
"""

from __future__ import annotations

import ctypes
import os
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

MS_NOSUID, MS_NODEV, MNT_DETACH = 2, 4, 2
_HEADER = struct.Struct("<IIQQIIII")  # fuse_in_header: 40 bytes


def can_mount() -> str | None:
    """Why a hung mount cannot be made here, or None."""
    if os.geteuid() != 0:
        return "mounting a FUSE file system needs root (CI runs as root)"
    if not os.path.exists("/dev/fuse"):
        return "this machine has no /dev/fuse to mount a FUSE file system with"
    return None


class HungMount:
    def __init__(self, target: Path, server: subprocess.Popen[bytes], reports: int) -> None:
        self.target = target
        self.server = server
        self.reports = reports  # read end: each LOOKUP's name, one per line
        self._seen = b""

    def looked_up(self) -> set[str]:
        """The names looked up so far (reads what the pipe holds; call when readable)."""
        self._seen += os.read(self.reports, 4096)
        return {name.decode() for name in self._seen.split(b"\n") if name}

    def stop(self) -> None:
        """End the server: every lookup waiting on it fails (ENOTCONN)."""
        if self.server.poll() is None:
            self.server.kill()
        self.server.wait()


FUSE_PARALLEL_DIROPS = 1 << 18


@contextmanager
def hung_mount(target: Path, *, parallel: bool = False) -> Iterator[HungMount]:
    fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    libc = ctypes.CDLL(None, use_errno=True)
    options = f"fd={fd},rootmode=40000,user_id=0,group_id=0".encode()
    if libc.mount(b"hung", str(target).encode(), b"fuse.hung", MS_NOSUID | MS_NODEV, options):
        errno = ctypes.get_errno()
        os.close(fd)
        raise OSError(errno, f"mount fuse at {target}: {os.strerror(errno)}")
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    server = subprocess.Popen(
        [sys.executable, __file__, str(fd), str(write_end), str(os.getpid()), str(int(parallel))],
        pass_fds=(fd, write_end),
    )
    os.close(fd)
    os.close(write_end)
    mount = HungMount(target, server, read_end)
    try:
        # The root's attributes come only once the server answered INIT: until then
        # the kernel takes the folder's lock for each lookup, parallel or not.
        os.stat(target)
        yield mount
    finally:
        mount.stop()
        libc.umount2(str(target).encode(), MNT_DETACH)
        os.close(read_end)


def _serve(fd: int, reports: int, parent: int, parallel: bool) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: never outlive the test
    if os.getppid() != parent:
        return
    now = int(time.time())
    root = struct.pack(
        "<QQQQQQIIIIIIIIII", 1, 0, 0, now, now, now, 0, 0, 0, 0o40755, 2, 0, 0, 0, 4096, 0
    )
    while True:
        try:
            request = os.read(fd, 1 << 20)
        except OSError:
            return
        _length, opcode, unique, _node, *_rest = _HEADER.unpack_from(request)

        def reply(body: bytes = b"", error: int = 0, unique: int = unique) -> None:
            os.write(fd, struct.pack("<IiQ", 16 + len(body), error, unique) + body)

        if opcode == 26:  # INIT: protocol 7.31, no readahead, one background request
            flags = FUSE_PARALLEL_DIROPS if parallel else 0
            reply(struct.pack("<IIIIHHIIHHIIH22x", 7, 31, 0, flags, 1, 1, 4096, 1, 1, 0, 0, 0, 0))
        elif opcode == 3:  # GETATTR (of the root: nothing else is ever found)
            reply(struct.pack("<QII", 1, 0, 0) + root)
        elif opcode == 17:  # STATFS
            reply(struct.pack("<QQQQQIIII24x", 0, 0, 0, 0, 0, 4096, 255, 4096, 0))
        elif opcode == 1:  # LOOKUP: told, never answered
            name = request[_HEADER.size :].split(b"\0", 1)[0]
            os.write(reports, name + b"\n")
        elif opcode in (2, 36, 42):  # FORGET, INTERRUPT, BATCH_FORGET: no answer
            continue
        else:
            reply(error=-38)  # ENOSYS


if __name__ == "__main__":
    _serve(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:] == ["1"])
