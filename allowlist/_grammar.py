"""How a rule reads an argument list: an argument grammar, not a prefix.

A prefix rule ("git log ...") admits whatever follows it, and whatever follows is
where injections live: `git log --output=/x`, `find . -exec sh`, a file named
`-rf`. A grammar instead names every flag and option a rule admits, the type of
every value, and how many positional arguments of which type may follow. An
argument list matches only if every token has a place in the grammar, read the
way the program itself reads it:

- `gnu` style (getopt_long, and git's parse-options): short flags bundle (`-la`),
  a short option takes the rest of its token or the next token (`-n5`, `-n 5`),
  long options take `--name=value` or `--name value`, options may follow
  positionals, and `--` ends the options. Only exact option names count: the
  abbreviations getopt would expand are never admitted (the refusal names the
  option the program would have read). An option whose value is optional
  (`optional_value`, e.g. git's `-U`/`--unified`) takes one only attached (`-U5`,
  `--unified=5`): `-U 5` is `-U` and then the positional `5`, as git reads it.
- `options_first` style: as `gnu`, but the first positional ends the options, as
  for getopt under POSIXLY_CORRECT and for programs with their own parsers (xxd).
  Read the `gnu` way, `xxd in.bin -p` would be one input and a flag; xxd reads
  `-p` as its output file and writes it.
- `single_dash` style (find's expressions): tokens are matched whole, an option
  takes the next token, and positionals (start points) come before the first
  option.
- `xxd` style, xxd's own parser exactly: an option token is read by its first two
  characters (`-ps` is `-p`, `-revert` is `-r`; one leading `-` more is dropped, so
  `--p` is `-p`), the rest of a flag's token is ignored, an option's value is the
  rest of its token unless that spells the option's long name (`-c16`, but
  `-cols 16`), the first non-option ends the options and `--` ends them too.
  Read the `gnu` way, `-ps` would be `-p` plus `-s VALUE`.

Paths are never judged here: a `read_path` or `write_path` value is handed to the
caller's `PathCheck`, which knows the shared folders and the working directory.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

Style = Literal["gnu", "options_first", "single_dash", "xxd"]
Repeat = Literal["one", "optional", "many"]

BASE_KINDS: Final = frozenset(
    {"opaque", "int", "glob", "read_path", "write_path", "git_format", "jq_filter", "git_rev"}
)
# git_rev: a revision, which git reads as a path when no revision has that name, so it
# is checked as a path read too (a revision's text lies inside the working folder).
PATH_KINDS: Final = frozenset({"read_path", "write_path", "git_rev"})
# A kind is a base kind's name, or a tuple of the literal words allowed.
Kind = str | tuple[str, ...]

# Given a path as the caller wrote it and whether it is written to: None when the
# path may be used, else why not (a sentence for a person).
PathCheck = Callable[[str, bool], "str | None"]

_INT: Final = re.compile(r"[+-]?[0-9]{1,18}")
# git format placeholders that verify a signature, which runs gpg: %G? %GS %GK ... in
# pretty formats, %(signature...) in ref formats. `%%` is a literal percent sign.
_SIGNATURE_PLACEHOLDER: Final = re.compile(r"%G|%\(\s*signature", re.IGNORECASE)
# xxd: the rest of an option's token that spells its long name means "value follows".
_XXD_LONG_TAILS: Final[Mapping[str, tuple[str, ...]]] = {
    "-c": ("ols",),
    "-g": ("roup",),
    "-o": ("ffset",),
    "-s": ("kip", "eek"),
    "-l": ("en",),
    "-n": ("ame",),
}
# jq filter text that makes jq open files of its own choosing (modules, data files,
# from search paths the filter itself may name).
_JQ_FILES: Final = re.compile(r"\b(import|include|modulemeta|get_search_list)\b")
# How a rule for another subcommand says no: never worth showing a person.
OTHER_FORM: Final = "it is not `"


class NoMatchError(Exception):
    """The argument list does not fit this grammar; `reason` says where it breaks."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class PathRefusedError(NoMatchError):
    """The list fits the grammar, but a path in it lies outside the shared folders."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(why)
        self.path = path


@dataclass(frozen=True)
class Slot:
    """One positional place: its kind, and whether it is required, optional or repeated."""

    kind: Kind
    repeat: Repeat = "one"


@dataclass(frozen=True)
class Reading:
    """An argument list as a grammar reads it."""

    flags: tuple[str, ...] = ()
    values: tuple[tuple[str, str], ...] = ()  # (option, value)
    positionals: tuple[str, ...] = ()
    after_double_dash: tuple[str, ...] = ()


@dataclass(frozen=True)
class Grammar:
    style: Style = "gnu"
    subcommand: tuple[str, ...] = ()  # literal words; "a|b" admits either
    flags: frozenset[str] = frozenset()
    options: Mapping[str, Kind] = field(default_factory=dict)
    positionals: tuple[Slot, ...] = ()
    # When set, positionals after `--` are typed by these slots instead.
    after_double_dash: tuple[Slot, ...] | None = None
    # Each group names alternatives; at least one of each group must be present.
    require: tuple[frozenset[str], ...] = ()
    # Admit any arguments after the subcommand (for forbidden rules and test policies).
    any_args: bool = False
    # Long options whose program takes a value only attached (`--format=X`): the next
    # token is never their value (git's revision options read `--format X` as
    # `--format` and a revision or path X).
    attached: frozenset[str] = frozenset()
    # Options whose value is optional, so only ever attached (`-U5`, `--unified=5`);
    # alone they are flags, and the next token is a positional.
    optional: frozenset[str] = frozenset()

    def match(self, args: Sequence[str], check_path: PathCheck) -> Reading:
        """Read `args` (argv without the program name) and check every value.

        Raises NoMatchError, or PathRefusedError when only a path keeps the list out.
        """
        reading = self.read(args)
        self.check(reading, check_path)
        return reading

    def read(self, args: Sequence[str]) -> Reading:
        count = len(self.subcommand)
        words = args[:count]
        if len(words) < count or any(
            word not in spec.split("|") for word, spec in zip(words, self.subcommand, strict=False)
        ):
            raise NoMatchError(f"{OTHER_FORM}{' '.join(self.subcommand)}`")
        rest = list(args[count:])
        if self.any_args:
            return Reading(positionals=tuple(rest))
        if self.style == "single_dash":
            reading = self._read_single_dash(rest)
        elif self.style == "xxd":
            reading = self._read_xxd(rest)
        else:
            reading = self._read_gnu(rest, options_first=self.style == "options_first")
        present = set(reading.flags) | {name for name, _ in reading.values}
        for group in self.require:
            if not group & present:
                raise NoMatchError(f"it needs {' or '.join(sorted(group))}")
        return reading

    def check(self, reading: Reading, check_path: PathCheck) -> None:
        if self.any_args:
            return
        for name, value in reading.values:
            _check_value(self.options[name], value, f"the value of {name}", check_path)
        if self.after_double_dash is None:
            _check_slots(
                self.positionals, reading.positionals + reading.after_double_dash, check_path
            )
        else:
            _check_slots(self.positionals, reading.positionals, check_path)
            _check_slots(self.after_double_dash, reading.after_double_dash, check_path, "after --")

    def path_positionals(self, reading: Reading) -> tuple[str, ...]:
        """The positional arguments `reading` takes as paths (what a searching program
        searches; option values such as `grep -f FILE` are not among them)."""
        if self.any_args:
            return reading.positionals
        if self.after_double_dash is None:
            return _slot_paths(self.positionals, reading.positionals + reading.after_double_dash)
        return _slot_paths(self.positionals, reading.positionals) + _slot_paths(
            self.after_double_dash, reading.after_double_dash
        )

    # ------------------------------------------------------------- styles

    def _read_gnu(self, rest: list[str], *, options_first: bool = False) -> Reading:
        flags: list[str] = []
        values: list[tuple[str, str]] = []
        positionals: list[str] = []
        after: list[str] = []
        index = 0

        def next_value(name: str) -> str:
            nonlocal index
            if index >= len(rest):
                raise NoMatchError(f"option {name} needs a value")
            index += 1
            return rest[index - 1]

        while index < len(rest):
            arg = rest[index]
            index += 1
            if arg == "--":
                after = rest[index:]
                break
            if arg.startswith("--"):
                name, has_value, value = arg.partition("=")
                if name in self.optional and name in self.options:
                    if has_value:
                        values.append((name, value))
                    else:
                        flags.append(name)
                elif name in self.flags:
                    if has_value:
                        raise NoMatchError(f"option {name} takes no value")
                    flags.append(name)
                elif name in self.options:
                    if not has_value and name in self.attached:
                        raise NoMatchError(
                            f"option {name} takes its value attached: write {name}=VALUE"
                        )
                    values.append((name, value if has_value else next_value(name)))
                else:
                    raise NoMatchError(self._not_allowed(name))
            elif arg.startswith("-") and len(arg) > 1:
                for at in range(1, len(arg)):
                    name = "-" + arg[at]
                    if name in self.flags:
                        flags.append(name)
                    elif name in self.optional and name in self.options:
                        attached = arg[at + 1 :]
                        if attached:
                            values.append((name, attached))
                        else:
                            flags.append(name)
                        break
                    elif name in self.options:
                        attached = arg[at + 1 :]
                        values.append((name, attached or next_value(name)))
                        break
                    else:
                        inside = f" (in {arg})" if len(arg) > 2 else ""
                        raise NoMatchError(f"option {name}{inside} is not allowed")
            elif options_first:
                positionals += rest[index - 1 :]  # everything from here on is an operand
                break
            else:
                positionals.append(arg)
        return Reading(tuple(flags), tuple(values), tuple(positionals), tuple(after))

    def _not_allowed(self, name: str) -> str:
        """Why the long option `name` is refused; for an abbreviation, of what."""
        longer = sorted(
            known
            for known in (*self.flags, *self.options)
            if known.startswith("--") and known.startswith(name) and len(name) > 2
        )
        if not longer:
            return f"option {name} is not allowed"
        return (
            f"option {name} is not allowed: the program would read it as an abbreviation of "
            f"{' or '.join(longer)}, and abbreviations are never admitted; write the option "
            "in full"
        )

    def _read_xxd(self, rest: list[str]) -> Reading:
        flags: list[str] = []
        values: list[tuple[str, str]] = []
        index = 0
        while index < len(rest):
            arg = rest[index]
            word = arg[1:] if arg.startswith("--") and len(arg) > 2 else arg
            if word == "--":
                index += 1
                break
            if not (word.startswith("-") and len(word) > 1):
                break  # the first operand ends the options
            index += 1
            key, tail = word[:2], word[2:]
            if key == "-c" and tail.startswith("apitalize"):
                key, tail = "-C", ""
            if key in self.flags:
                flags.append(key)
            elif key in self.options:
                if tail and not tail.startswith(_XXD_LONG_TAILS.get(key, ())):
                    values.append((key, tail))
                elif index < len(rest):
                    values.append((key, rest[index]))
                    index += 1
                else:
                    raise NoMatchError(f"option {arg} needs a value")
            else:
                xxd_reads = f" (xxd reads it as {key})" if tail else ""
                raise NoMatchError(f"option {arg}{xxd_reads} is not allowed")
        return Reading(tuple(flags), tuple(values), tuple(rest[index:]))

    def _read_single_dash(self, rest: list[str]) -> Reading:
        flags: list[str] = []
        values: list[tuple[str, str]] = []
        positionals: list[str] = []
        index = 0
        while index < len(rest):
            token = rest[index]
            index += 1
            if token in self.flags:
                flags.append(token)
            elif token in self.options:
                if index >= len(rest):
                    raise NoMatchError(f"{token} needs a value")
                values.append((token, rest[index]))
                index += 1
            elif token.startswith("-") and len(token) > 1:
                raise NoMatchError(f"{token} is not allowed")
            elif flags or values:
                raise NoMatchError(f"{token!r} follows the expression; paths must come first")
            else:
                positionals.append(token)
        return Reading(tuple(flags), tuple(values), tuple(positionals))


def _check_slots(
    slots: Sequence[Slot], given: Sequence[str], check_path: PathCheck, where: str = ""
) -> None:
    required = sum(1 for slot in slots if slot.repeat == "one")
    at_most = None if any(slot.repeat == "many" for slot in slots) else len(slots)
    suffix = f" {where}" if where else ""
    if len(given) < required:
        raise NoMatchError(f"it needs {required} argument(s){suffix}, got {len(given)}")
    if at_most is not None and len(given) > at_most:
        raise NoMatchError(f"it takes at most {at_most} argument(s){suffix}, got {len(given)}")
    index = 0
    for slot in slots:
        taken = len(given) - index if slot.repeat == "many" else min(1, len(given) - index)
        for value in given[index : index + taken]:
            _check_value(slot.kind, value, f"argument {value!r}", check_path)
        index += taken


def _slot_paths(slots: Sequence[Slot], given: Sequence[str]) -> tuple[str, ...]:
    """The values of `given` that fall in path slots, as _check_slots assigns them."""
    found: list[str] = []
    index = 0
    for slot in slots:
        taken = len(given) - index if slot.repeat == "many" else min(1, len(given) - index)
        if slot.kind in PATH_KINDS:
            found += [value for value in given[index : index + taken] if value != "-"]
        index += taken
    return tuple(found)


def _check_value(kind: Kind, value: str, what: str, check_path: PathCheck) -> None:
    if "\x00" in value:
        raise NoMatchError(f"{what} contains a NUL byte")
    if isinstance(kind, tuple):
        if value not in kind:
            raise NoMatchError(f"{what} must be one of: {', '.join(kind)}")
    elif kind == "int":
        if not _INT.fullmatch(value):
            raise NoMatchError(f"{what} must be a whole number")
    elif kind == "jq_filter":
        if _JQ_FILES.search(value):
            raise NoMatchError(
                f"{what} imports or includes a module, which makes jq open files no rule checked"
            )
    elif kind == "git_format":
        if _SIGNATURE_PLACEHOLDER.search(value.replace("%%", "")):
            raise NoMatchError(
                f"{what} asks for a signature check (%G…, %(signature)), which runs gpg"
            )
    elif kind in PATH_KINDS and value != "-":  # "-" is stdin or stdout, not a file
        why = check_path(value, kind == "write_path")
        if why is not None:
            raise PathRefusedError(value, why)


def token_hits(entry: str, arg: str) -> bool:
    """Whether `arg` could be the denied argument `entry`, as its program reads it.

    `--name` also catches `--name=value` and any abbreviation getopt would expand
    to it; a one-letter `-x` catches any short-option bundle holding x (`-nx`,
    `-xVALUE`); anything else (`-exec`, a word) must equal the token. Erring
    towards a hit is the point: a false hit refuses a call, a miss runs one.
    """
    if entry.startswith("--"):
        if not arg.startswith("--") or arg == "--":
            return False
        name = arg.split("=", 1)[0]
        return name == entry or (len(name) > 2 and entry.startswith(name))
    if len(entry) == 2 and entry.startswith("-"):
        return arg.startswith("-") and not arg.startswith("--") and entry[1] in arg[1:]
    return arg == entry
