"""A caller's connection to a hub's ControlService (the CLI, tests, benchmarks)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import grpc

from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.transport import Keepalive, bearer, open_channel, read_token
from worker.wire.varint import field_head

if TYPE_CHECKING:  # `agentworker call` imports this module: no pydantic on its path
    from collections.abc import Awaitable

    from worker.config import Config, Paths
    from worker.wire.proto import agentworker_pb2_grpc as pb_grpc

# Dispatch's method path, from the service's descriptor: `agentworker call` sends
# its one call without the generated stub module (1 ms of its start: it loads
# grpc._utilities to check gRPC's version), which the other methods load on first use.
_SERVICE = pb.DESCRIPTOR.services_by_name["ControlService"].full_name
_DISPATCH = f"/{_SERVICE}/Dispatch"
_UPLOAD = f"/{_SERVICE}/DispatchUpload"
_BLOB_FIELD = pb.DispatchRequest.DESCRIPTOR.fields_by_name["blob"].number
_DATA_FIELD = pb.DispatchUploadPart.DESCRIPTOR.fields_by_name["data"].number

# A blob larger than this goes up a DispatchUpload, in parts of UPLOAD_PART_BYTES: the
# hub relays each part to the worker as it comes, so the blob's way to the hub, its
# relay and the worker's write overlap (a 16 MiB fs_write). A smaller one goes whole,
# in a Dispatch (the hub's parts to a worker are of a MiB: a blob of one part gains
# nothing).
UPLOAD_BYTES = 1024 * 1024
UPLOAD_PART_BYTES = 1024 * 1024
# The header a hub sends once it takes an upload's parts (its admission passed): a
# caller sends none before (a refusal, or a hub without DispatchUpload, ends the call
# with no such header, and a part sent meanwhile would fail at the caller's end, which
# gRPC then gives for the call's status).
UPLOAD_TAKEN = ("agentworker-upload", "send-parts")
# Dispatch's headers, sent before its answer while the worker's person is asked to
# approve the call (ActionAck.AWAITING_APPROVAL): the caller may be that person.
AWAITING_APPROVAL = ("agentworker-waiting", "approval")


def dispatch_bytes(fields: dict[str, Any]) -> bytes:
    """`pb.DispatchRequest(**fields)` serialized, its blob (bytes or a view) written
    apart: the request's other fields through protobuf, then the blob's tag, length
    and bytes joined to them, one copy. Through protobuf a blob is copied into the
    message and again by its encoder: a 16 MiB fs_write's request took 15 ms to
    serialize where this takes 4 (at load 7). The bytes parse as the same message
    (a field's place in it does not matter)."""
    blob = fields.get("blob", b"")
    head = pb.DispatchRequest(**{k: v for k, v in fields.items() if k != "blob"})
    size = memoryview(blob).nbytes
    if not size:
        return head.SerializeToString()
    return b"".join((head.SerializeToString(), field_head(_BLOB_FIELD, size), blob))


def upload_part(offset: int, data: bytes | memoryview) -> bytes:
    """A DispatchUploadPart of `data` (the blob's bytes from `offset`), serialized: its
    data joined to the rest in one copy (as `dispatch_bytes` joins a blob)."""
    head = pb.DispatchUploadPart(offset=offset).SerializeToString()
    return b"".join((head, field_head(_DATA_FIELD, memoryview(data).nbytes), data))


class ControlClient:
    """A channel and the bearer metadata every call carries; `dispatch` for Dispatch,
    `stub` for the rest. A plain class, not a dataclass: see worker.paths."""

    def __init__(self, channel: grpc.aio.Channel, metadata: tuple[tuple[str, str], ...]) -> None:
        self.channel = channel
        self.metadata = metadata
        self._stub: pb_grpc.ControlServiceStub | None = None
        # As the generated stub makes it (a registered method: no per-call lookup), but
        # for requests serialized already (`dispatch_bytes`).
        self._dispatch = channel.unary_unary(
            _DISPATCH,
            request_serializer=None,
            response_deserializer=pb.DispatchResponse.FromString,
            _registered_method=True,
        )
        self._upload = channel.stream_unary(
            _UPLOAD,
            request_serializer=None,
            response_deserializer=pb.DispatchResponse.FromString,
            _registered_method=True,
        )
        # Dispatch called as a stream of one request: the same bytes on the wire, but
        # gRPC's unary call reads the hub's headers only with the answer, and the
        # caller of `begin_dispatch(headers_early=True)` reads them before it.
        self._dispatch_headed = channel.stream_unary(
            _DISPATCH,
            request_serializer=None,
            response_deserializer=pb.DispatchResponse.FromString,
        )
        # False once the hub said it has no DispatchUpload (one older than it).
        self.uploads = True

    @classmethod
    def connect(
        cls, address: str, token: str, tls_ca: Any = None, keepalive: Keepalive = Keepalive()
    ) -> ControlClient:
        return cls(open_channel(address, keepalive, tls_ca), bearer(token))

    @property
    def stub(self) -> pb_grpc.ControlServiceStub:
        """The generated stub, made on first use."""
        if self._stub is None:
            from worker.wire.proto import agentworker_pb2_grpc as pb_grpc

            self._stub = pb_grpc.ControlServiceStub(self.channel)
        return self._stub

    @classmethod
    def local(
        cls, paths: Paths, config: Config, server: str | None = None, token: str | None = None
    ) -> ControlClient:
        """This machine's hub unless told otherwise, token from the config dir: on its
        Unix socket, or its port once the kernel says the listener is this user's
        (worker.wire.own_hub; NotYourHubError otherwise, and nothing is sent). A
        `server` that is not `[hub] listen` is dialled as named, with the `token`
        given: this machine's hub.token goes to no other (TokenNotSentError)."""
        if server and server != config.hub.listen:
            if not token:
                from worker.errors import TokenNotSentError

                raise TokenNotSentError(
                    f"{server} is not this machine's hub ({config.hub.listen}), and this "
                    "machine's hub.token goes to no other: give the token of that hub"
                )
            return cls.connect(server, token, config.worker.tls_ca)
        token = token or read_token(paths.token_file)
        from worker.wire.own_hub import OwnHub

        dial = OwnHub(paths.hub_socket, config.hub.listen).dial()
        return cls.connect(dial.target, token, None if dial.local_socket else config.worker.tls_ca)

    async def close(self) -> None:
        await self.channel.close()

    async def dispatch(self, **fields: Any) -> pb.DispatchResponse:
        """One Dispatch of a request with these fields (a large blob is best passed as
        bytes or a view of them: it is copied once, see `dispatch_bytes`)."""
        response: pb.DispatchResponse = await self.begin_dispatch(**fields)
        return response

    def begin_dispatch(
        self, *, headers_early: bool = False, **fields: Any
    ) -> Awaitable[pb.DispatchResponse]:
        """`dispatch`, begun: awaiting what this returns answers the DispatchResponse.
        gRPC's call, not a coroutine: it goes out when the loop next turns, awaited
        or not (`agentworker call` loads json while it is out). `headers_early`: a call
        whose `initial_metadata()` comes as the hub sends it (AWAITING_APPROVAL)."""
        timeout = fields.get("timeout_ms", 0) / 1000 + 30 if fields.get("timeout_ms") else None
        if self.uploads and memoryview(fields.get("blob", b"")).nbytes > UPLOAD_BYTES:
            return asyncio.ensure_future(self._uploaded(fields, timeout))
        if headers_early:
            headed: Awaitable[pb.DispatchResponse] = self._dispatch_headed(
                iter((dispatch_bytes(fields),)), metadata=self.metadata, timeout=timeout
            )
            return headed
        call: Awaitable[pb.DispatchResponse] = self._dispatch(
            dispatch_bytes(fields), metadata=self.metadata, timeout=timeout
        )
        return call

    async def _uploaded(self, fields: dict[str, Any], deadline_s: float | None) -> Any:
        """The call, its blob sent up a DispatchUpload a part at a time; through a
        Dispatch to a hub that has no DispatchUpload."""
        blob = memoryview(fields["blob"]).cast("B")
        size = blob.nbytes
        call = self._upload(metadata=self.metadata, timeout=deadline_s)
        accepted = False  # the hub asked for the parts
        try:
            request = pb.DispatchRequest(**{k: v for k, v in fields.items() if k != "blob"})
            await call.write(
                pb.DispatchUploadPart(request=request, blob_bytes=size).SerializeToString()
            )
            # The hub's headers say it takes the parts; an answer instead (a refusal: too
            # large, busy; or no DispatchUpload at all) comes before any is sent.
            accepted = UPLOAD_TAKEN in tuple(await call.initial_metadata() or ())
            for at in range(0, size if accepted else 0, UPLOAD_PART_BYTES):
                await call.write(upload_part(at, blob[at : at + UPLOAD_PART_BYTES]))
            await call.done_writing()
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            # Before the hub asked for parts: it ended the call unread (it has no
            # DispatchUpload, or refused the token), and gRPC may give the failed send
            # for its status. Nothing of the call ran: a Dispatch says which.
            if not accepted and not call.done():
                return await self._dispatched(fields, deadline_s)
        try:
            return await call
        except grpc.aio.AioRpcError as exc:
            if accepted or exc.code() not in (
                grpc.StatusCode.UNIMPLEMENTED,
                grpc.StatusCode.INTERNAL,  # a send that failed, as above
            ):
                raise
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                self.uploads = False  # a hub from before DispatchUpload
        return await self._dispatched(fields, deadline_s)

    async def _dispatched(self, fields: dict[str, Any], deadline_s: float | None) -> Any:
        return await self._dispatch(
            dispatch_bytes(fields), metadata=self.metadata, timeout=deadline_s
        )


def result_to_dict(response: pb.DispatchResponse) -> dict[str, Any]:
    """What `agentworker call` prints: result and error decoded, the blob summarised."""
    import json  # here: `agentworker call` loads it while its Dispatch is out

    result = response.result
    out: dict[str, Any] = {
        "worker_id": response.worker_id,
        "correlation_id": result.correlation_id,
        "status": pb.ActionResult.Status.Name(result.status).lower(),
        "replayed": result.replayed,
    }
    if result.result_json:
        out["result"] = json.loads(result.result_json)
    if result.HasField("error"):
        out["error"] = {
            "code": result.error.code,
            "message": result.error.message,
            "details": json.loads(result.error.details_json or "{}"),
            "retryable": result.error.retryable,
        }
    if result.blob:
        out["blob_bytes"] = len(result.blob)
    if result.HasField("invocation"):
        # Field by field, not MessageToDict: that writes int64 as strings ("bytes_in": "13").
        invocation = result.invocation
        out["invocation"] = {
            f.name: getattr(invocation, f.name) for f in invocation.DESCRIPTOR.fields
        }
    return out
