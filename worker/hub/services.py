"""The hub's two gRPC services: ControlService, for callers (its requests read in
turns, bounded before they are parsed, refused with a reason when they do not decode;
a Dispatch read by gRPC as a unary call's while one of its unary reads is free) and
WorkerService.Stream, for workers; both hand what they read to worker.hub.server.Hub.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

import grpc
from google.protobuf.message import DecodeError

from worker.errors import WorkerError
from worker.hub import reads as read_bounds
from worker.hub.client import AWAITING_APPROVAL, UPLOAD_TAKEN
from worker.hub.enrolment import DecisionError
from worker.hub.envelopes import worker_envelope
from worker.hub.reads import CONTROL_READ_KIND, UnaryReads
from worker.hub.server import Hub, bad_id, error_result
from worker.hub.turns import Turns
from worker.wire.framing import (
    Buffer,
    field_spans,
    split_field,
    without_spans,
)
from worker.wire.inproc import LocalStreams
from worker.wire.proto import agentworker_pb2 as pb
from worker.wire.proto import agentworker_pb2_grpc as pb_grpc
from worker.wire.protocol import (
    MAX_ARGS_BYTES,
    WORKER_SERVICE,
)
from worker.wire.transport import MAX_MESSAGE_BYTES

log = logging.getLogger(__name__)


# The largest request each ControlService method takes, refused before it is decoded.
# gRPC's limit is the server's, MAX_MESSAGE_BYTES, which Dispatch needs for a 16 MiB
# blob; no other method carries one. RequestScope: a reason and a preview at their
# limits above (4 bytes a character in UTF-8 at most: 272 KiB), scopes and ids, with
# room; the others carry a few ids and a reason.
CONTROL_REQUEST_BYTES: Final = {
    "Dispatch": MAX_MESSAGE_BYTES,
    "DispatchUpload": MAX_MESSAGE_BYTES,  # each of its messages
    "RequestScope": 1024 * 1024,
}
CONTROL_REQUEST_BYTES_OTHERWISE: Final = 64 * 1024


class _WithBlob:
    """A DispatchRequest read without its blob, and the blob: a view of the received
    bytes (parsing the request and reading its blob field would copy it twice)."""

    def __init__(self, request: pb.DispatchRequest, blob: Buffer) -> None:
        self.request = request
        self.blob = blob


_DISPATCH_BLOB_FIELD = pb.DispatchRequest.DESCRIPTOR.fields_by_name["blob"].number


# What a DispatchRequest may carry besides its blob: args_json (MAX_ARGS_BYTES
# characters, 4 bytes each at most in UTF-8), ids and names, with room. More is refused
# before it is parsed: a request padded to 31 MiB with an unknown field was parsed with
# it and kept while the call was answered (sixteen at once took the hub to 640 MiB).
DISPATCH_BESIDES_BLOB_BYTES: Final = 4 * MAX_ARGS_BYTES + 64 * 1024
# The most fields a DispatchRequest is read with, a field at a time (it has 11).
DISPATCH_FIELDS: Final = 64


class _Refused:
    """What a control request refused unparsed is handed on as: a status and why."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        self.code, self.message = code, message


_UNDECODABLE_DISPATCH: Final = "DispatchRequest"


def _dispatch_request(data: bytes) -> object:
    """A DispatchRequest and its blob, a view of `data`: the request is parsed without
    the blob, once, and only when what it carries besides the blob is within
    DISPATCH_BESIDES_BLOB_BYTES (measured on the wire, before any copy). One that
    does not decode is not parsed again (it was, whole, blob and all)."""
    try:  # one walk of its fields: where its blob is, measured and split off below
        spans = field_spans(data, _DISPATCH_BLOB_FIELD, most=DISPATCH_FIELDS)
    except ValueError:  # not well framed, or too many fields for a DispatchRequest
        return _Undecodable(_UNDECODABLE_DISPATCH)
    besides = len(data) - sum(value_end - value_start for _, value_start, value_end in spans)
    if besides > DISPATCH_BESIDES_BLOB_BYTES:
        return _Refused(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"the Dispatch request carries {besides:,} bytes besides its blob, over the "
            f"{DISPATCH_BESIDES_BLOB_BYTES:,} a call's ids and args_json take (args_json: "
            f"{MAX_ARGS_BYTES:,} characters at most); bulk data goes in blob",
        )
    try:
        rest, blob = without_spans(data, spans)
        return _WithBlob(pb.DispatchRequest.FromString(rest), b"" if blob is None else blob)
    except (ValueError, DecodeError):
        return _Undecodable(_UNDECODABLE_DISPATCH)  # answered INVALID_ARGUMENT, as before


class _UploadPart:
    """A DispatchUploadPart read without its data, and the data: a view of the bytes
    received (as a Dispatch's blob is, `_WithBlob`)."""

    def __init__(self, header: pb.DispatchUploadPart, data: Buffer) -> None:
        self.header = header
        self.data = data


_UPLOAD_DATA_FIELD = pb.DispatchUploadPart.DESCRIPTOR.fields_by_name["data"].number
# What a part after the first may carry besides its data: its offset (a varint field).
UPLOAD_PART_BESIDES_DATA_BYTES: Final = 32
_UNDECODABLE_UPLOAD: Final = "DispatchUploadPart"


def _upload_part(data: bytes) -> object:
    """A DispatchUploadPart and its data, a view of `data`, read as `_dispatch_request`
    reads a Dispatch: what it carries besides its data is bounded before it is parsed."""
    try:
        rest, found = split_field(data, _UPLOAD_DATA_FIELD, most=DISPATCH_FIELDS)
    except ValueError:
        return _Undecodable(_UNDECODABLE_UPLOAD)
    if len(rest) > DISPATCH_BESIDES_BLOB_BYTES:
        return _Refused(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"a DispatchUpload message carries {len(rest):,} bytes besides its data, over "
            f"the {DISPATCH_BESIDES_BLOB_BYTES:,} a call's ids and args_json take",
        )
    try:
        header = pb.DispatchUploadPart.FromString(rest)
    except DecodeError:
        return _Undecodable(_UNDECODABLE_UPLOAD)
    if not header.HasField("request") and len(rest) > UPLOAD_PART_BESIDES_DATA_BYTES:
        # A part's data is kept as a view of its message while the call may be sent
        # again: padding beside one byte of data kept ~4 MiB alive a part (review13 01).
        return _Refused(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"a DispatchUpload part carries {len(rest):,} bytes besides its data, over the "
            f"{UPLOAD_PART_BESIDES_DATA_BYTES} its offset takes: after the call come only "
            "the blob's bytes (`data`, `offset`)",
        )
    return _UploadPart(header, b"" if found is None else found)


class _Undecodable:
    """What a control request that does not decode is handed on as."""

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name


class _Oversized:
    """What a control request larger than its method takes is handed on as."""

    def __init__(self, method: str, size: int, limit: int) -> None:
        self.method, self.size, self.limit = method, size, limit

    def message(self) -> str:
        return (
            f"the {self.method} request is {self.size:,} bytes, over the {self.limit:,} "
            f"that {self.method} takes (only Dispatch carries a blob); send less"
        )


def _bounded(method: str, parse: Callable[[bytes], object]) -> Callable[[bytes], object]:
    limit = CONTROL_REQUEST_BYTES.get(method, CONTROL_REQUEST_BYTES_OTHERWISE)

    def read(data: bytes) -> object:
        return _Oversized(method, len(data), limit) if len(data) > limit else parse(data)

    return read


def _lenient(message_type: Any) -> Callable[[bytes], object]:
    def parse(data: bytes) -> object:
        try:
            return message_type.FromString(data)
        except DecodeError:
            return _Undecodable(message_type.DESCRIPTOR.name)

    return parse


def _refusing_undecodable(
    behaviour: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]],
) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]:
    async def handle(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await _refuse_unread(request, context)
        return await behaviour(request, context)

    return handle


def _serialized(response: Any) -> bytes:
    """A response, unless it is serialized already (Dispatch's, see `Answer.response`)."""
    return response if isinstance(response, bytes) else bytes(response.SerializeToString())


def _read_in_turn(
    method: str,
    behaviour: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]],
    reads: Turns,
) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]:
    """A unary method served as a request-streaming one (the wire is the same), so
    that its request is read here, when `reads` gives its connection a turn, not by
    gRPC before the handler runs; its answer still goes out with its status, as a
    unary one's."""
    within_s = read_bounds.CONTROL_READ_WITHIN_S.get(
        method, read_bounds.CONTROL_READ_WITHIN_S_OTHERWISE
    )
    late = (
        f"the {method} request did not arrive within {within_s:g} s of its turn to be "
        "read; send the request whole when the call begins"
    )

    async def handle(_requests: Any, context: grpc.aio.ServicerContext) -> Any:
        async with reads.turn(context.peer()):
            try:
                async with asyncio.timeout(within_s):
                    request = await context.read()
            except TimeoutError:
                request = None
        if request is None:
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, late)
        if request is grpc.aio.EOF:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the call carried no request")
        try:
            return await behaviour(request, context)
        except grpc.aio.AbortError as exc:
            # A refusal (context.abort raises) would carry the frames that hold the
            # request on: they outlived the call, and sixteen refused 31 MiB Dispatches
            # kept the hub at 641 MiB; without them, 353.
            del request
            raise exc.with_traceback(None) from None

    return handle


def _upload_in_turn(
    hub: Hub, reads: Turns
) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]:
    """ControlService.DispatchUpload: its first message (the call and its blob's size)
    read as a Dispatch's request is (in a turn of Dispatch's, within its time), then
    its parts, in the same turn (let go once the last came), handed to the hub as it
    reads them (`Hub.dispatch_upload`)."""
    within_s = read_bounds.CONTROL_READ_WITHIN_S.get(
        "DispatchUpload", read_bounds.CONTROL_READ_WITHIN_S_OTHERWISE
    )
    late = (
        f"the DispatchUpload's first message did not arrive within {within_s:g} s of its "
        "turn to be read; send it when the call begins"
    )

    async def handle(_requests: Any, context: grpc.aio.ServicerContext) -> Any:
        async with contextlib.AsyncExitStack() as turn:
            await turn.enter_async_context(reads.turn(context.peer()))
            try:
                async with asyncio.timeout(within_s):
                    first = await context.read()
            except TimeoutError:
                await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, late)
            if first is grpc.aio.EOF:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the call carried no request")
            await _refuse_unread(first, context)
            assert isinstance(first, _UploadPart)
            header = first.header
            req = header.request
            if not header.HasField("request") or first.data or header.offset or req.blob:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "a DispatchUpload begins with its call (`request`, its blob empty) and "
                    "the blob's size (`blob_bytes`); the blob's bytes follow as `data`",
                )
            if not req.surface or not req.action:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT, "surface and action are required"
                )
            size = header.blob_bytes
            del first, header

            accepted = False

            async def next_part() -> tuple[int, Buffer] | None:
                nonlocal accepted
                if not accepted:  # the caller waits for this before it sends a part
                    accepted = True
                    await context.send_initial_metadata((UPLOAD_TAKEN,))
                part = await context.read()
                if part is grpc.aio.EOF:
                    await turn.aclose()  # every part came: the next upload's turn
                    return None
                if isinstance(part, _Refused):
                    raise WorkerError("validation_error", f"{part.message}; nothing was run")
                if not isinstance(part, _UploadPart) or part.header.HasField("request"):
                    raise WorkerError(
                        "validation_error",
                        "a DispatchUpload message after the first did not decode, or carried "
                        "a call again: after the call come only the blob's bytes (`data`, "
                        "`offset`); nothing was run",
                    )
                return part.header.offset, part.data

            try:
                return await hub.dispatch_upload(req, size, next_part)
            except LookupError as exc:
                await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
                raise  # unreachable: abort raises
            finally:
                hub.memory.ended(size)

    return handle


async def _refuse_unread(request: object, context: grpc.aio.ServicerContext) -> None:
    """Abort for a request refused as read (too large, or not decoding)."""
    if isinstance(request, _Oversized):
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, request.message())
    if isinstance(request, _Refused):
        await context.abort(request.code, request.message)
    if isinstance(request, _Undecodable):
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"the {request.type_name} does not decode: a string field is not valid "
            "UTF-8, or the message is truncated",
        )


class _UnaryRead:
    """A Dispatch's request deserializer while gRPC reads it as a unary call's, before
    the handler runs: it holds one of Dispatch's unary reads (`reads.UnaryReads`)
    until gRPC hands it the bytes, or until the call ends unread (the handler that
    holds it is let go then: a request that never came, or a caller that left)."""

    __slots__ = ("_parse", "_reads")

    def __init__(self, reads: UnaryReads, parse: Callable[[bytes], object]) -> None:
        self._reads: UnaryReads | None = reads
        self._parse = parse

    def __call__(self, data: bytes) -> object:
        self._let_go()
        return self._parse(data)

    def _let_go(self) -> None:
        reads, self._reads = self._reads, None
        if reads is not None:
            reads.give_back()

    def __del__(self) -> None:
        self._let_go()


class _ControlHandlers(grpc.GenericRpcHandler):  # type: ignore[misc]  # grpc is untyped
    """ControlService's methods, a Dispatch served as a unary call while one of its
    unary reads is free (gRPC reads its request before the handler runs: cheaper for
    gRPC than a request read by the handler, some 20 us of the hub's ~300 a call at 64
    in flight), else read in its turn as every other request is (`_read_in_turn`)."""

    def __init__(
        self,
        routes: grpc.GenericRpcHandler,
        dispatch: str,
        behaviour: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]],
        parse: Callable[[bytes], object],
        reads: UnaryReads,
    ) -> None:
        self._routes, self._dispatch, self._reads = routes, dispatch, reads
        self._behaviour, self._parse = behaviour, parse

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        if details.method == self._dispatch and self._reads.take():
            return grpc.unary_unary_rpc_method_handler(
                self._behaviour,
                request_deserializer=_UnaryRead(self._reads, self._parse),
                response_serializer=_serialized,
            )
        return self._routes.service(details)


def _unary_refusals(
    behaviour: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]],
) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]:
    """`behaviour` of a request gRPC read itself, whose refusal leaves no frame holding
    the request (as `_read_in_turn`'s)."""

    async def handle(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await behaviour(request, context)
        except grpc.aio.AbortError as exc:
            del request
            raise exc.with_traceback(None) from None

    return handle


def control_service(hub: Hub) -> grpc.GenericRpcHandler:
    """ControlService, whose requests are decoded so that one which does not decode
    (invalid UTF-8 in a string field, say) answers INVALID_ARGUMENT with the reason,
    not UNKNOWN with a traceback in the hub's log; one larger than its method takes
    (CONTROL_REQUEST_BYTES) answers RESOURCE_EXHAUSTED undecoded. Requests are read a
    few at a time (CONTROL_READS_AT_ONCE, `hub.reads`)."""
    servicer = ControlServicer(hub)
    service = pb.DESCRIPTOR.services_by_name["ControlService"]
    parsers = {"Dispatch": _dispatch_request, "DispatchUpload": _upload_part}
    handlers = {
        method.name: grpc.stream_unary_rpc_method_handler(
            _upload_in_turn(hub, hub.reads[CONTROL_READ_KIND[method.name]])
            if method.name == "DispatchUpload"
            else _read_in_turn(
                method.name,
                _refusing_undecodable(getattr(servicer, method.name)),
                hub.reads[CONTROL_READ_KIND.get(method.name, "")],
            ),
            request_deserializer=_bounded(
                method.name,
                parsers.get(method.name) or _lenient(getattr(pb, method.input_type.name)),
            ),
            response_serializer=_serialized,
        )
        for method in service.methods
    }
    routes = grpc.method_handlers_generic_handler(service.full_name, handlers)
    return _ControlHandlers(
        routes,
        f"/{service.full_name}/Dispatch",
        _unary_refusals(_refusing_undecodable(servicer.Dispatch)),
        _bounded("Dispatch", _dispatch_request),
        hub.unary_reads,
    )


def worker_service(hub: Hub) -> grpc.GenericRpcHandler:
    """WorkerService.Stream, answering with envelopes the hub serialized itself (see
    framing.py), so the generated servicer's serializer is left out."""
    handler = grpc.stream_stream_rpc_method_handler(
        hub.stream,
        request_deserializer=worker_envelope,
        response_serializer=None,  # already bytes
    )
    return grpc.method_handlers_generic_handler(WORKER_SERVICE, {"Stream": handler})


def local_streams(hub: Hub) -> LocalStreams:
    """WorkerService.Stream for a worker in this process (`up`), without gRPC: the same
    handler, reading the same bytes (worker.wire.inproc)."""
    return LocalStreams(hub.stream, worker_envelope)


class ControlServicer(pb_grpc.ControlServiceServicer):
    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        # Dispatch headers being sent (AWAITING_APPROVAL), each kept until it ends.
        self._headers_sending: set[asyncio.Future[None]] = set()

    async def Dispatch(  # noqa: N802
        self, request: pb.DispatchRequest | _WithBlob, context: grpc.aio.ServicerContext
    ) -> bytes:
        blob = None
        if isinstance(request, _WithBlob):  # as control_service reads it
            request, blob = request.request, request.blob
        if not request.surface or not request.action:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "surface and action are required")
        moved = len(blob) if blob is not None else len(request.blob)
        waiting = _WaitingHeaders(context, self._headers_sending)
        try:
            response = await self.hub.dispatch_serialized(request, blob, waiting.tell)
            moved = max(moved, len(response))
            await waiting.sent()
            return response
        except LookupError as exc:
            await waiting.sent()
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
            raise  # unreachable: abort raises
        finally:
            self.hub.memory.ended(moved)

    async def ListWorkers(  # noqa: N802
        self, request: pb.ListWorkersRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListWorkersResponse:
        return pb.ListWorkersResponse(workers=self.hub.worker_infos())

    async def Status(  # noqa: N802
        self, request: pb.StatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.StatusResponse:
        return self.hub.status()

    async def RequestScope(  # noqa: N802
        self, request: pb.RequestScopeRequest, context: grpc.aio.ServicerContext
    ) -> pb.ScopeDecision:
        try:
            return await self.hub.request_scope(request)
        except LookupError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
            raise

    async def KillPlan(  # noqa: N802
        self, request: pb.KillPlanRequest, context: grpc.aio.ServicerContext
    ) -> pb.KillPlanResponse:
        if not request.plan_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "plan_id is required")
        refused = bad_id("the kill", request, "plan_id")
        if refused is not None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, refused.message)
        try:
            return self.hub.kill_plan(request)
        except LookupError as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
            raise  # unreachable: abort raises

    async def DecideWorker(  # noqa: N802
        self, request: pb.DecideWorkerRequest, context: grpc.aio.ServicerContext
    ) -> pb.DecideWorkerResponse:
        try:
            return self.hub.decide_worker(request)
        except DecisionError as exc:
            code = grpc.StatusCode.NOT_FOUND if exc.not_found else grpc.StatusCode.INVALID_ARGUMENT
            await context.abort(code, exc.why)
            raise  # unreachable: abort raises

    async def Teardown(  # noqa: N802
        self, request: pb.TeardownRequest, context: grpc.aio.ServicerContext
    ) -> pb.DispatchResponse:
        try:
            return await self.hub.teardown(request)
        except WorkerError as exc:
            return pb.DispatchResponse(worker_id=request.worker_id, result=error_result("", exc))


class _WaitingHeaders:
    """What tells a Dispatch's caller that its call waits for the person's approval:
    Dispatch's headers, sent ahead of its answer, at most once (`tell`). The answer goes
    only once they are out (`sent`): gRPC marks headers sent when their send is done, and
    an answer sent while they were on their way carried them a second time, which gRPC
    refuses (GRPC_CALL_ERROR_TOO_MANY_OPERATIONS) after the answer's status was taken
    for sent; the caller then waited out its deadline. An answer that went first carried
    them already, and sending them then fails, harmlessly."""

    def __init__(
        self, context: grpc.aio.ServicerContext, sending: set[asyncio.Future[None]]
    ) -> None:
        self._context = context
        self._sending = sending  # the servicer's: each send kept until it ends
        self._sent: asyncio.Future[None] | None = None

    def tell(self) -> None:
        if self._sent is None:
            sent = asyncio.ensure_future(self._context.send_initial_metadata((AWAITING_APPROVAL,)))
            self._sending.add(sent)
            sent.add_done_callback(_headers_sent(self._sending))
            self._sent = sent

    async def sent(self) -> None:
        """Once the headers told are out, or failed (never raises: `_headers_sent`
        reads the outcome)."""
        if self._sent is not None:
            await asyncio.wait((self._sent,))


def _headers_sent(sending: set[asyncio.Future[None]]) -> Callable[[asyncio.Future[None]], None]:
    def ended(sent: asyncio.Future[None]) -> None:
        sending.discard(sent)
        if not sent.cancelled():
            sent.exception()  # read: an answer went first, or the caller left

    return ended
