"""Another local user who binds this machine's hub's port while the hub is away (review11
finding 06): run as root, it becomes uid/gid 65534 first, then listens on the address
given, accepts every connection and keeps what each one sends. It says `listening` once
bound; when its stdin closes it prints one JSON line (its uid, how many connections came,
every byte they sent) and leaves.

    python -m tests.support.port_squatter HOST:PORT
    python -m tests.support.port_squatter --unix PATH   (bound as root, listened as 65534)

A test drives it with `Squatter(*argv)`. Only the standard library: it must not load
anything of the project's as root."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

OTHER_UID = 65534
ROOT = Path(__file__).resolve().parents[2]
WITHIN_S = 60.0  # a ceiling for a loaded machine, not a pace


class Squatter:
    """This program in a process of its own, listening (`argv` as above)."""

    def __init__(self, *argv: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.port_squatter", *argv],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "listening"

    def report(self) -> dict[str, object]:
        """Closes its stdin; what it saw: its uid, connections, the bytes sent."""
        out, _ = self.proc.communicate(timeout=WITHIN_S)
        got: dict[str, object] = json.loads(out.strip().splitlines()[-1])
        return got


def become_other_user() -> None:
    if os.geteuid() == 0:
        os.setgroups([])
        os.setgid(OTHER_UID)
        os.setuid(OTHER_UID)


def main() -> None:
    got: dict[str, object] = {"connections": 0, "received": ""}
    lock = threading.Lock()
    if sys.argv[1] == "--unix":
        # Bound (the file made) as root, in root's own folder; listened as another user:
        # the kernel gives a client the listener's credentials (SO_PEERCRED).
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(sys.argv[2])
        become_other_user()
    else:
        become_other_user()
        host, _, port = sys.argv[1].rpartition(":")
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, int(port)))
    listener.listen(64)
    got["uid"] = os.geteuid()

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with lock:
                got["connections"] = int(str(got["connections"])) + 1
            threading.Thread(target=keep, args=(conn,), daemon=True).start()

    def keep(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(65536):
                with lock:
                    got["received"] = str(got["received"]) + data.decode("latin-1")

    threading.Thread(target=serve, daemon=True).start()
    print("listening", flush=True)
    sys.stdin.read()  # until the test closes it
    with lock:
        print(json.dumps(got), flush=True)


if __name__ == "__main__":
    main()
