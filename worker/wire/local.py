"""Blobs handed between a hub and a worker in the same process (`agentworker up`) by
reference, not down their stream: a request's blob from the hub to the worker (not as
BlobParts), and a result's blob from the worker to the hub (not inside the result).

Down the stream a 16 MiB blob costs, with the GIL held: a copy into each part's
envelope, gRPC's copy of each part into its own buffer, the loopback's send, and
gRPC's copies of each part into the bytes the worker reads (about three): about
eight copies of the blob per call besides the caller's own, each one stalling the
one event loop that every other call of `up` waits on. Handed over, the worker gets
a view of the very bytes the hub received.

Only the bytes move this way: the request still goes down the stream after them
(announcing `blob_in_parts`, as after parts), with the digest the hub computed over
every byte, and the worker holds the handed blob to the bounds parts are held to
(`worker.core.blob_parts`). A session is local only when the worker in this process
says so, on the Welcome of a stream it opened (`attach`): a worker elsewhere can never
be handed anything, whatever id it claims. What was handed and not taken goes when
its call is answered or abandoned, or when the stream ends (`drop`, `detach`).

A result's blob goes the other way the same way (`HandedResult`): the worker, once the
result is recorded (or held, for an effect-free call), hands the blob over as it
writes the result down the stream without it, and the hub takes it as it reads that
result, before anything else sees it. Down the stream a 1 MiB blob cost a copy into
the result's envelope part, gRPC's copies on both sides and the loopback's send, all
on the one event loop. A result is told apart by its call, its invocation and its
error code (`result_key`): the worker's copies of one result (a replay of it, sent
again before the first was read) carry the same blob, and a result without a blob
that shares its call and invocation (`blob_gone`) has another error code. The worker
hands only on a session this process attached, and writes the blob inside the result
when the session is gone; what was handed and not taken goes when the hub ends the
session (`end`): the hub reads nothing of it after that. The worker's own end of the
session (`detach`) leaves them, as the hub may still read results already written.
"""

from __future__ import annotations

from dataclasses import dataclass

from worker.wire.framing import Buffer, result_part
from worker.wire.proto import agentworker_pb2 as pb

# A result as the hub tells it apart: its call's id, its invocation's id, its error code.
ResultKey = tuple[str, str, str]


def result_key(result: pb.ActionResult) -> ResultKey:
    return (result.correlation_id, result.invocation.invocation_id, result.error.code)


@dataclass(frozen=True, eq=False)
class HandedResult:
    """A result on its way to a hub in this process: `result` (serialized, without its
    blob) goes down the stream, `blob` by reference (`LocalLink.hand_result`)."""

    key: ResultKey
    result: bytes
    blob: bytes

    def __len__(self) -> int:
        """What it may take on the wire: with its blob, should the hub be gone."""
        return len(self.result) + len(self.blob) + 32  # and the framing's tags and lengths

    def part(self, handed: bool) -> bytes:
        """The result's envelope part: without its blob once handed, else with it."""
        return result_part(self.result, b"" if handed else self.blob)


class LocalLink:
    def __init__(self) -> None:
        self._sessions: set[str] = set()
        self._blobs: dict[str, tuple[str, Buffer]] = {}  # call id -> (session id, blob)
        # Result blobs handed to the hub and not read yet: (session id, result) -> blobs.
        self._results: dict[tuple[str, ResultKey], list[bytes]] = {}

    def attach(self, session_id: str) -> None:
        """The worker in this process opened this session (its Welcome said so)."""
        self._sessions.add(session_id)

    def detach(self, session_id: str) -> None:
        """The session ended: its request blobs not taken go, and nothing more is handed
        on it (results handed go with the hub's `end`)."""
        self._sessions.discard(session_id)
        for cid in [c for c, (s, _b) in self._blobs.items() if s == session_id]:
            del self._blobs[cid]

    def end(self, session_id: str) -> None:
        """The hub reads no more of the session: everything of it not taken goes."""
        self.detach(session_id)
        for key in [k for k in self._results if k[0] == session_id]:
            del self._results[key]

    def local(self, session_id: str) -> bool:
        return session_id in self._sessions

    def put(self, session_id: str, correlation_id: str, blob: Buffer) -> None:
        """Hand `blob` to the worker of a local session, for the request that follows."""
        if session_id in self._sessions:
            self._blobs[correlation_id] = (session_id, blob)

    def take(self, session_id: str, correlation_id: str) -> Buffer | None:
        """The blob handed for this call on this session, once; None if none was."""
        handed = self._blobs.get(correlation_id)
        if handed is None or handed[0] != session_id:
            return None
        del self._blobs[correlation_id]
        return handed[1]

    def drop(self, correlation_id: str) -> None:
        self._blobs.pop(correlation_id, None)

    def hand_result(self, session_id: str, key: ResultKey, blob: bytes) -> bool:
        """Hand the hub the blob of the result about to be written on a local session
        without it; False (nothing kept) when the session is not local (any more): the
        result then carries its blob."""
        if session_id not in self._sessions:
            return False
        self._results.setdefault((session_id, key), []).append(blob)
        return True

    @property
    def results_held(self) -> bool:
        """Whether any result blob waits to be taken."""
        return bool(self._results)

    def take_result(self, session_id: str, key: ResultKey) -> bytes | None:
        """The blob handed for this result on this session (once for each time it was
        handed); None if none was."""
        handed = self._results.get((session_id, key))
        if handed is None:
            return None
        blob = handed.pop(0)
        if not handed:
            del self._results[(session_id, key)]
        return blob

    @property
    def held(self) -> int:
        """Blobs handed and not taken, both ways (for tests)."""
        return len(self._blobs) + sum(len(blobs) for blobs in self._results.values())
