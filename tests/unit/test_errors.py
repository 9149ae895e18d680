"""OSErrors become error codes with messages a person can act on."""

from __future__ import annotations

import errno

from worker.errors import from_os_error


def test_an_os_error_for_a_path_names_the_path() -> None:
    error = from_os_error(OSError(errno.ENOSPC, "No space left on device"), "out/big.bin")
    assert error.code == "too_large"
    assert error.message == "'out/big.bin': no space left on the device."
    assert error.details == {"path": "out/big.bin", "errno": errno.ENOSPC}


def test_an_os_error_without_a_path_says_what_the_system_said() -> None:
    error = from_os_error(OSError(errno.EMFILE, "Too many open files"))
    assert error.code == "internal_error"
    assert error.message == "the operating system refused: Too many open files."
    assert "''" not in error.message
    assert error.details == {"errno": errno.EMFILE}
