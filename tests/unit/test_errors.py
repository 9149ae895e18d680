"""OSErrors become error codes with messages a person can act on."""

from __future__ import annotations

import copy
import errno

import pytest

from sandbox import ConfinementError, Problem
from worker.errors import (
    CONFINEMENT_CODES,
    BadRequestError,
    ErrorCode,
    FileError,
    InternalError,
    RefusedError,
    StoppedError,
    UnavailableError,
    WorkerError,
    as_worker_error,
    from_os_error,
)


def test_an_os_error_for_a_path_names_the_path() -> None:
    error = from_os_error(OSError(errno.ENOSPC, "No space left on device"), "out/big.bin")
    assert error.code == "too_large"
    assert error.message == "'out/big.bin' cannot grow: no space is left on the device."
    assert error.details == {"path": "out/big.bin", "errno": errno.ENOSPC}


def test_an_os_error_without_a_path_says_what_the_system_said() -> None:
    error = from_os_error(OSError(errno.EMFILE, "Too many open files"))
    assert error.code == "internal_error"
    assert error.message == "the operating system refused: Too many open files."
    assert "''" not in error.message
    assert error.details == {"errno": errno.EMFILE}


def test_a_code_knows_whether_a_retry_may_help_and_whether_it_is_audited() -> None:
    assert ErrorCode.BUSY.retryable and not ErrorCode.BUSY.audited
    assert ErrorCode.PLAN_KILLED.audited and not ErrorCode.PLAN_KILLED.retryable
    assert WorkerError("timeout", "slow").retryable


def test_an_error_is_an_instance_of_the_family_its_code_belongs_to() -> None:
    assert isinstance(WorkerError("scope_denied", "no"), RefusedError)
    assert isinstance(WorkerError(ErrorCode.NOT_FOUND, "gone"), FileError)
    assert type(RefusedError("url_not_allowed", "no")) is RefusedError
    with pytest.raises(ValueError, match="cannot carry"):
        RefusedError("busy", "a family refuses a code of another")
    with pytest.raises(ValueError, match="unknown error code"):
        WorkerError("no_such_code", "x")


def test_every_code_belongs_to_exactly_one_family() -> None:
    families = [BadRequestError, RefusedError, FileError, UnavailableError, StoppedError]
    families.append(InternalError)
    for code in ErrorCode:
        assert sum(code in family.codes for family in families) == 1, code


def test_an_error_survives_copying_with_its_family() -> None:
    error = copy.deepcopy(WorkerError("busy", "later", {"n": 1}))
    assert isinstance(error, UnavailableError)
    assert (error.code, error.message, error.details) == ("busy", "later", {"n": 1})


def test_anything_unexpected_becomes_an_internal_error_without_its_text() -> None:
    error = as_worker_error(KeyError("secret"), doing="running workerHost.x", call="c1")
    assert error.code == "internal_error"
    assert "secret" not in error.message and "(call c1)" in error.message
    assert as_worker_error(OSError(errno.ENOENT, "gone"), doing="x").code == "not_found"


def test_every_sandbox_problem_has_a_wire_code() -> None:
    assert set(CONFINEMENT_CODES) == set(Problem)
    refusal = as_worker_error(ConfinementError(Problem.NOT_A_FILE, "a FIFO"), doing="x")
    assert (refusal.code, refusal.message) == ("not_supported", "a FIFO")
