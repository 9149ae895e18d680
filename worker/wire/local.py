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
(announcing `blob_in_parts`, as after parts), and the worker holds the handed blob to
the bounds parts are held to (`worker.core.blob_parts`). The request goes at once,
without its digest: the hub hashes every byte in a thread meanwhile and hands the
digest over too (`digest`), once the call is recorded in its store, so the worker may
start the call (an fs_write writes its temporary file) while the hub hashes, claims it
only once the digest came, and answers nothing the hub has not recorded. Should the
hub not record the call (its caller left), the digest never comes (`cancel`): the
worker then refuses the call, and nothing of it took effect. A session is local only
when the worker in this process says so, on the Welcome of a stream it opened
(`attach`): a worker elsewhere can never be handed anything, whatever id it claims.
What was handed and not taken goes when its call is answered or abandoned, or when the
stream ends (`drop`, `detach`).

A result goes the other way the same way (`HandedResult`) when it has a blob or is
large itself (`HAND_RESULT_BYTES`: fs_list's 10,000 entries are 1.5 MB of JSON): the
worker, once the result is recorded (or held, for an effect-free call), hands the
result's bytes (serialized as the ledger keeps them) and its blob over as it writes
the result down the stream without its `result_json` and blob, and the hub takes them
as it reads that result, before anything else sees it. Down the stream a 1 MiB blob
cost a copy into the result's envelope part, gRPC's copies on both sides and the
loopback's send, all on the one event loop, and a 1.5 MB listing the same plus a parse
in the hub; the hub now builds the caller's response and its stored row from the
handed bytes as they are. A result is told apart by its call, its invocation and its
error code (`result_key`): the worker's copies of one result (a replay of it, sent
again before the first was read) are the same, and a result without a blob that
shares its call and invocation (`blob_gone`) has another error code. The worker hands
only on a session this process attached, and writes the whole result down the stream
when the session is gone; what was handed and not taken goes when the hub ends the
session (`end`): the hub reads nothing of it after that. The worker's own end of the
session (`detach`) leaves them, as the hub may still read results already written.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Final

from worker.wire.framing import Buffer, result_part, split_field
from worker.wire.proto import agentworker_pb2 as pb

if TYPE_CHECKING:
    from sandbox import Arriving

# A result this large without its blob (serialized) goes to a hub in this process by
# reference, as a result with a blob always does; a smaller one is parsed quicker.
HAND_RESULT_BYTES: Final = 64 * 1024
_RESULT_JSON: Final = pb.ActionResult.DESCRIPTOR.fields_by_name["result_json"].number

# A result as the hub tells it apart: its call's id, its invocation's id, its error code.
ResultKey = tuple[str, str, str]


def result_key(result: pb.ActionResult) -> ResultKey:
    return (result.correlation_id, result.invocation.invocation_id, result.error.code)


def handed(result_bytes: bytes, blob: Buffer) -> bool:
    """Whether a result (serialized without its blob) and its blob go to a hub in this
    process by reference (`HandedResult`), rather than down the stream."""
    return bool(blob) or len(result_bytes) >= HAND_RESULT_BYTES


@dataclass(frozen=True, eq=False)
class HandedResult:
    """A result on its way to a hub in this process: `result` (serialized, without its
    blob) and `blob` by reference (`LocalLink.hand_result`), and down the stream the
    result without its `result_json` (`stub`), which the hub reads them by."""

    key: ResultKey
    result: bytes
    blob: Buffer

    def __len__(self) -> int:
        """What it may take on the wire: whole, should the hub be gone."""
        return len(self.result) + len(self.blob) + 32  # and the framing's tags and lengths

    @cached_property
    def stub(self) -> bytes:
        """The result without its `result_json` (serialized; small): its call, status,
        error and invocation, all the hub needs to read it by."""
        return split_field(self.result, _RESULT_JSON)[0]

    def part(self, handed: bool) -> bytes:
        """The result's envelope part: its stub once handed, else the whole result."""
        return result_part(self.stub) if handed else result_part(self.result, self.blob)


class LocalLink:
    def __init__(self) -> None:
        self._sessions: set[str] = set()
        self._blobs: dict[str, tuple[str, Buffer | Arriving]] = {}  # call id -> (session id, blob)
        # The digests on their way with handed blobs: call id -> (session id, future).
        self._digests: dict[str, tuple[str, asyncio.Future[str]]] = {}
        # The handed blobs' SHA-256 (hex), on its way the same way (`sha256`).
        self._sha256s: dict[str, tuple[str, asyncio.Future[str]]] = {}
        # Results handed to the hub and not read yet: (session id, result) -> results.
        self._results: dict[tuple[str, ResultKey], list[HandedResult]] = {}

    def attach(self, session_id: str) -> None:
        """The worker in this process opened this session (its Welcome said so)."""
        self._sessions.add(session_id)

    def detach(self, session_id: str) -> None:
        """The session ended: its request blobs not taken go, and nothing more is handed
        on it (results handed go with the hub's `end`)."""
        self._sessions.discard(session_id)
        for cid in [c for c, (s, _b) in self._blobs.items() if s == session_id]:
            del self._blobs[cid]
        for cid in [c for c, (s, _d) in self._digests.items() if s == session_id]:
            del self._digests[cid]
        for cid in [c for c, (s, _d) in self._sha256s.items() if s == session_id]:
            del self._sha256s[cid]

    def end(self, session_id: str) -> None:
        """The hub reads no more of the session: everything of it not taken goes."""
        self.detach(session_id)
        for key in [k for k in self._results if k[0] == session_id]:
            del self._results[key]

    def local(self, session_id: str) -> bool:
        return session_id in self._sessions

    def put(
        self,
        session_id: str,
        correlation_id: str,
        blob: Buffer | Arriving,
        digest: asyncio.Future[str] | None = None,
        sha256: asyncio.Future[str] | None = None,
    ) -> None:
        """Hand `blob` to the worker of a local session, for the request that follows;
        with `digest`, that request carries none: the call's digest comes by it. With
        `sha256`, the blob's SHA-256 (hex) comes by it too, as soon as the hub has it
        (before the digest, which is made from it): fs_write's answer gives it, and the
        hub's hash of the very bytes handed spares the worker a second pass over them.
        `blob` may be still coming (sandbox.Arriving, a DispatchUpload's): the worker
        takes it as one part, which its call reads as it comes."""
        if session_id in self._sessions:
            self._blobs[correlation_id] = (session_id, blob)
            if digest is not None:
                self._digests[correlation_id] = (session_id, digest)
            if sha256 is not None:
                self._sha256s[correlation_id] = (session_id, sha256)

    def take(self, session_id: str, correlation_id: str) -> Buffer | Arriving | None:
        """The blob handed for this call on this session, once; None if none was."""
        handed = self._blobs.get(correlation_id)
        if handed is None or handed[0] != session_id:
            return None
        del self._blobs[correlation_id]
        return handed[1]

    def take_digest(self, session_id: str, correlation_id: str) -> asyncio.Future[str] | None:
        """The digest handed with this call's blob on this session, once: a future the
        hub resolves once it recorded the call (or cancels when it will not); None if
        the request carries its digest."""
        handed = self._digests.get(correlation_id)
        if handed is None or handed[0] != session_id:
            return None
        del self._digests[correlation_id]
        return handed[1]

    def take_sha256(self, session_id: str, correlation_id: str) -> asyncio.Future[str] | None:
        """The SHA-256 handed with this call's blob on this session, once (a future the
        hub resolves once it hashed the blob); None if none was."""
        handed = self._sha256s.get(correlation_id)
        if handed is None or handed[0] != session_id:
            return None
        del self._sha256s[correlation_id]
        return handed[1]

    def drop(self, correlation_id: str) -> None:
        self._blobs.pop(correlation_id, None)
        self._digests.pop(correlation_id, None)
        self._sha256s.pop(correlation_id, None)

    def hand_result(self, session_id: str, result: HandedResult) -> bool:
        """Hand the hub the result about to be written on a local session as its stub;
        False (nothing kept) when the session is not local (any more): the result then
        goes down the stream whole."""
        if session_id not in self._sessions:
            return False
        self._results.setdefault((session_id, result.key), []).append(result)
        return True

    @property
    def results_held(self) -> bool:
        """Whether any handed result waits to be taken."""
        return bool(self._results)

    def take_result(self, session_id: str, key: ResultKey) -> HandedResult | None:
        """The result handed for this stub on this session (once for each time it was
        handed); None if none was."""
        handed = self._results.get((session_id, key))
        if handed is None:
            return None
        result = handed.pop(0)
        if not handed:
            del self._results[(session_id, key)]
        return result

    @property
    def held(self) -> int:
        """Blobs handed and not taken, both ways (for tests)."""
        return (
            len(self._blobs)
            + len(self._digests)
            + len(self._sha256s)
            + sum(len(blobs) for blobs in self._results.values())
        )
