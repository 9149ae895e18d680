"""sandbox.held: an asked program's places and the worker's writes exclude each other
(review18 F5). Each side registers under one lock, so whichever comes second is
refused, with who holds or writes the place; a folder held holds what is beneath it;
a registration ends with its block, and the place is free again."""

from __future__ import annotations

import threading

import pytest

from sandbox.held import HeldError, HeldPlaces


def test_a_write_of_a_place_held_or_beneath_a_folder_held_is_refused() -> None:
    held = HeldPlaces()
    with held.hold(["/w/s.py", "/w/pkg"], "call-1"):
        for place, blocked in [("/w/s.py", "/w/s.py"), ("/w/pkg/__main__.py", "/w/pkg")]:
            with pytest.raises(HeldError) as refused:
                held.write(place, "call-2")
            assert (refused.value.path, refused.value.by) == (blocked, "call-1")
            assert refused.value.holding
        with held.write("/w/s.pyc", "call-3"), held.write("/w/pkgs", "call-4"):
            pass  # a name that only starts the same is another place
    with held.write("/w/s.py", "call-5"):
        pass  # let go with its block


def test_a_hold_of_a_place_being_written_is_refused_and_the_write_ends_its_claim() -> None:
    held = HeldPlaces()
    with held.write("/w/pkg/mod.py", "call-1"):
        with pytest.raises(HeldError) as refused:
            held.hold(["/w/other", "/w/pkg"], "call-2")
        assert (refused.value.path, refused.value.by, refused.value.holding) == (
            "/w/pkg/mod.py",
            "call-1",
            False,
        )
    with held.hold(["/w/pkg"], "call-2"):
        pass
    with held.write("/w/pkg/mod.py", "call-3"):
        pass  # the refused hold left nothing behind, nor did the one that ended


def test_from_many_threads_a_hold_and_a_write_of_one_place_never_both_stand() -> None:
    """Each thread registers and, while registered, marks the place; a second mark
    while one stands would mean both were let in."""
    held = HeldPlaces()
    standing: list[str] = []
    both: list[tuple[str, ...]] = []
    start = threading.Barrier(8)

    def side(number: int) -> None:
        start.wait()
        for _ in range(500):
            try:
                registered = (
                    held.hold(["/w/s.py"], f"h{number}")
                    if number % 2
                    else held.write("/w/s.py", f"w{number}")
                )
            except HeldError:
                continue
            with registered:
                standing.append(f"{number}")
                if number % 2 and any(int(n) % 2 == 0 for n in standing):
                    both.append(tuple(standing))
                if not number % 2 and any(int(n) % 2 for n in standing):
                    both.append(tuple(standing))
                standing.remove(f"{number}")

    threads = [threading.Thread(target=side, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert both == []
