"""Replay scripts: JSON Lines, one step per line, read the same way everywhere.

A script is what `agentworker replay` runs and `agentworker record` writes:

    # comment lines and blank lines are skipped
    {"agentworker_replay": 1, "agent": "me"}                     optional header, first
    {"action": "fs_stat", "args": {"path": "."}}                  a step
    {"action": "fs_write", "args": {"path": "a.txt"}, "blob": "a.txt",
     "expect": {"status": "ok", "result": {"size": 5}}}           (on one line)

The models here are the format: the parser validates each line with them, and the
JSON Schema shipped beside this module (`script.schema.json`, for editors) is
generated from them; a test keeps the two equal. A line that does not parse is
kept as `Malformed` with its line number, so a run can report it and go on.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    WithJsonSchema,
    model_validator,
)

from sandbox.paths import ConfinedDir, ConfinementError
from worker.actions.host.fs_write import WRITE_BYTES
from worker.errors import CODES, WorkerError

FORMAT_VERSION: Final = 1
HEADER_KEY: Final = "agentworker_replay"
DEFAULT_SURFACE: Final = "workerHost"
SCHEMA_FILE: Final = "script.schema.json"
# A blob is at most what one fs_write takes (and so what any call may carry).
BLOB_BYTES: Final = WRITE_BYTES


def _known_code(value: str) -> str:
    if value not in CODES:
        raise ValueError(f"{value!r} is not an error code (see docs/architecture.md, Errors)")
    return value


ErrorCode = Annotated[
    str,
    AfterValidator(_known_code),
    WithJsonSchema({"type": "string", "enum": sorted(CODES)}),
]
Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
# "fs_stat" (a workerHost action) or "surface.action".
ActionName = Annotated[
    str, StringConstraints(pattern=r"^([A-Za-z][A-Za-z0-9]*\.)?[a-z][a-z0-9_]*$", max_length=200)
]
Label = Annotated[str, StringConstraints(max_length=500)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Expect(_Strict):
    """What a step's answer must show; every field given is checked, the rest not."""

    status: Literal["ok", "error"] | None = Field(
        default=None, description="ok or error; implied error when error_code is given"
    )
    error_code: ErrorCode | None = Field(default=None, description="the error's code")
    result: dict[str, Any] | None = Field(
        default=None,
        description="a subset of the result: each key given must be there with this value "
        "(objects compared key by key, arrays item by item)",
    )
    exit_code: int | None = Field(default=None, description="exec: the program's exit code")
    blob_sha256: Sha256 | None = Field(
        default=None, description="sha256 (hex) of the result blob; of b'' for no blob"
    )

    @model_validator(mode="after")
    def _coherent(self) -> Expect:
        if self.status == "ok" and self.error_code is not None:
            raise ValueError("an ok status carries no error_code")
        return self

    def wanted_status(self) -> str | None:
        if self.status is not None:
            return self.status
        return "error" if self.error_code is not None else None


class Step(_Strict):
    """One action to run, and what its answer must show."""

    action: ActionName = Field(description='"fs_stat" (workerHost) or "surface.action"')
    args: dict[str, Any] = Field(default_factory=dict, description="the action's args")
    blob: Annotated[str, StringConstraints(min_length=1, max_length=4096)] | None = Field(
        default=None, description="a file sent as the request blob, relative to the script"
    )
    plan: Label | None = Field(default=None, description="plan id (default: the header's)")
    agent: Label | None = Field(default=None, description="agent id (default: the header's)")
    task: Label | None = Field(default=None, description="task id (default: the header's)")
    timeout_ms: Annotated[int, Field(gt=0, le=86_400_000)] | None = Field(
        default=None, description="the call's deadline (default: the worker's)"
    )
    wait_ms: Annotated[int, Field(ge=0, le=3_600_000)] = Field(
        default=0, description="pause this long before the step"
    )
    note: Label | None = Field(default=None, description="a label shown in reports")
    expect: Expect | None = Field(
        default=None, description='what the answer must show; omitted: {"status": "ok"}'
    )

    @property
    def surface_action(self) -> tuple[str, str]:
        surface, _, name = self.action.rpartition(".")
        return surface or DEFAULT_SURFACE, name


class Header(_Strict):
    """The optional first line: the format version, and defaults for the steps."""

    agentworker_replay: Annotated[int, Field(ge=1)] = Field(
        description="the script format's version"
    )
    plan: Label = Field(default="", description="plan id of steps that name none")
    agent: Label = Field(default="", description="agent id of steps that name none")
    task: Label = Field(default="", description="task id of steps that name none")
    note: Label | None = Field(default=None, description="what the script is for")


_LINE: Final = TypeAdapter(Header | Step)


def line_schema() -> dict[str, Any]:
    """The JSON Schema of one line (a header or a step), as shipped in `SCHEMA_FILE`."""
    schema = _LINE.json_schema()
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "agentworker replay script line",
        "description": "One line of an agentworker replay script (JSON Lines): the optional "
        "header (first line) or a step. Lines starting with # and blank lines are comments.",
        **schema,
    }


def shipped_schema() -> dict[str, Any]:
    """The schema file that ships with the package."""
    text = resources.files(__package__ or "worker.replay").joinpath(SCHEMA_FILE).read_text()
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def schema_text() -> str:
    return json.dumps(line_schema(), indent=2, ensure_ascii=False) + "\n"


# ----------------------------------------------------------------- parsed scripts


@dataclass(frozen=True)
class Entry:
    """A step as it will run: its line, its effective ids, and its blob's file."""

    line: int
    index: int  # 1-based among the script's steps
    step: Step
    plan: str
    agent: str
    task: str
    blob_path: Path | None
    blob_sha256: str  # of the request blob (b'' when none)
    correlation_id: str = ""
    blob_base: Path | None = None  # the script's folder, which the blob must be inside

    @property
    def expect(self) -> Expect:
        return self.step.expect if self.step.expect is not None else Expect(status="ok")

    def args_json(self) -> str:
        return json.dumps(self.step.args, ensure_ascii=False, separators=(",", ":"))

    def read_blob(self) -> bytes:
        """The blob's bytes, read again as `read_blob` allows; BlobError if it cannot be
        or is no longer what the script was read with (its id follows from it)."""
        if self.blob_path is None or self.blob_base is None or self.step.blob is None:
            return b""
        data = read_blob(self.blob_base, self.step.blob)
        if hashlib.sha256(data).hexdigest() != self.blob_sha256:
            raise BlobError(
                f"blob: {self.step.blob!r} changed after the script was read; run it again"
            )
        return data

    def identity(self) -> str:
        """What makes this step the call it is (its expectation and pause do not)."""
        surface, name = self.step.surface_action
        return json.dumps(
            [surface, name, self.args_json(), self.plan, self.agent, self.task, self.blob_sha256],
            ensure_ascii=False,
        )


@dataclass(frozen=True)
class Malformed:
    """A line that is not a valid step: kept so the run can report it and go on."""

    line: int
    index: int  # 1-based among the script's steps
    text: str
    problems: tuple[str, ...]

    @property
    def action(self) -> str:
        """The action the line names, if it names one (for reports)."""
        try:
            value = json.loads(self.text)
        except (ValueError, RecursionError):
            return "?"
        action = value.get("action") if isinstance(value, dict) else None
        return action if isinstance(action, str) else "?"


@dataclass(frozen=True)
class Script:
    path: Path | None
    header: Header
    items: tuple[Entry | Malformed, ...] = field(default_factory=tuple)

    @property
    def entries(self) -> list[Entry]:
        return [item for item in self.items if isinstance(item, Entry)]

    @property
    def malformed(self) -> list[Malformed]:
        return [item for item in self.items if isinstance(item, Malformed)]


def is_comment(line: str) -> bool:
    stripped = line.strip()
    return not stripped or stripped.startswith("#")


def _problems(exc: ValidationError) -> tuple[str, ...]:
    return tuple(
        f"{'.'.join(str(p) for p in err['loc']) or 'line'}: {err['msg']}"
        for err in exc.errors(include_url=False, include_input=False)
    )


def load(path: Path, run_label: str = "") -> Script:
    """Read a script file; raises WorkerError only when the file itself cannot be used
    (unreadable, or written for a newer format). Bad lines become `Malformed`."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkerError("validation_error", f"cannot read the script {path}: {exc}") from exc
    return parse(text, base=path.parent, path=path, run_label=run_label)


def _lines(text: str) -> list[str]:
    """A script's lines: broken at "\n" (a "\r" before it dropped, for a script saved
    with Windows line ends), never where str.splitlines also breaks, at U+2028, U+2029,
    U+0085, \v or \f: `agentworker record` writes JSON with those characters as they
    are (a recorded file's text may hold them), and a step broken there no longer
    replayed (review25 G3)."""
    return [line.removesuffix("\r") for line in text.split("\n")]


def parse(text: str, *, base: Path, path: Path | None = None, run_label: str = "") -> Script:
    """Parse a script's text; blobs are found relative to `base`."""
    header = Header(agentworker_replay=FORMAT_VERSION)
    items: list[Entry | Malformed] = []
    seen_content = False
    chain = hashlib.sha256(f"agentworker-replay\x00{run_label}".encode())
    for number, raw in enumerate(_lines(text), start=1):
        if is_comment(raw):
            continue
        first = not seen_content
        seen_content = True
        try:
            value = json.loads(raw)
        except ValueError as exc:
            item: Entry | Malformed = Malformed(
                number, len(items) + 1, raw, (f"not valid JSON: {exc}",)
            )
        except RecursionError:
            item = Malformed(number, len(items) + 1, raw, ("nested too deeply to read",))
        else:
            if isinstance(value, dict) and HEADER_KEY in value:
                if not first:
                    item = Malformed(
                        number,
                        len(items) + 1,
                        raw,
                        ("a header belongs on the first line, before any step",),
                    )
                else:
                    header = _header(number, raw)
                    continue
            else:
                item = _entry(number, raw, len(items) + 1, header, base)
        chain.update((item.identity() if isinstance(item, Entry) else raw).encode())
        chain.update(b"\x00")
        if isinstance(item, Entry):
            item = _with_id(item, chain.hexdigest())
        items.append(item)
    return Script(path=path, header=header, items=tuple(items))


def _with_id(entry: Entry, digest: str) -> Entry:
    """The step's correlation id follows from the script up to and including it: the
    same script replayed again (through a hub, say) sends the same ids, so a step that
    already ran is answered from the record instead of running twice; a step changed,
    or one before it, gets a new id."""
    return dataclasses.replace(entry, correlation_id=f"replay-{digest[:32]}")


def _header(number: int, raw: str) -> Header:
    try:
        header = Header.model_validate_json(raw)
    except ValidationError as exc:
        problems = "; ".join(_problems(exc))
        raise WorkerError(
            "validation_error", f"line {number}: the script's header is invalid: {problems}"
        ) from None
    if header.agentworker_replay > FORMAT_VERSION:
        raise WorkerError(
            "not_supported",
            f"line {number}: the script is written for format {header.agentworker_replay}; "
            f"this agentworker reads format {FORMAT_VERSION}. Upgrade agentworker.",
        )
    return header


_BAD_BLOB_PATH: Final = re.compile(r"(^|/)\.\.(/|$)")


def _entry(number: int, raw: str, index: int, header: Header, base: Path) -> Entry | Malformed:
    try:
        step = Step.model_validate_json(raw)
    except ValidationError as exc:
        return Malformed(number, index, raw, _problems(exc))
    blob_path = None
    digest = hashlib.sha256(b"").hexdigest()
    if step.blob is not None:
        posix = PurePosixPath(step.blob)
        if posix.is_absolute() or _BAD_BLOB_PATH.search(step.blob) or "\\" in step.blob:
            return Malformed(
                number,
                index,
                raw,
                (f"blob: {step.blob!r} must be a relative path inside the script's folder",),
            )
        blob_path = base / posix
        try:
            digest = hashlib.sha256(read_blob(base, step.blob)).hexdigest()
        except BlobError as exc:
            return Malformed(number, index, raw, (str(exc),))
    return Entry(
        line=number,
        index=index,
        step=step,
        plan=step.plan if step.plan is not None else header.plan,
        agent=step.agent if step.agent is not None else header.agent,
        task=step.task if step.task is not None else header.task,
        blob_path=blob_path,
        blob_sha256=digest,
        blob_base=base if blob_path is not None else None,
    )


class BlobError(Exception):
    """A step's blob cannot be sent; the message says why, for the run's report."""


def read_blob(base: Path, name: str) -> bytes:
    """The bytes of blob `name` (relative) in the script's folder `base`.

    A script may come from someone else (a shared folder of recorded plans), so its
    blob is opened as the worker opens an agent's path: resolved beneath the folder
    by the kernel (no `..`, no link leading out), the blob itself never a link
    (`notes.txt -> ~/.ssh/id_ed25519` is refused), a regular file only (a FIFO would
    block even a dry run; opened non-blocking, it is refused), at most BLOB_BYTES.
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
    try:
        with ConfinedDir(Path(os.path.realpath(base))) as folder:
            fd = folder.open(name, flags)
    except ConfinementError as exc:
        raise BlobError(f"blob: cannot read it: {exc.message}") from None
    except OSError as exc:
        raise BlobError(f"blob: cannot read {name!r}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise BlobError(
                f"blob: {name!r} is not a regular file (a FIFO, device, socket or folder "
                "cannot be sent)"
            )
        if info.st_size > BLOB_BYTES:
            raise BlobError(_too_large(name, info.st_size))
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(BLOB_BYTES + 1)
    except OSError as exc:
        raise BlobError(f"blob: cannot read {name!r}: {exc.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > BLOB_BYTES:  # it grew as it was read
        raise BlobError(_too_large(name, len(data)))
    return data


def _too_large(name: str, size: int) -> str:
    return (
        f"blob: {name!r} has {size:,} bytes or more; a blob may have at most "
        f"{BLOB_BYTES:,} (what one fs_write takes)"
    )


def dump_line(model: BaseModel) -> str:
    """One line of a script: the model's fields that differ from their defaults."""
    return json.dumps(model.model_dump(mode="json", exclude_defaults=True), ensure_ascii=False)
