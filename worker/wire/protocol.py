"""Facts both ends of the stream must agree on."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Final, Protocol, TypeVar

import blake3

import worker
from worker.errors import WorkerError
from worker.wire.proto import agentworker_pb2 as pb

_WORKER_SERVICE: Final = pb.DESCRIPTOR.services_by_name["WorkerService"]
WORKER_SERVICE: Final = _WORKER_SERVICE.full_name
STREAM_METHOD: Final = f"/{WORKER_SERVICE}/{_WORKER_SERVICE.methods_by_name['Stream'].name}"

# Sandbox mode's surface: a plan's calls go to the worker holding its workspace.
WORKBENCH_SURFACE: Final = "workbenchHost"

PROTOCOL_MIN: Final = 1
# 2: a hub may send a large request blob ahead of its request, in BlobParts.
# 3: or the request first, its blob's parts after it, and its digest last
# (`ActionRequest.parts_follow`, `BlobPart.args_digest`).
# 4: a kill may name its plan by digest (`KillPlan.plan_digest`; see plan_digest).
PROTOCOL_MAX: Final = 4
PARTS_PROTOCOL: Final = 2
FOLLOW_PROTOCOL: Final = 3
DIGEST_KILL_PROTOCOL: Final = 4
# A server that refuses a stream busy (RESOURCE_EXHAUSTED) may say in the trailing
# metadata how long to wait before the next dial, in milliseconds (the reference hub's
# reconnect bounds, worker.hub.hellos.Hellos); the worker waits at least that.
RETRY_AFTER_KEY: Final = "retry-after-ms"
# A Hello the hub does not serve (PERMISSION_DENIED) says why in the trailing metadata
# (worker.hub.admission): "pending" (its operator has not accepted this worker yet) and
# "forgotten" are tried again, as the operator may accept it meanwhile; "refused",
# "key_mismatch" and "no_key" stop the worker.
ENROLMENT_KEY: Final = "agentworker-enrolment"
ENROLMENT_RETRIED: Final = frozenset({"pending", "forgotten"})


VERSION: Final = worker.__version__


# A blob at least this large is hashed in a thread, never on the event loop
# (BLAKE3 runs at about 4 GB/s here, and releases the GIL).
HASH_OFF_LOOP_BYTES: Final = 256 * 1024
# What a digest starts with: how it was made. Today's are of two schemes: BLAKE3 over
# the call's fields and every byte of its blob (`call_digest`), and, for a blob the hub
# hands to the worker of its own process, BLAKE3 over the fields and the blob's SHA-256
# (`digest_of_sha256`). A digest without a scheme was written by a version that hashed
# with sha256 alone (see `same_call`).
DIGEST_SCHEME: Final = "blake3:"
SHA256_SCHEME: Final = "blake3+sha256:"
# A carried digest longer than this is ignored (the worker computes its own).
MAX_DIGEST_CHARS: Final = 128


def call_digest(req: pb.ActionRequest, blob: bytes | memoryview | None = None) -> str:
    """What makes two deliveries of one correlation id 'the same call'; `blob`, when
    given, stands for the request's own (kept apart from it).

    It covers the whole call (every field that says what to do, and every byte of the
    blob): a digest over a prefix and the length would let a re-used id with a
    different write of the same size answer with the old write's result. It is
    computed once, where the call enters (the hub's Dispatch), and carried in
    `ActionRequest.args_digest`; the worker takes it from there (docs/architecture.md,
    "Blobs").

    The hash is BLAKE3 (256 bits, like sha256, and 3.6x its speed here: 4 ms for a
    16 MiB blob where sha256 took 14.6 ms)."""
    return DIGEST_SCHEME + _fed(blake3.blake3(), req, blob).hexdigest()


def digest_feed(req: pb.ActionRequest) -> blake3.blake3:
    """`call_digest` a piece at a time: a hasher fed the call's fields; feed it every
    byte of the blob, in order, then `fed_digest` gives the same digest."""
    return _fields_fed(blake3.blake3(), req)


def fed_digest(hasher: blake3.blake3) -> str:
    return DIGEST_SCHEME + hasher.hexdigest()


def blob_sha256(blob: bytes | memoryview) -> bytes:
    """The blob's SHA-256, from which `digest_of_sha256` makes the call's digest."""
    return hashlib.sha256(blob).digest()


def digest_of_sha256(req: pb.ActionRequest, sha256: bytes) -> str:
    """The call's digest made from its blob's SHA-256 (`blob_sha256`): BLAKE3 over its
    fields, as `call_digest` hashes them, and that hash. It covers every byte of the blob
    as `call_digest` does (through SHA-256, as collision-resistant as the digest).

    The hub uses it for a blob it hands to the worker of its own process (`up`,
    worker.wire.local), and hands the SHA-256 over too: fs_write answers with the
    SHA-256 of what it wrote, and those are the very bytes, so one pass over a 16 MiB
    blob serves both, where BLAKE3 over the blob (2.2 ms) and SHA-256 over it again in
    the worker (8-9 ms) took two."""
    hasher = _fields_fed(blake3.blake3(), req)
    hasher.update(b"sha256\x00")
    hasher.update(sha256)
    return SHA256_SCHEME + hasher.hexdigest()


def digest_as(recorded: str, req: pb.ActionRequest, blob: bytes | memoryview | None) -> str:
    """The digest of `req` with `blob` in the scheme `recorded` was made in: one of
    today's two, or, for a digest without a scheme (recorded by a version before
    BLAKE3), sha256 over the fields and the blob."""
    if recorded.startswith(SHA256_SCHEME):
        return digest_of_sha256(req, blob_sha256(req.blob if blob is None else blob))
    if recorded.startswith(DIGEST_SCHEME):
        return call_digest(req, blob)
    return _fed(hashlib.sha256(), req, blob).hexdigest()


class _Hasher(Protocol):
    def update(self, data: bytes | memoryview, /) -> object: ...

    def hexdigest(self) -> str: ...


_H = TypeVar("_H", bound=_Hasher)


def _fed(h: _H, req: pb.ActionRequest, blob: bytes | memoryview | None) -> _H:
    """`h` given what makes a call that call: its fields, each ended by a NUL, then
    every byte of its blob."""
    _fields_fed(h, req).update(req.blob if blob is None else blob)
    return h


def _fields_fed(h: _H, req: pb.ActionRequest) -> _H:
    # One text encoded and fed once (ten updates and five encodes were ~2 us of a
    # call's): UTF-8 encodes each code point alone, a lone surrogate too
    # (surrogatepass), so the bytes are each field's, each ended by a NUL.
    fields = (req.surface, req.action, req.plan_id, req.agent_id, req.args_json, "")
    h.update("\x00".join(fields).encode("utf-8", "surrogatepass"))
    return h


def _age(digest: str) -> int:
    """How recent a digest's scheme is: 2 BLAKE3 over the blob's SHA-256 (the newest),
    1 BLAKE3 over the blob, 0 none (sha256 alone, by a version before BLAKE3)."""
    if digest.startswith(SHA256_SCHEME):
        return 2
    return 1 if digest.startswith(DIGEST_SCHEME) else 0


def same_call(recorded: str, delivered: str, recompute: Callable[[], str] | None = None) -> bool:
    """Whether a delivery's digest names the call recorded under its correlation id.

    Digests of one scheme name the same call only when equal. Of two schemes, where
    the call itself is at hand (the hub has it), the delivered call is hashed again in
    the recorded digest's scheme (`recompute()`, `digest_as`) and compared. Where only
    its digest is (the worker's ledger), a call recorded in an older scheme than the
    delivered one (by an earlier version, in flight across the upgrade) is taken as the
    same call: a false mismatch would make the caller run it again under a new id, which
    correlation ids exist to prevent, and the id alone still decides that nothing runs
    twice. Rows age out within a day. The hub sends a call again under the digest it
    recorded it with, so a worker meets one id under two schemes only across an
    upgrade; one recorded in a newer scheme than the delivered matches nothing else."""
    if recorded == delivered:
        return True
    if not schemes_differ(recorded, delivered):
        return False
    if recompute is not None:
        return recorded == recompute()
    return _age(recorded) < _age(delivered)


def schemes_differ(recorded: str, delivered: str) -> bool:
    """Whether two digests are of different schemes (see `same_call`)."""
    return _age(recorded) != _age(delivered)


def carried_digest(req: pb.ActionRequest) -> str | None:
    """The digest the sender computed for this call, if it sent a usable one.

    The worker trusts it: the digest only decides whether a re-sent correlation id is
    "the same call" (answered from the ledger) or not (`args_mismatch`). A server that
    lied about it could only confuse the answers to its own calls; it could never make
    the worker run a call twice, which the correlation id alone decides."""
    digest = req.args_digest
    return digest if 0 < len(digest) <= MAX_DIGEST_CHARS else None


def blob_gone(result: pb.ActionResult, blob_bytes: int) -> pb.ActionResult:
    """The answer to a late duplicate of a finished call whose result is no longer kept
    whole: its blob was delivered and let go, or its secrets were delivered and are kept
    masked (`result.masked`: an http_fetch's Set-Cookie and token headers, review26 H7).
    The call's outcome as kept goes in the error's details, and a `blob_gone` error says
    what went and what to do; it is never answered as an ordinary result, where `***`
    would read as the values the server sent."""
    cid = result.correlation_id
    try:
        outcome: object = json.loads(result.result_json) if result.result_json else None
    except ValueError:
        outcome = result.result_json
    masked = result.masked
    secrets = (
        "its secrets (response headers such as Set-Cookie and tokens) were delivered and "
        "are kept masked, so this repeat carries its outcome (in details) with them shown "
        "as ***, not as they were"
    )
    if blob_bytes and masked:
        what = (
            f"its result's {blob_bytes:,}-byte blob was delivered and is no longer kept, "
            f"and {secrets}, without the bytes. To get the bytes and the secrets again"
        )
    elif masked:
        what = f"{secrets}. To get them again"
    else:
        what = (
            f"its result's {blob_bytes:,}-byte blob was delivered and is no longer kept, so "
            "this repeat carries its outcome (in details) without the bytes. To get the "
            "bytes again"
        )
    error = WorkerError(
        "blob_gone",
        f"call {cid} already ran and finished (ok); {what}, run the call under a new "
        "correlation id.",
        {"status": "ok", "result": outcome, "blob_bytes": blob_bytes, "masked": masked},
    )
    gone = pb.ActionResult(
        correlation_id=cid,
        status=pb.ActionResult.ERROR,
        error=error_pb(error),
        replayed=True,
    )
    if result.HasField("invocation"):
        gone.invocation.CopyFrom(result.invocation)
    return gone


def at_rest(result: pb.ActionResult) -> pb.ActionResult | None:
    """The result as it is kept once delivered (the server acked it; a caller has it):
    its `result_json` in its masked form, `result_json_at_rest` (an http_fetch's
    Set-Cookie and token headers: review25 G10); None when it has no such form and is
    kept as it is. The blob is not touched: each store lets it go on delivery."""
    if not result.result_json_at_rest:
        return None
    kept = pb.ActionResult()
    kept.CopyFrom(result)
    kept.result_json = kept.result_json_at_rest
    kept.ClearField("result_json_at_rest")
    kept.masked = True  # a repeat answers `blob_gone`, saying so (blob_gone)
    return kept


def for_caller(result: pb.ActionResult) -> pb.ActionResult:
    """The result as a caller gets it: whole, without the form it is kept in
    (`at_rest`), which is for stores only."""
    if not result.result_json_at_rest:
        return result
    whole = pb.ActionResult()
    whole.CopyFrom(result)
    whole.ClearField("result_json_at_rest")
    return whole


def result_gone(correlation_id: str) -> pb.ActionResult:
    """The answer to a late duplicate of a finished effect-free call whose result was
    too large to keep past its ack (worker.core.ledger.KEPT_RESULT_BYTES): a `blob_gone`
    error, as for a blob let go, saying the result went and what to do."""
    error = WorkerError(
        "blob_gone",
        f"call {correlation_id} already ran and finished (ok); its result was delivered, "
        "and being large it is no longer kept, so this repeat carries none. To get it "
        "again, run the call under a new correlation id.",
        {"status": "ok", "result": None},
    )
    return pb.ActionResult(
        correlation_id=correlation_id,
        status=pb.ActionResult.ERROR,
        error=error_pb(error),
        replayed=True,
    )


def stream_ended() -> WorkerError:
    """Why a call started before its blob and digest came (protocol 3, or handed inside
    `up`) stopped when its stream ended. Such a refusal is never sent (the worker's
    `pipeline._unsendable`): the hub sends the call again on the worker's next stream,
    and a refusal reaching it there would stand for that delivery, which runs."""
    return WorkerError(
        "cancelled",
        "the stream ended while the request's blob was still coming; nothing of it was "
        "run (the server sends it again)",
        {"stream_ended": True},
        retryable=True,
    )


def error_pb(error: WorkerError) -> pb.Error:
    """The error as it travels in an ActionResult."""
    return pb.Error(
        code=error.code,
        message=error.message,
        details_json=json.dumps(error.details, default=str),
        retryable=error.retryable,
    )


# The most bytes a call's blob may hold where its action caps it (DESIGN.md §4), by
# action name on the host surfaces: fs_write takes 16 MiB. The worker refuses more
# (`too_large`); the hub refuses a DispatchUpload that announces more before it reads
# any of its parts (`blob_cap`).
BLOB_CAPS: Final = {"fs_write": 16 * 1024 * 1024}
# What to do instead, said with a refusal past the cap.
BLOB_CAP_HINTS: Final = {"fs_write": "Write the first part, then append the rest in further calls."}


def blob_cap(surface: str, action: str) -> int | None:
    """The cap on a call's blob for this action (BLOB_CAPS), or None without one."""
    if surface in ("workerHost", WORKBENCH_SURFACE):
        return BLOB_CAPS.get(action)
    return None


# The longest deadline a call may have, at both ends (the most `[worker]` and `[hub]`
# default_timeout_s allow). A longer one — or a wrapped-around `timeout_ms` such as
# 2**32 - 1, which would be 49.7 days — is cut to this, with a line in the log.
MAX_TIMEOUT_MS: Final = 86_400_000
# A call's structured arguments (args_json, in characters) stay small, at both ends:
# bulk data travels in the request blob. The worker refuses more (`validation_error`);
# the hub refuses a Dispatch whose fields besides its blob pass what that allows.
MAX_ARGS_BYTES: Final = 1024 * 1024


def plan_digest(plan_id: str) -> int:
    """A plan id's digest, by which a kill kept without its plan's id names the plan
    (KillPlan.plan_digest; the worker's kills_apart, the hub's): 8 bytes of BLAKE2b,
    big-endian, as a signed 64-bit integer (SQLite's). A collision, 2**-64 a pair, can
    only refuse a plan, never let one run."""
    digest = hashlib.blake2b(plan_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)
