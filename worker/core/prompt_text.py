"""What an approval prompt shows of a call, and which calls may share one prompt.

Telemetry keeps a short, masked preview of a call's args (`worker.core.redaction`);
a prompt must not: the person approves what they are shown, so a prompt shows the
call's args whole, as the action took them (defaults filled in), never masked or cut,
with each file path as it resolves inside the shared folders and the blob's size and
start. Calls share a prompt only when they are the same call: the same action, agent
and plan, the same args and the same blob (`identity`). A call whose args are too long
to read in a prompt is not put to the person at all (approvals.too_long_to_show).

The text's line breaks are its own: the args are JSON (a newline in a value is
written `\\n`), a path or command goes on its line through `one_line`, and each line
of the blob is shown behind a gutter (`│ `), so nothing the agent sends can start a
line that passes for one of the prompt's. The console makes each line inert.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any, Final

import blake3
from pydantic import BaseModel

from sandbox import ConfinementError, Root, locate

# A prompt shows at most this many characters of a call (after making them inert).
# Longer calls are refused rather than shown cut: nobody reads 16,000 characters in a
# prompt, and a cut would hide the part that matters.
SHOW_LIMIT: Final = 16_384
# How much of a blob a prompt shows as text (its size and identity are always there).
BLOB_HEAD: Final = 1024
# A blob this large is hashed in a thread, off the event loop.
_HASH_IN_THREAD: Final = 256 * 1024
# Args that name a file or folder, and what they mean (shown resolved).
_PATH_FIELDS: Final = {"path": "path", "cwd": "working folder"}


def call_text(
    surface: str, args: BaseModel, roots: Sequence[Root], blob: Sequence[bytes | memoryview]
) -> str:
    """The call as its prompt shows it: args whole, paths resolved, the blob's start."""
    dumped = args.model_dump(mode="json")
    lines = [
        "args, as the action takes them:",
        json.dumps(dumped, indent=2, ensure_ascii=False),
    ]
    if surface == "workerHost":  # workbench paths are confined to the plan's workspace
        lines.extend(_resolved(dumped, roots))
    if any(len(piece) for piece in blob):
        lines.append(blob_head(blob))
    return "\n".join(lines)


def _resolved(dumped: dict[str, Any], roots: Sequence[Root]) -> list[str]:
    """Where each path argument lands, by its text alone (as the action first judges
    it; no file is opened): `a/b/../../.git/x` is shown as the folder it reaches."""
    out: list[str] = []
    for name, meaning in _PATH_FIELDS.items():
        value = dumped.get(name)
        if not isinstance(value, str):
            continue
        try:
            located = locate(roots, value)
        except ConfinementError:
            out.append(f"{meaning}: outside the shared folders (the call will be refused)")
            continue
        where = (
            located.root.path if located.relative == "." else located.root.path / located.relative
        )
        mode = "read-write" if located.root.writable else "read-only"
        out.append(
            f"{meaning} resolves to: {one_line(str(where))}"
            f"  (in {one_line(str(located.root.path))}, {mode})"
        )
    return out


def blob_head(pieces: Sequence[bytes | memoryview]) -> str:
    """The start of a blob as text (undecodable bytes shown as replacement marks)."""
    head = bytearray()
    for piece in pieces:
        head += bytes(piece[: BLOB_HEAD - len(head)])
        if len(head) >= BLOB_HEAD:
            break
    total = sum(len(piece) for piece in pieces)
    label = (
        f"blob, its first {len(head):,} of {total:,} bytes:"
        if total > len(head)
        else f"blob ({total:,} bytes):"
    )
    lines = head.decode("utf-8", "replace").split("\n")
    if lines[-1] == "":
        lines.pop()  # the text's own last newline
    return "\n".join([label, *(f"│ {line}" for line in lines)])


def one_line(text: str) -> str:
    """`text` kept on one line: its line breaks written as `\\n` and `\\r`."""
    return text.replace("\n", "\\n").replace("\r", "\\r")


async def identity(text: str, pieces: Sequence[bytes | memoryview]) -> str:
    """What makes two asks the same question: the text shown (which holds the whole
    args) and every byte of the blob. Computed here, never taken from the server (a
    server's digest could pair two different calls)."""

    def digest() -> str:
        hasher = blake3.blake3()
        encoded = text.encode("utf-8", "surrogatepass")
        hasher.update(len(encoded).to_bytes(8, "big"))
        hasher.update(encoded)
        for piece in pieces:
            hasher.update(piece)
        return hasher.hexdigest()

    if sum(len(piece) for piece in pieces) >= _HASH_IN_THREAD:
        return await asyncio.to_thread(digest)
    return digest()
