"""The one key-name table: aliases, single characters, and unknown names."""

from __future__ import annotations

import pytest

from worker.actions.computer._backend import detect
from worker.actions.computer._keys import KEYS, chunks, lookup, parse_combo
from worker.errors import WorkerError


@pytest.mark.parametrize(
    ("alias", "canonical"),
    [
        ("Control", "ctrl"),
        ("option", "alt"),
        ("cmd", "super"),
        ("WIN", "super"),
        ("meta", "super"),
        ("Return", "enter"),
        ("Escape", "esc"),
        ("pgdn", "pagedown"),
        ("ArrowLeft", "left"),
        ("F24", "f24"),
    ],
)
def test_aliases_name_one_canonical_key(alias: str, canonical: str) -> None:
    press = lookup(alias)
    assert press.key is not None and press.key.name == canonical


def test_every_key_has_a_platform_name() -> None:
    for key in KEYS.values():
        assert key.x11 and key.pynput


@pytest.mark.parametrize(
    ("combo", "labels"),
    [
        ("ctrl+a", ["ctrl", "a"]),
        ("ctrl+shift+Left", ["ctrl", "shift", "left"]),
        ("ctrl++", ["ctrl", "+"]),
        ("+", ["+"]),
        ("alt+plus", ["alt", "+"]),
        (["super", "é"], ["super", "é"]),
    ],
)
def test_combos_parse_in_pressing_order(combo: str | list[str], labels: list[str]) -> None:
    assert [p.label for p in parse_combo(combo)] == labels


def test_an_unknown_name_lists_the_close_matches() -> None:
    with pytest.raises(WorkerError) as caught:
        parse_combo("ctrl+pagdown")
    assert caught.value.code == "unknown_key"
    assert "pagedown" in caught.value.details["close_matches"]


def test_a_name_nothing_resembles_still_says_what_is_allowed() -> None:
    with pytest.raises(WorkerError) as caught:
        lookup("xyzzyq")
    assert caught.value.details["close_matches"] == []
    assert "f1-f24" in caught.value.message


def test_no_display_is_not_a_desktop() -> None:
    seen = detect({}, "linux")
    assert not seen.available
    assert "DISPLAY is not set" in seen.reason and "DISPLAY" in seen.fix
    assert seen.error().code == "not_supported"


def test_wayland_is_recognised_even_with_xwayland_display() -> None:
    seen = detect({"DISPLAY": ":0", "WAYLAND_DISPLAY": "wayland-0"}, "linux")
    assert not seen.available and "Wayland" in seen.reason and "X11" in seen.fix
    seen = detect({"DISPLAY": ":0", "XDG_SESSION_TYPE": "wayland"}, "linux")
    assert not seen.available and seen.server == "wayland"


def test_an_x11_session_is_a_desktop() -> None:
    assert detect({"DISPLAY": ":0", "XDG_SESSION_TYPE": "x11"}, "linux").available


def test_typed_text_is_cut_into_chunks_that_end_each_line() -> None:
    """The pynput backends type a chunk between focus checks: at most the chunk's size,
    and a line's end (the key most likely to close a window) ends one. Nothing is lost."""
    text = "ab\ncdefg\n\nh" + "x" * 7
    pieces = list(chunks(text, 4))
    assert "".join(pieces) == text
    assert pieces == ["ab\n", "cdef", "g\n", "\n", "hxxx", "xxxx"]
    assert max(map(len, chunks("y" * 1000, 64))) == 64
