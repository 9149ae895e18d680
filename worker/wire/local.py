"""Request blobs handed from a hub to a worker in the same process (`agentworker up`)
by reference, not as BlobParts down their stream.

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
"""

from __future__ import annotations

from worker.wire.framing import Buffer


class LocalLink:
    def __init__(self) -> None:
        self._sessions: set[str] = set()
        self._blobs: dict[str, tuple[str, Buffer]] = {}  # call id -> (session id, blob)

    def attach(self, session_id: str) -> None:
        """The worker in this process opened this session (its Welcome said so)."""
        self._sessions.add(session_id)

    def detach(self, session_id: str) -> None:
        """The session ended: its blobs not taken go."""
        self._sessions.discard(session_id)
        for cid in [c for c, (s, _b) in self._blobs.items() if s == session_id]:
            del self._blobs[cid]

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

    @property
    def held(self) -> int:
        """Blobs handed and not taken (for tests)."""
        return len(self._blobs)
