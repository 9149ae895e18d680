"""The one key-name table: what `key_combo` (and held modifiers) accept.

A name is looked up case-insensitively, through its aliases, to a canonical name;
each backend maps canonical names to its platform's keys (`x11` here, pynput's
`Key` attribute for macOS and Windows). A single character stands for itself.
An unknown name is `unknown_key`, with the closest known names.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from worker.errors import WorkerError


@dataclass(frozen=True)
class Key:
    name: str  # canonical
    x11: str  # X keysym name
    pynput: str  # attribute of pynput.keyboard.Key
    modifier: bool = False


def _table() -> dict[str, Key]:
    keys = [
        Key("ctrl", "Control_L", "ctrl", modifier=True),
        Key("alt", "Alt_L", "alt", modifier=True),
        Key("shift", "Shift_L", "shift", modifier=True),
        Key("super", "Super_L", "cmd", modifier=True),
        Key("altgr", "ISO_Level3_Shift", "alt_gr", modifier=True),
        Key("enter", "Return", "enter"),
        Key("esc", "Escape", "esc"),
        Key("tab", "Tab", "tab"),
        Key("backspace", "BackSpace", "backspace"),
        Key("delete", "Delete", "delete"),
        Key("insert", "Insert", "insert"),
        Key("space", "space", "space"),
        Key("up", "Up", "up"),
        Key("down", "Down", "down"),
        Key("left", "Left", "left"),
        Key("right", "Right", "right"),
        Key("home", "Home", "home"),
        Key("end", "End", "end"),
        Key("pageup", "Prior", "page_up"),
        Key("pagedown", "Next", "page_down"),
        Key("capslock", "Caps_Lock", "caps_lock"),
        Key("numlock", "Num_Lock", "num_lock"),
        Key("scrolllock", "Scroll_Lock", "scroll_lock"),
        Key("printscreen", "Print", "print_screen"),
        Key("pause", "Pause", "pause"),
        Key("menu", "Menu", "menu"),
    ]
    keys += [Key(f"f{n}", f"F{n}", f"f{n}") for n in range(1, 25)]
    return {key.name: key for key in keys}


KEYS: Final = _table()

ALIASES: Final = {
    "control": "ctrl",
    "ctl": "ctrl",
    "option": "alt",
    "opt": "alt",
    "cmd": "super",
    "command": "super",
    "win": "super",
    "windows": "super",
    "meta": "super",
    "return": "enter",
    "escape": "esc",
    "del": "delete",
    "ins": "insert",
    "arrowup": "up",
    "arrowdown": "down",
    "arrowleft": "left",
    "arrowright": "right",
    "pgup": "pageup",
    "page_up": "pageup",
    "pgdn": "pagedown",
    "page_down": "pagedown",
    "caps_lock": "capslock",
    "print": "printscreen",
    "prtsc": "printscreen",
    "plus": "+",
    "minus": "-",
}

ALL_NAMES: Final = sorted({*KEYS, *ALIASES})


@dataclass(frozen=True)
class Press:
    """One key of a combo: a named key, or a single character."""

    key: Key | None = None
    char: str = ""

    @property
    def label(self) -> str:
        return self.key.name if self.key else self.char


def lookup(name: str) -> Press:
    if len(name) == 1:
        return Press(char=name)
    folded = name.strip().lower()
    folded = ALIASES.get(folded, folded)
    if len(folded) == 1:
        return Press(char=folded)
    key = KEYS.get(folded)
    if key is None:
        import difflib  # here: only a misspelt name needs suggestions, not every start

        close = difflib.get_close_matches(folded, ALL_NAMES, n=5, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise WorkerError(
            "unknown_key",
            f"{name!r} is not a key name{hint} Names: modifiers (ctrl, alt, shift, super), "
            "enter, esc, tab, backspace, delete, arrows (up, down, left, right), home, end, "
            "pageup, pagedown, f1-f24, space, or a single character.",
            {"key": name, "close_matches": close},
        )
    return Press(key=key)


def parse_combo(keys: str | list[str]) -> list[Press]:
    """ "ctrl+shift+left" or ["ctrl", "shift", "left"] → the keys, in pressing order."""
    parts = _split_plus(keys) if isinstance(keys, str) else list(keys)
    if not parts:
        raise WorkerError("validation_error", "a key combo needs at least one key")
    return [lookup(part) for part in parts]


def _split_plus(text: str) -> list[str]:
    # "ctrl++" is ctrl and "+"; "+" alone is the plus key.
    if text == "+":
        return ["+"]
    parts = text.split("+")
    out: list[str] = []
    for index, part in enumerate(parts):
        if part == "":
            if index == len(parts) - 1 and out:
                out.append("+")
            continue
        out.append(part.strip())
    return out


def chunks(text: str, size: int) -> Iterator[str]:
    """`text` in pieces of at most `size` characters, each line ending one: the focus is
    checked before each (as the X11 backend's `_next_chunk` ends its)."""
    for line in text.splitlines(keepends=True):
        for at in range(0, len(line), size):
            yield line[at : at + size]
