from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkerEnvelope(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[WorkerMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[WorkerMessage, _Mapping]]] = ...) -> None: ...

class WorkerMessage(_message.Message):
    __slots__ = ("hello", "ack", "result", "scope_decision", "heartbeat", "audit", "goodbye")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    SCOPE_DECISION_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    AUDIT_FIELD_NUMBER: _ClassVar[int]
    GOODBYE_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    ack: ActionAck
    result: ActionResult
    scope_decision: ScopeDecision
    heartbeat: Heartbeat
    audit: AuditEvent
    goodbye: Goodbye
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., ack: _Optional[_Union[ActionAck, _Mapping]] = ..., result: _Optional[_Union[ActionResult, _Mapping]] = ..., scope_decision: _Optional[_Union[ScopeDecision, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., audit: _Optional[_Union[AuditEvent, _Mapping]] = ..., goodbye: _Optional[_Union[Goodbye, _Mapping]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("worker_id", "instance_id", "version", "protocol_min", "protocol_max", "surfaces", "actions", "gui_available", "max_concurrency", "running_ids", "unacked_ids", "plans", "kills_epoch", "kills_through")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_MIN_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_MAX_FIELD_NUMBER: _ClassVar[int]
    SURFACES_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    GUI_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    RUNNING_IDS_FIELD_NUMBER: _ClassVar[int]
    UNACKED_IDS_FIELD_NUMBER: _ClassVar[int]
    PLANS_FIELD_NUMBER: _ClassVar[int]
    KILLS_EPOCH_FIELD_NUMBER: _ClassVar[int]
    KILLS_THROUGH_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    instance_id: str
    version: str
    protocol_min: int
    protocol_max: int
    surfaces: _containers.RepeatedScalarFieldContainer[str]
    actions: _containers.RepeatedScalarFieldContainer[str]
    gui_available: bool
    max_concurrency: int
    running_ids: _containers.RepeatedScalarFieldContainer[str]
    unacked_ids: _containers.RepeatedScalarFieldContainer[str]
    plans: _containers.RepeatedCompositeFieldContainer[HeldPlan]
    kills_epoch: str
    kills_through: int
    def __init__(self, worker_id: _Optional[str] = ..., instance_id: _Optional[str] = ..., version: _Optional[str] = ..., protocol_min: _Optional[int] = ..., protocol_max: _Optional[int] = ..., surfaces: _Optional[_Iterable[str]] = ..., actions: _Optional[_Iterable[str]] = ..., gui_available: _Optional[bool] = ..., max_concurrency: _Optional[int] = ..., running_ids: _Optional[_Iterable[str]] = ..., unacked_ids: _Optional[_Iterable[str]] = ..., plans: _Optional[_Iterable[_Union[HeldPlan, _Mapping]]] = ..., kills_epoch: _Optional[str] = ..., kills_through: _Optional[int] = ...) -> None: ...

class HeldPlan(_message.Message):
    __slots__ = ("plan_id", "last_used_unix_ms", "placement_token")
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_USED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    plan_id: str
    last_used_unix_ms: int
    placement_token: str
    def __init__(self, plan_id: _Optional[str] = ..., last_used_unix_ms: _Optional[int] = ..., placement_token: _Optional[str] = ...) -> None: ...

class ActionAck(_message.Message):
    __slots__ = ("correlation_ids", "kind", "message")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[ActionAck.Kind]
        STARTED: _ClassVar[ActionAck.Kind]
        DUPLICATE_RUNNING: _ClassVar[ActionAck.Kind]
        DUPLICATE_DONE: _ClassVar[ActionAck.Kind]
        REJECTED_DRAINING: _ClassVar[ActionAck.Kind]
        REJECTED_ARGS_MISMATCH: _ClassVar[ActionAck.Kind]
        AWAITING_APPROVAL: _ClassVar[ActionAck.Kind]
    KIND_UNSPECIFIED: ActionAck.Kind
    STARTED: ActionAck.Kind
    DUPLICATE_RUNNING: ActionAck.Kind
    DUPLICATE_DONE: ActionAck.Kind
    REJECTED_DRAINING: ActionAck.Kind
    REJECTED_ARGS_MISMATCH: ActionAck.Kind
    AWAITING_APPROVAL: ActionAck.Kind
    CORRELATION_IDS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    correlation_ids: _containers.RepeatedScalarFieldContainer[str]
    kind: ActionAck.Kind
    message: str
    def __init__(self, correlation_ids: _Optional[_Iterable[str]] = ..., kind: _Optional[_Union[ActionAck.Kind, str]] = ..., message: _Optional[str] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("code", "message", "details_json", "retryable")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_JSON_FIELD_NUMBER: _ClassVar[int]
    RETRYABLE_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    details_json: str
    retryable: bool
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ..., details_json: _Optional[str] = ..., retryable: _Optional[bool] = ...) -> None: ...

class Invocation(_message.Message):
    __slots__ = ("invocation_id", "correlation_id", "worker_id", "owner_user_id", "agent_id", "plan_id", "task_id", "surface", "action", "scope", "decision", "status", "error_code", "started_unix_ms", "finished_unix_ms", "duration_ms", "bytes_in", "bytes_out", "truncated", "sandboxed", "args_digest", "args_preview")
    INVOCATION_ID_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_USER_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    SURFACE_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    STARTED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    BYTES_IN_FIELD_NUMBER: _ClassVar[int]
    BYTES_OUT_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    SANDBOXED_FIELD_NUMBER: _ClassVar[int]
    ARGS_DIGEST_FIELD_NUMBER: _ClassVar[int]
    ARGS_PREVIEW_FIELD_NUMBER: _ClassVar[int]
    invocation_id: str
    correlation_id: str
    worker_id: str
    owner_user_id: str
    agent_id: str
    plan_id: str
    task_id: str
    surface: str
    action: str
    scope: str
    decision: str
    status: str
    error_code: str
    started_unix_ms: int
    finished_unix_ms: int
    duration_ms: int
    bytes_in: int
    bytes_out: int
    truncated: bool
    sandboxed: bool
    args_digest: str
    args_preview: str
    def __init__(self, invocation_id: _Optional[str] = ..., correlation_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., owner_user_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., plan_id: _Optional[str] = ..., task_id: _Optional[str] = ..., surface: _Optional[str] = ..., action: _Optional[str] = ..., scope: _Optional[str] = ..., decision: _Optional[str] = ..., status: _Optional[str] = ..., error_code: _Optional[str] = ..., started_unix_ms: _Optional[int] = ..., finished_unix_ms: _Optional[int] = ..., duration_ms: _Optional[int] = ..., bytes_in: _Optional[int] = ..., bytes_out: _Optional[int] = ..., truncated: _Optional[bool] = ..., sandboxed: _Optional[bool] = ..., args_digest: _Optional[str] = ..., args_preview: _Optional[str] = ...) -> None: ...

class ActionResult(_message.Message):
    __slots__ = ("correlation_id", "status", "result_json", "blob", "error", "invocation", "replayed", "result_json_at_rest", "masked")
    class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATUS_UNSPECIFIED: _ClassVar[ActionResult.Status]
        OK: _ClassVar[ActionResult.Status]
        ERROR: _ClassVar[ActionResult.Status]
    STATUS_UNSPECIFIED: ActionResult.Status
    OK: ActionResult.Status
    ERROR: ActionResult.Status
    CORRELATION_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    BLOB_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    INVOCATION_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    RESULT_JSON_AT_REST_FIELD_NUMBER: _ClassVar[int]
    MASKED_FIELD_NUMBER: _ClassVar[int]
    correlation_id: str
    status: ActionResult.Status
    result_json: str
    blob: bytes
    error: Error
    invocation: Invocation
    replayed: bool
    result_json_at_rest: str
    masked: bool
    def __init__(self, correlation_id: _Optional[str] = ..., status: _Optional[_Union[ActionResult.Status, str]] = ..., result_json: _Optional[str] = ..., blob: _Optional[bytes] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., invocation: _Optional[_Union[Invocation, _Mapping]] = ..., replayed: _Optional[bool] = ..., result_json_at_rest: _Optional[str] = ..., masked: _Optional[bool] = ...) -> None: ...

class ScopeDecision(_message.Message):
    __slots__ = ("request_id", "granted", "scopes", "reason")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    SCOPES_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    granted: bool
    scopes: _containers.RepeatedScalarFieldContainer[str]
    reason: str
    def __init__(self, request_id: _Optional[str] = ..., granted: _Optional[bool] = ..., scopes: _Optional[_Iterable[str]] = ..., reason: _Optional[str] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("in_flight", "queued", "state", "unix_ms", "kills_through")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATE_UNSPECIFIED: _ClassVar[Heartbeat.State]
        AVAILABLE: _ClassVar[Heartbeat.State]
        FULL: _ClassVar[Heartbeat.State]
        DRAINING: _ClassVar[Heartbeat.State]
    STATE_UNSPECIFIED: Heartbeat.State
    AVAILABLE: Heartbeat.State
    FULL: Heartbeat.State
    DRAINING: Heartbeat.State
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    KILLS_THROUGH_FIELD_NUMBER: _ClassVar[int]
    in_flight: int
    queued: int
    state: Heartbeat.State
    unix_ms: int
    kills_through: int
    def __init__(self, in_flight: _Optional[int] = ..., queued: _Optional[int] = ..., state: _Optional[_Union[Heartbeat.State, str]] = ..., unix_ms: _Optional[int] = ..., kills_through: _Optional[int] = ...) -> None: ...

class AuditEvent(_message.Message):
    __slots__ = ("event_id", "correlation_id", "kind", "plan_id", "agent_id", "detail_json", "unix_ms")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    DETAIL_JSON_FIELD_NUMBER: _ClassVar[int]
    UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    event_id: str
    correlation_id: str
    kind: str
    plan_id: str
    agent_id: str
    detail_json: str
    unix_ms: int
    def __init__(self, event_id: _Optional[str] = ..., correlation_id: _Optional[str] = ..., kind: _Optional[str] = ..., plan_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., detail_json: _Optional[str] = ..., unix_ms: _Optional[int] = ...) -> None: ...

class Goodbye(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class ServerEnvelope(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ServerMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[ServerMessage, _Mapping]]] = ...) -> None: ...

class ServerMessage(_message.Message):
    __slots__ = ("welcome", "request", "scope_request", "cancel", "kill_plan", "teardown", "ack", "drain", "heartbeat", "blob_part")
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    SCOPE_REQUEST_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    KILL_PLAN_FIELD_NUMBER: _ClassVar[int]
    TEARDOWN_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    BLOB_PART_FIELD_NUMBER: _ClassVar[int]
    welcome: Welcome
    request: ActionRequest
    scope_request: ScopeRequest
    cancel: Cancel
    kill_plan: KillPlan
    teardown: Teardown
    ack: Ack
    drain: Drain
    heartbeat: Heartbeat
    blob_part: BlobPart
    def __init__(self, welcome: _Optional[_Union[Welcome, _Mapping]] = ..., request: _Optional[_Union[ActionRequest, _Mapping]] = ..., scope_request: _Optional[_Union[ScopeRequest, _Mapping]] = ..., cancel: _Optional[_Union[Cancel, _Mapping]] = ..., kill_plan: _Optional[_Union[KillPlan, _Mapping]] = ..., teardown: _Optional[_Union[Teardown, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., drain: _Optional[_Union[Drain, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., blob_part: _Optional[_Union[BlobPart, _Mapping]] = ...) -> None: ...

class BlobPart(_message.Message):
    __slots__ = ("correlation_id", "data", "offset", "args_digest")
    CORRELATION_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    ARGS_DIGEST_FIELD_NUMBER: _ClassVar[int]
    correlation_id: str
    data: bytes
    offset: int
    args_digest: str
    def __init__(self, correlation_id: _Optional[str] = ..., data: _Optional[bytes] = ..., offset: _Optional[int] = ..., args_digest: _Optional[str] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("session_id", "protocol", "heartbeat_interval_ms", "abandoned_ids", "kills_epoch")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    ABANDONED_IDS_FIELD_NUMBER: _ClassVar[int]
    KILLS_EPOCH_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    protocol: int
    heartbeat_interval_ms: int
    abandoned_ids: _containers.RepeatedScalarFieldContainer[str]
    kills_epoch: str
    def __init__(self, session_id: _Optional[str] = ..., protocol: _Optional[int] = ..., heartbeat_interval_ms: _Optional[int] = ..., abandoned_ids: _Optional[_Iterable[str]] = ..., kills_epoch: _Optional[str] = ...) -> None: ...

class ActionRequest(_message.Message):
    __slots__ = ("correlation_id", "plan_id", "agent_id", "owner_user_id", "task_id", "surface", "action", "args_json", "blob", "timeout_ms", "attempt", "args_digest", "blob_in_parts", "parts_follow", "placement_token")
    CORRELATION_ID_FIELD_NUMBER: _ClassVar[int]
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_USER_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    SURFACE_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    ARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    BLOB_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    ARGS_DIGEST_FIELD_NUMBER: _ClassVar[int]
    BLOB_IN_PARTS_FIELD_NUMBER: _ClassVar[int]
    PARTS_FOLLOW_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    correlation_id: str
    plan_id: str
    agent_id: str
    owner_user_id: str
    task_id: str
    surface: str
    action: str
    args_json: str
    blob: bytes
    timeout_ms: int
    attempt: int
    args_digest: str
    blob_in_parts: int
    parts_follow: bool
    placement_token: str
    def __init__(self, correlation_id: _Optional[str] = ..., plan_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., owner_user_id: _Optional[str] = ..., task_id: _Optional[str] = ..., surface: _Optional[str] = ..., action: _Optional[str] = ..., args_json: _Optional[str] = ..., blob: _Optional[bytes] = ..., timeout_ms: _Optional[int] = ..., attempt: _Optional[int] = ..., args_digest: _Optional[str] = ..., blob_in_parts: _Optional[int] = ..., parts_follow: _Optional[bool] = ..., placement_token: _Optional[str] = ...) -> None: ...

class ScopeRequest(_message.Message):
    __slots__ = ("request_id", "agent_id", "plan_id", "scopes", "reason", "preview")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    SCOPES_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PREVIEW_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    agent_id: str
    plan_id: str
    scopes: _containers.RepeatedScalarFieldContainer[str]
    reason: str
    preview: str
    def __init__(self, request_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., plan_id: _Optional[str] = ..., scopes: _Optional[_Iterable[str]] = ..., reason: _Optional[str] = ..., preview: _Optional[str] = ...) -> None: ...

class Cancel(_message.Message):
    __slots__ = ("correlation_id", "reason")
    CORRELATION_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    correlation_id: str
    reason: str
    def __init__(self, correlation_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class KillPlan(_message.Message):
    __slots__ = ("plan_id", "reason", "seq", "in_use", "plan_digest")
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    IN_USE_FIELD_NUMBER: _ClassVar[int]
    PLAN_DIGEST_FIELD_NUMBER: _ClassVar[int]
    plan_id: str
    reason: str
    seq: int
    in_use: bool
    plan_digest: int
    def __init__(self, plan_id: _Optional[str] = ..., reason: _Optional[str] = ..., seq: _Optional[int] = ..., in_use: _Optional[bool] = ..., plan_digest: _Optional[int] = ...) -> None: ...

class Teardown(_message.Message):
    __slots__ = ("plan_id", "correlation_id")
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_ID_FIELD_NUMBER: _ClassVar[int]
    plan_id: str
    correlation_id: str
    def __init__(self, plan_id: _Optional[str] = ..., correlation_id: _Optional[str] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("correlation_ids",)
    CORRELATION_IDS_FIELD_NUMBER: _ClassVar[int]
    correlation_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, correlation_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class Drain(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class DispatchRequest(_message.Message):
    __slots__ = ("worker_id", "correlation_id", "plan_id", "agent_id", "owner_user_id", "task_id", "surface", "action", "args_json", "blob", "timeout_ms")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    CORRELATION_ID_FIELD_NUMBER: _ClassVar[int]
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_USER_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    SURFACE_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    ARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    BLOB_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    correlation_id: str
    plan_id: str
    agent_id: str
    owner_user_id: str
    task_id: str
    surface: str
    action: str
    args_json: str
    blob: bytes
    timeout_ms: int
    def __init__(self, worker_id: _Optional[str] = ..., correlation_id: _Optional[str] = ..., plan_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., owner_user_id: _Optional[str] = ..., task_id: _Optional[str] = ..., surface: _Optional[str] = ..., action: _Optional[str] = ..., args_json: _Optional[str] = ..., blob: _Optional[bytes] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class DispatchUploadPart(_message.Message):
    __slots__ = ("request", "blob_bytes", "offset", "data")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    BLOB_BYTES_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    request: DispatchRequest
    blob_bytes: int
    offset: int
    data: bytes
    def __init__(self, request: _Optional[_Union[DispatchRequest, _Mapping]] = ..., blob_bytes: _Optional[int] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class DispatchResponse(_message.Message):
    __slots__ = ("worker_id", "result")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    result: ActionResult
    def __init__(self, worker_id: _Optional[str] = ..., result: _Optional[_Union[ActionResult, _Mapping]] = ...) -> None: ...

class ListWorkersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerInfo(_message.Message):
    __slots__ = ("worker_id", "instance_id", "version", "connected", "in_flight", "state", "actions", "gui_available", "last_seen_unix_ms", "max_concurrency", "enrolment", "fingerprint")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    GUI_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    ENROLMENT_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    instance_id: str
    version: str
    connected: bool
    in_flight: int
    state: Heartbeat.State
    actions: _containers.RepeatedScalarFieldContainer[str]
    gui_available: bool
    last_seen_unix_ms: int
    max_concurrency: int
    enrolment: str
    fingerprint: str
    def __init__(self, worker_id: _Optional[str] = ..., instance_id: _Optional[str] = ..., version: _Optional[str] = ..., connected: _Optional[bool] = ..., in_flight: _Optional[int] = ..., state: _Optional[_Union[Heartbeat.State, str]] = ..., actions: _Optional[_Iterable[str]] = ..., gui_available: _Optional[bool] = ..., last_seen_unix_ms: _Optional[int] = ..., max_concurrency: _Optional[int] = ..., enrolment: _Optional[str] = ..., fingerprint: _Optional[str] = ...) -> None: ...

class DecideWorkerRequest(_message.Message):
    __slots__ = ("worker_id", "decision", "fingerprint")
    class Decision(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        DECISION_UNSPECIFIED: _ClassVar[DecideWorkerRequest.Decision]
        ACCEPT: _ClassVar[DecideWorkerRequest.Decision]
        REFUSE: _ClassVar[DecideWorkerRequest.Decision]
        FORGET: _ClassVar[DecideWorkerRequest.Decision]
    DECISION_UNSPECIFIED: DecideWorkerRequest.Decision
    ACCEPT: DecideWorkerRequest.Decision
    REFUSE: DecideWorkerRequest.Decision
    FORGET: DecideWorkerRequest.Decision
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    decision: DecideWorkerRequest.Decision
    fingerprint: str
    def __init__(self, worker_id: _Optional[str] = ..., decision: _Optional[_Union[DecideWorkerRequest.Decision, str]] = ..., fingerprint: _Optional[str] = ...) -> None: ...

class DecideWorkerResponse(_message.Message):
    __slots__ = ("worker_id", "fingerprint", "enrolment", "message")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    ENROLMENT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    fingerprint: str
    enrolment: str
    message: str
    def __init__(self, worker_id: _Optional[str] = ..., fingerprint: _Optional[str] = ..., enrolment: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class ListWorkersResponse(_message.Message):
    __slots__ = ("workers",)
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerInfo]
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerInfo, _Mapping]]] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ("state", "connected_workers", "known_workers", "version")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATE_UNSPECIFIED: _ClassVar[StatusResponse.State]
        CONNECTED: _ClassVar[StatusResponse.State]
        DISCONNECTED: _ClassVar[StatusResponse.State]
        UNCONFIGURED: _ClassVar[StatusResponse.State]
    STATE_UNSPECIFIED: StatusResponse.State
    CONNECTED: StatusResponse.State
    DISCONNECTED: StatusResponse.State
    UNCONFIGURED: StatusResponse.State
    STATE_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_WORKERS_FIELD_NUMBER: _ClassVar[int]
    KNOWN_WORKERS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    state: StatusResponse.State
    connected_workers: int
    known_workers: int
    version: str
    def __init__(self, state: _Optional[_Union[StatusResponse.State, str]] = ..., connected_workers: _Optional[int] = ..., known_workers: _Optional[int] = ..., version: _Optional[str] = ...) -> None: ...

class RequestScopeRequest(_message.Message):
    __slots__ = ("worker_id", "agent_id", "plan_id", "scopes", "reason", "preview", "timeout_ms")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    SCOPES_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PREVIEW_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    agent_id: str
    plan_id: str
    scopes: _containers.RepeatedScalarFieldContainer[str]
    reason: str
    preview: str
    timeout_ms: int
    def __init__(self, worker_id: _Optional[str] = ..., agent_id: _Optional[str] = ..., plan_id: _Optional[str] = ..., scopes: _Optional[_Iterable[str]] = ..., reason: _Optional[str] = ..., preview: _Optional[str] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class KillPlanRequest(_message.Message):
    __slots__ = ("plan_id", "reason", "worker_id")
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    plan_id: str
    reason: str
    worker_id: str
    def __init__(self, plan_id: _Optional[str] = ..., reason: _Optional[str] = ..., worker_id: _Optional[str] = ...) -> None: ...

class KillPlanResponse(_message.Message):
    __slots__ = ("worker_ids", "queued_worker_ids")
    WORKER_IDS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_WORKER_IDS_FIELD_NUMBER: _ClassVar[int]
    worker_ids: _containers.RepeatedScalarFieldContainer[str]
    queued_worker_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, worker_ids: _Optional[_Iterable[str]] = ..., queued_worker_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class TeardownRequest(_message.Message):
    __slots__ = ("worker_id", "plan_id")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    plan_id: str
    def __init__(self, worker_id: _Optional[str] = ..., plan_id: _Optional[str] = ...) -> None: ...
