"""Protocol 2: a request's blob may come ahead of it in BlobParts. A real worker
against a scripted hub takes the parts, and refuses, with a code and nothing run,
parts that break a bound or do not add up; the stream goes on after each."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import pytest

from tests.integration.test_stream_rules import MIB, error_code, play
from tests.support.cluster import release
from tests.support.scripted_hub import ScriptedHub
from worker.core import blob_parts
from worker.core.connection import WorkerConnection
from worker.wire.proto import agentworker_pb2 as pb

ECHO = json.dumps({"blob_repeat": 1, "mark": "parts"})


def send_parts(hub: ScriptedHub, cid: str, blob: bytes, size: int) -> None:
    for at in range(0, len(blob), size):
        hub.send(blob_part=pb.BlobPart(correlation_id=cid, data=blob[at : at + size], offset=at))


async def marks_after(hub: ScriptedHub, cid: str) -> int:
    """How many times the probe ran so far (a plain call, which also shows the
    stream still goes on)."""
    hub.request(cid, ECHO)
    result = await hub.next("result")
    assert error_code(result) == "ok", result
    return int(json.loads(result.result_json)["marks"])


def test_a_blob_in_parts_arrives_whole(tmp_path: Path) -> None:
    blob = os.urandom(3 * 1024 * 1024 + 5)

    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        send_parts(hub, "whole", blob, 1024 * 1024)
        hub.request("whole", ECHO, blob_in_parts=len(blob))
        result = await hub.next("result")
        assert error_code(result) == "ok" and result.blob == blob
        assert link._parts.held_bytes == 0  # nothing kept once its request came

    play(tmp_path, scenario, protocol=2)


def test_parts_that_do_not_add_up_run_nothing(tmp_path: Path) -> None:
    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        send_parts(hub, "short", b"x" * 1000, 400)
        hub.request("short", ECHO, blob_in_parts=5000)
        refused = await hub.next("result")
        assert error_code(refused) == "validation_error"
        assert "5,000 bytes" in refused.error.message and "1,000 came" in refused.error.message
        hub.request("none", ECHO, blob_in_parts=10)  # announced, and nothing came
        assert error_code(await hub.next("result")) == "validation_error"
        assert await marks_after(hub, "after") == 1  # neither refused call ran

    play(tmp_path, scenario, protocol=2)


def test_parts_past_a_bound_are_dropped_and_their_call_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(blob_parts, "MAX_CALL_BYTES", 10_000)
    monkeypatch.setattr(blob_parts, "MAX_HELD_BYTES", 25_000)  # two 9,000-byte parts fit

    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        send_parts(hub, "huge", b"x" * 12_000, 4_000)  # one call over its bound
        hub.request("huge", ECHO, blob_in_parts=12_000)
        refused = await hub.next("result")
        assert error_code(refused) == "too_large" and "nothing was run" in refused.error.message
        # Three calls' parts, all held at once, over the bound for all of them.
        for cid in ("a", "b", "c"):
            send_parts(hub, cid, b"y" * 9_000, 9_000)
        for cid in ("a", "b", "c"):
            hub.request(cid, ECHO, blob_in_parts=9_000)
        codes = {}
        for _ in range(3):
            result = await hub.next("result")
            codes[result.correlation_id] = error_code(result)
        assert codes == {"a": "ok", "b": "ok", "c": "busy"}
        assert link._parts.held_bytes == 0
        assert await marks_after(hub, "after") == 3  # a and b ran; huge and c did not

    play(tmp_path, scenario, protocol=2)


def test_a_flood_of_tiny_parts_meets_the_bound_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(blob_parts, "MAX_HELD_BYTES", 100 * blob_parts.PART_OVERHEAD_BYTES)

    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        for i in range(500):  # empty parts, each its own id: only their bookkeeping
            hub.send(blob_part=pb.BlobPart(correlation_id=f"tiny-{i}"))
        hub.send(blob_part=pb.BlobPart(correlation_id="", data=b"no id"))
        hub.send(blob_part=pb.BlobPart(correlation_id="x" * 1000, data=b"too long an id"))
        assert await marks_after(hub, "after") == 1
        assert link._parts.held_bytes <= 100 * blob_parts.PART_OVERHEAD_BYTES
        assert link._bad_inputs == 2

    play(tmp_path, scenario, protocol=2)


def test_parts_whose_request_never_came_go_with_the_stream(tmp_path: Path) -> None:
    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        send_parts(hub, "orphan", b"z" * 50_000, 10_000)
        assert await marks_after(hub, "before") == 1  # the parts were read by then
        assert link._parts.held_bytes > 50_000
        hub.hang_up()
        await hub.dials(2)
        assert await marks_after(hub, "on-the-next-stream") == 2
        assert link._parts.held_bytes == 0

    play(tmp_path, scenario, protocol=2)


def test_parts_out_of_order_run_nothing(tmp_path: Path) -> None:
    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        # Two transfers of one id interleaved: the second's first part repeats byte 0.
        hub.send(blob_part=pb.BlobPart(correlation_id="mixed", data=b"A" * 100, offset=0))
        hub.send(blob_part=pb.BlobPart(correlation_id="mixed", data=b"C" * 100, offset=0))
        hub.send(blob_part=pb.BlobPart(correlation_id="mixed", data=b"B" * 100, offset=100))
        hub.request("mixed", ECHO, blob_in_parts=200)
        refused = await hub.next("result")
        assert error_code(refused) == "validation_error"
        assert "starts at byte 0, where byte 100 was next" in refused.error.message
        assert await marks_after(hub, "after") == 1

    play(tmp_path, scenario, protocol=2)


def test_a_cancel_that_comes_with_the_parts_stops_the_call_before_it_runs(tmp_path: Path) -> None:
    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        send_parts(hub, "stopped", os.urandom(300_000), 100_000)
        hub.send(cancel=pb.Cancel(correlation_id="stopped", reason="the caller gave up"))
        hub.request("stopped", ECHO, blob_in_parts=300_000)
        refused = await hub.next("result")
        assert error_code(refused) == "cancelled" and "the caller gave up" in refused.error.message
        assert await marks_after(hub, "after") == 1  # the cancelled call never ran

    play(tmp_path, scenario, protocol=2)


def test_a_cancel_before_the_request_lets_the_parts_go_at_once(tmp_path: Path) -> None:
    """A hub that stops a transfer part way (its caller left before the call was
    recorded) cancels it: the worker lets go of the parts it holds, and of those still
    on their way, without waiting for the stream to end."""

    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        send_parts(hub, "stopped", b"s" * 200_000, 100_000)
        hub.send(cancel=pb.Cancel(correlation_id="stopped", reason="not sent"))
        hub.send(blob_part=pb.BlobPart(correlation_id="stopped", data=b"late", offset=200_000))
        assert await marks_after(hub, "after") == 1  # all of the above was read by then
        assert link._parts.held_bytes == 0

    play(tmp_path, scenario, protocol=2)


def test_a_short_redelivery_of_a_known_call_is_answered_as_a_duplicate(tmp_path: Path) -> None:
    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        blob = os.urandom(50_000)
        slow = json.dumps({"blob_repeat": 1, "mark": "parts", "hold": "known"})
        send_parts(hub, "known", blob, 20_000)
        hub.request("known", slow, blob_in_parts=len(blob), args_digest="blake3:known")
        assert (await hub.next("ack")).kind == pb.ActionAck.STARTED
        # Delivered again while it runs, its parts cut short: not a refusal.
        send_parts(hub, "known", blob[:20_000], 20_000)
        hub.request("known", slow, blob_in_parts=len(blob), args_digest="blake3:known")
        assert (await hub.next("ack")).kind == pb.ActionAck.DUPLICATE_RUNNING
        link.dispatcher.paths.data_dir.joinpath("diag", "known.release").touch()
        first = await hub.next("result")
        assert error_code(first) == "ok" and first.blob == blob
        # And again once done (and acked): the stored outcome, not a refusal.
        hub.request("known", slow, blob_in_parts=len(blob), args_digest="blake3:known")
        again = await hub.next("result")
        assert error_code(again) == "blob_gone" and again.replayed

    play(tmp_path, scenario, protocol=2)


def test_parts_are_kept_as_they_came_and_copied_once_unless_they_would_pin_more(
    tmp_path: Path,
) -> None:
    """A part that is its stream message's whole payload is kept as a view of it (its
    one copy is the join); one that shares a stream message with a larger request is
    copied, so what the worker holds is never much more than what it counts."""
    big = os.urandom(600_000)
    pinned = pb.ServerMessage(blob_part=pb.BlobPart(correlation_id="small", data=b"s" * 100))
    large = pb.ServerMessage(
        request=pb.ActionRequest(
            correlation_id="inline",
            surface="workerDiag",
            action="probe",
            agent_id="tester",
            args_json=ECHO,
            attempt=1,
            blob=big,
        )
    )

    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        send_parts(hub, "viewed", big, 300_000)
        hub.send_raw(pb.ServerEnvelope(messages=[pinned, large]).SerializeToString())
        inline = await hub.next("result")  # both envelopes were read by then
        assert error_code(inline) == "ok" and inline.blob == big
        viewed, small = link._parts._parts["viewed"], link._parts._parts["small"]
        assert all(isinstance(part, memoryview) for part in viewed)
        assert isinstance(small[0], bytes)  # a view would pin the 600 KB envelope
        # Parts are judged one by one: a tiny part beside a large one (of another call,
        # refused at once here for its offset) is copied, not a view of both.
        beside = [
            pb.ServerMessage(blob_part=pb.BlobPart(correlation_id="junk", data=big, offset=1)),
            pb.ServerMessage(blob_part=pb.BlobPart(correlation_id="pin", data=b"p")),
        ]
        hub.send_raw(pb.ServerEnvelope(messages=beside).SerializeToString())
        hub.request("after-pin", ECHO)
        assert error_code(await hub.next("result")) == "ok"  # the envelope was read
        assert isinstance(link._parts._parts["pin"][0], bytes)
        hub.request("viewed", ECHO, blob_in_parts=len(big))
        result = await hub.next("result")
        assert error_code(result) == "ok" and result.blob == big

    play(tmp_path, scenario, protocol=2)


def test_an_fs_write_in_parts_writes_them_unjoined_and_knows_them_again(tmp_path: Path) -> None:
    """fs_write takes a blob in parts as they came (no join): the file holds every byte,
    its result hashes them all, and a server that sends no digest still has the call
    recognised when it comes again (the worker's digest over the parts is the digest
    over the whole blob), and told apart from another blob of the same size."""
    blob = os.urandom(3 * 1024 * 1024 + 7)
    other = blob[:-1] + bytes([blob[-1] ^ 1])
    args = json.dumps({"path": "parted.bin", "mode": "overwrite"})
    write = {"surface": "workerHost", "action": "fs_write", "blob_in_parts": len(blob)}

    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        send_parts(hub, "w1", blob, 1024 * 1024)
        hub.request("w1", args, **write)
        result = await hub.next("result")
        assert error_code(result) == "ok", result
        answer = json.loads(result.result_json)
        assert answer["bytes_written"] == len(blob)
        assert answer["sha256"] == hashlib.sha256(blob).hexdigest()
        assert (tmp_path / "workspace" / "parted.bin").read_bytes() == blob
        assert result.invocation.bytes_in == len(args) + len(blob)
        send_parts(hub, "w1", blob, 512 * 1024)  # again, cut otherwise: the same call
        hub.request("w1", args, **write)
        assert (await hub.next("ack")).kind == pb.ActionAck.DUPLICATE_DONE
        assert (await hub.next("result")).replayed
        send_parts(hub, "w1", other, 1024 * 1024)  # the same id, another blob
        hub.request("w1", args, **write)
        assert (await hub.next("ack")).kind == pb.ActionAck.REJECTED_ARGS_MISMATCH

    play(tmp_path, scenario, protocol=2)


def _with_cancel(cid: str, request: pb.ActionRequest, blob: bytes = b"") -> bytes:
    """One envelope: `blob` in parts, then `request`, then a Cancel of it."""
    messages = [
        pb.ServerMessage(
            blob_part=pb.BlobPart(correlation_id=cid, data=blob[at : at + MIB], offset=at)
        )
        for at in range(0, len(blob), MIB)
    ]
    messages.append(pb.ServerMessage(request=request))
    messages.append(pb.ServerMessage(cancel=pb.Cancel(correlation_id=cid, reason="stop it")))
    return pb.ServerEnvelope(messages=messages).SerializeToString()


def test_a_cancel_right_behind_a_call_hashed_first_stops_it_before_it_runs(
    tmp_path: Path,
) -> None:
    """A request with a large blob and no args_digest is hashed in a thread before it
    is claimed; a Cancel read meanwhile refuses it `cancelled` once hashed, nothing
    run: an fs_write whose blob came in parts (taken unjoined), and a request whose
    blob came inline."""
    blob = os.urandom(2 * MIB)

    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        write = pb.ActionRequest(
            correlation_id="w1",
            surface="workerHost",
            action="fs_write",
            agent_id="tester",
            args_json=json.dumps({"path": "cancelled.bin", "mode": "overwrite"}),
            attempt=1,
            blob_in_parts=len(blob),
        )
        hub.send_raw(_with_cancel("w1", write, blob))
        refused = await hub.next("result")
        assert refused.correlation_id == "w1"
        assert error_code(refused) == "cancelled" and "stop it" in refused.error.message
        assert not (tmp_path / "workspace" / "cancelled.bin").exists()
        inline = pb.ActionRequest(
            correlation_id="i1",
            surface="workerDiag",
            action="probe",
            agent_id="tester",
            args_json=ECHO,
            attempt=1,
            blob=blob,
        )
        hub.send_raw(_with_cancel("i1", inline))
        refused = await hub.next("result")
        assert refused.correlation_id == "i1" and error_code(refused) == "cancelled"
        assert await marks_after(hub, "after") == 1  # the probe never ran
        assert not link.dispatcher.state.running_ids()  # neither was claimed
        # Never claimed: sent again, the write runs.
        send_parts(hub, "w1", blob, MIB)
        hub.request(
            "w1", write.args_json, surface="workerHost", action="fs_write", blob_in_parts=len(blob)
        )
        assert error_code(await hub.next("result")) == "ok"
        assert (tmp_path / "workspace" / "cancelled.bin").read_bytes() == blob

    play(tmp_path, scenario, protocol=2)


def test_past_its_bound_on_queued_blobs_a_new_call_answers_busy_and_runs_nothing(
    tmp_path: Path,
) -> None:
    """Calls accepted and waiting for a slot keep their request blobs: together, those
    blobs (a blob in unjoined pieces too) are bounded, and a call past the bound is
    refused `busy`, unclaimed, so it runs when sent again."""
    blob = os.urandom(MIB)

    def write(hub: ScriptedHub, cid: str, **fields: object) -> None:
        args = json.dumps({"path": f"{cid}.bin", "mode": "overwrite"})
        hub.request(
            cid,
            args,
            surface="workerHost",
            action="fs_write",
            args_digest=f"blake3:{cid}",
            **fields,
        )

    async def scenario(hub: ScriptedHub, link: WorkerConnection) -> None:
        link.dispatcher.limits = dataclasses.replace(
            link.dispatcher.limits, max_accepted_blob_bytes=3 * MIB
        )
        hub.request("holder", json.dumps({"hold": "h"}))  # takes the one slot
        assert (await hub.next("ack")).kind == pb.ActionAck.STARTED
        write(hub, "q0", blob=blob)
        write(hub, "q1", blob=blob)
        send_parts(hub, "q2", blob, MIB // 2)  # taken as two pieces
        write(hub, "q2", blob_in_parts=len(blob))
        write(hub, "q3", blob=blob)  # 4 MiB held with it: past the bound
        refused = await hub.next("result")
        assert refused.correlation_id == "q3", refused
        assert error_code(refused) == "busy" and refused.error.retryable
        accepted = sorted(call.cid for call in link.dispatcher.unanswered())
        assert accepted == ["holder", "q0", "q1", "q2"]
        # fs_write claims its calls late (once its temporary file is on disk): the
        # writes waiting for the slot are accepted, not yet claimed.
        assert link.dispatcher.state.running_ids() == ["holder"]
        release(link.dispatcher.paths.data_dir, "h")
        done = {(await hub.next("result")).correlation_id for _ in range(4)}
        assert done == {"holder", "q0", "q1", "q2"}
        write(hub, "q3", blob=blob)  # the others answered: it is taken now
        assert error_code(await hub.next("result")) == "ok"
        assert (tmp_path / "workspace" / "q3.bin").read_bytes() == blob

    play(tmp_path, scenario, {"max_concurrency": 1}, protocol=2)
