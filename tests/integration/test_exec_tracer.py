"""The differential test: does each program do what its grammar says, and nothing more?

For every rule of the shipped policy, its `match` examples plus argument lists made
from its grammar (each flag, each option with its value separate, glued and after
`=`, short flags clustered, `--`, a value in every positional slot) are put to the
policy; each one it admits runs in the real sandbox under `strace -f`. The test
fails when the program

- executed anything but its pinned program,
- opened for reading a file outside the shared folder and the system folders,
- opened, created, renamed or removed a file for writing (every shipped rule reads
  only; the sandbox's private /tmp excepted), or
- touched the sentinel path: every value the grammar takes as text (an `opaque`
  kind) is `/agentworker-sentinel/...`, so a program that opens one read an
  argument as a path the grammar never checked. That is how xxd's `-ps` was found.

Beside the grammar's own options, every rule is also offered the usual spellings of
options that make a program write a file named in their value (`-o FILE`,
`--output=FILE`, `--log-file FILE`, ...: WRITE_OPTIONS), before and after its
other arguments: the policy must refuse them, and any it admitted would be traced
and found writing. `test_the_tracer_finds_options_that_write_their_value` shows it
finds `sort -o`, `git diff --output`, `git log --output` and wget's `-o` log file
when a grammar admits them (as text, or mislabelled as a path read). Every shipped
rule was checked by hand for such options too: none admits one (git's `--output`,
sort's `-o`/`-T`, find's `-fprint*`, sed's `w` without `--sandbox`, uniq's and
xxd's output operands are refused or denied).
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from allowlist import EXAMPLE_ROOT, Decision, Policy, Rule, load_policy, load_text
from allowlist._grammar import Kind
from sandbox import Root, environment
from sandbox.process import Limits, Mount, PidCap, View, run
from worker.actions.host.exec_git import git_view
from worker.actions.host.exec_policy import path_check

SENTINEL = "/agentworker-sentinel/value"
SYSTEM = ("/usr/", "/lib", "/bin/", "/sbin/", "/etc/", "/proc/", "/dev/", "/sys/", "/tmp/")
PRIVATE = ("/run/agentworker/",)
TRACED = (
    "execve,execveat,open,openat,openat2,creat,rename,renameat,renameat2,unlink,unlinkat,"
    "mkdir,mkdirat,link,linkat,symlink,symlinkat,truncate,stat,lstat,newfstatat,statx,"
    "access,faccessat,faccessat2,readlink,readlinkat,chdir"
)
WRITE_FLAGS = re.compile(r"O_WRONLY|O_RDWR|O_CREAT|O_TRUNC|O_APPEND")
CHANGES = re.compile(
    r"^(rename|renameat2?|unlink|unlinkat|mkdir|mkdirat|link|linkat|symlink|symlinkat|truncate)\("
)
# Programs that take their own kind of text, with what a hostile filter would say.
EXTRA = {
    "jq": [
        ["jq", 'include "agentworker-sentinel"; .', "a.json"],
        ["jq", 'import "agentworker-sentinel" as x; .', "a.json"],
        ["jq", "-n", 'import "agentworker-sentinel" as $x; $x'],
    ],
}
PER_RULE = 40  # generated lists per rule, beside its examples
# Options that make programs write the file their value names (GNU tools, git, curl,
# wget, rsync, tar, gpg...), each tried separate and glued, before and after the
# rule's other arguments.
WRITE_OPTIONS = (
    "-o",
    "-O",
    "--output",
    "--output-file",
    "--outfile",
    "--out",
    "--log-file",
    "--logfile",
    "--log",
    "--index-file",
    "--dump-header",
    "--stderr",
    "--trace",
    "--record",
)
WRITTEN = "written-by-option.txt"


@dataclass(frozen=True)
class Finding:
    argv: str
    what: str


@pytest.fixture(scope="module")
def share(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    folder = Path(os.path.realpath(tmp_path_factory.mktemp("traced")))
    (folder / "a.txt").write_text("alpha\nbeta\n")
    (folder / "b.txt").write_text("beta\ngamma\n")
    (folder / "a.json").write_text('{"name": "x", "list": [1, 2]}\n')
    (folder / "a.bin").write_bytes(b"hello")
    (folder / "dir").mkdir()
    (folder / "dir" / "c.txt").write_text("c\n")
    git = ["git", "-c", "user.email=a@b", "-c", "user.name=n", "-C", str(folder)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "first"], check=True)
    (folder / "a.txt").write_text("alpha\nbeta\ndelta\n")
    yield folder


def value_for(kind: Kind) -> str:
    if isinstance(kind, tuple):
        return kind[0]
    return {
        "opaque": SENTINEL,
        "git_format": "%H agentworker-sentinel",
        "git_rev": "HEAD",
        "jq_filter": ".",
        "int": "1",
        "glob": "*.txt",
        "read_path": "a.txt",
        "write_path": "out.txt",
    }[kind]


def generated(rule: Rule) -> list[list[str]]:
    grammar = rule.grammar
    if grammar.any_args:
        return []
    head = [rule.program, *(word.split("|")[0] for word in grammar.subcommand)]
    slots = [value_for(slot.kind) for slot in grammar.positionals if slot.repeat == "one"]
    extra = [value_for(slot.kind) for slot in grammar.positionals if slot.repeat != "one"][:1]
    tail = slots + extra
    required = [sorted(group)[0] for group in grammar.require]
    lists: list[list[str]] = [head + required + tail, head + required + slots]
    flags = sorted(grammar.flags)
    for at in range(0, len(flags), 6):  # a few at a time: each run under a tracer is slow
        lists.append(head + required + flags[at : at + 6] + tail)
    for name, kind in sorted(grammar.options.items()):
        value = value_for(kind)
        lists.append(head + required + [name, value] + tail)
        if grammar.style != "single_dash":
            glued = f"{name}={value}" if name.startswith("--") else f"{name}{value}"
            lists.append(head + required + [glued] + tail)
    shorts = sorted(f[1] for f in grammar.flags if len(f) == 2 and f[0] == "-" and f[1] != "-")
    if grammar.style != "single_dash":
        for at in range(0, len(shorts), 3):
            lists.append(head + required + ["-" + "".join(shorts[at : at + 3])] + tail)
        lists.append(head + required + ["--", *tail])
        # A flag clustered with an option that takes the next token: how `-ps VALUE`
        # reads for getopt (-p, -s VALUE) but not for xxd (-p only, VALUE a file).
        takes = sorted(n[1] for n in grammar.options if len(n) == 2 and n[0] == "-")
        for letter in takes:
            value = value_for(grammar.options["-" + letter])
            lead = shorts[:1]
            lists.append(head + required + ["-" + "".join(lead) + letter, value] + tail)
    return lists[:PER_RULE] + abbreviated(rule) + writing(rule)


def writing(rule: Rule) -> list[list[str]]:
    """The rule's arguments with an option that writes its value added (WRITE_OPTIONS):
    a file in the shared folder, which a path check would pass."""
    grammar = rule.grammar
    if grammar.any_args:
        return []
    head = [rule.program, *(word.split("|")[0] for word in grammar.subcommand)]
    required = [sorted(group)[0] for group in grammar.require]
    tail = [value_for(slot.kind) for slot in grammar.positionals if slot.repeat == "one"]
    lists = []
    for name in WRITE_OPTIONS:
        spellings = [[name, WRITTEN]]
        if grammar.style != "single_dash":
            spellings.append([f"{name}={WRITTEN}" if name.startswith("--") else name + WRITTEN])
        for option in spellings:
            lists.append(head + required + option + tail)
            lists.append(head + required + tail + option)
    return lists


def abbreviated(rule: Rule) -> list[list[str]]:
    """Each long option cut short by one letter, as getopt and git would expand it:
    the policy must refuse every one (and any it admitted would be traced)."""
    grammar = rule.grammar
    if grammar.any_args or grammar.style in ("single_dash", "xxd"):
        return []
    head = [rule.program, *(word.split("|")[0] for word in grammar.subcommand)]
    known = set(grammar.flags) | set(grammar.options)
    return [
        [*head, name[:-1]]
        for name in sorted(known)
        if name.startswith("--") and len(name) > 4 and name[:-1] not in known
    ]


def examples(rule: Rule, share: Path) -> list[list[str]]:
    out = []
    for line in rule.match:
        argv = [arg.replace(EXAMPLE_ROOT, str(share)) for arg in shlex.split(line)]
        out.append(argv)
    return out


def candidates(policy: Policy, share: Path) -> list[tuple[Rule | None, list[str]]]:
    seen: set[tuple[str, ...]] = set()
    found: list[tuple[Rule | None, list[str]]] = []
    for rule in policy.rules():
        if rule.decision == "forbidden":
            continue
        for argv in examples(rule, share) + generated(rule):
            if tuple(argv) not in seen:
                seen.add(tuple(argv))
                found.append((rule, argv))
    for argvs in EXTRA.values():
        for argv in argvs:
            found.append((None, argv))
    return found


def reads_only(rule: Rule | None) -> bool:
    if rule is None:
        return True
    kinds = [kind for kind in rule.grammar.options.values()]
    kinds += [slot.kind for slot in rule.grammar.positionals]
    return "write_path" not in kinds


async def traced(argv: list[str], decision: Decision, share: Path) -> str:
    """Run `argv` as exec would, under strace inside the sandbox; the trace's text.

    strace runs inside (it could not wrap bubblewrap: it would hold the sandbox's
    start-up pipes open), so this run goes without the seccomp filter, which refuses
    ptrace; the filter is not what is under test here.
    """
    roots = [Root(share, writable=True)]
    program = decision.path
    assert decision.program is not None and program is not None
    strace = ["/usr/bin/strace", "-f", "-y", "-qq", "-s", "4096", "-e", f"trace={TRACED}"]
    async with git_view(decision.program, program, roots, str(share)) as git:
        view = View(
            cwd=str(share),
            mounts=(Mount(str(share), True),),
            env=environment.build({}, (), {**decision.program.env, **git.env}),
            private=tuple(git.private),
            seccomp=False,
        )
        limits = Limits(timeout_s=30, output_bytes=64 * 1024 * 1024)
        done = await run(
            [*strace, "--", program, *argv[1:]], view, limits, b"{}\n", pid_cap=PidCap()
        )
    return done.stderr.decode(errors="replace")


def judge(trace: str, argv: list[str], program: str, share: Path, read_only: bool) -> list[str]:
    """What the program did that its rule does not allow (empty: nothing)."""
    problems: list[str] = []
    started: set[str] = set()  # pids that are the program or its children
    for line in trace.splitlines():
        # strace on stderr: the first process's lines bare, the others' as "[pid N] ...".
        found = re.match(r"^\[pid +(\d+)\] (.*)$", line) or re.match(r"^()([a-z_0-9]+\(.*)$", line)
        if found is None:
            continue  # the program's own stderr
        pid, call = found.group(1), found.group(2).strip()
        if call.startswith("execve(") and call.endswith("= 0"):
            path = call[len('execve("') :].split('"', 1)[0]
            if pid not in started and path == program:
                started.add(pid)
                continue
            if pid in started:
                problems.append(f"executed {path}")
            continue
        if call.startswith(("clone(", "clone3(", "fork(", "vfork(")) and pid in started:
            child = call.rsplit("= ", 1)[-1].split("<")[0].strip()
            if child.isdigit():
                started.add(child)
            continue
        if pid not in started:
            continue
        if "agentworker-sentinel" in call:
            problems.append(f"opened an argument the grammar read as text: {call[:200]}")
            continue
        if call.startswith(("open(", "openat(", "openat2(", "creat(")):
            landed = re.search(r"= \d+<([^>]*)>$", call)
            if landed is None:
                continue  # failed: nothing was opened
            path = landed.group(1)
            writing = call.startswith("creat(") or bool(WRITE_FLAGS.search(call))
            inside = path == str(share) or path.startswith(f"{share}/")
            # The sandbox's private /tmp excepted; the shared folder may well lie under
            # the host's /tmp (pytest's folders do), and is never excepted.
            scratch = path.startswith(("/tmp/", "/dev/")) and not inside
            if writing and read_only and not scratch:
                problems.append(f"opened for writing {path}")
            if not (inside or path == "/" or path.startswith(SYSTEM + PRIVATE)):
                problems.append(f"read {path}, outside the shared folder")
        elif (
            CHANGES.match(call)
            and call.endswith("= 0")
            and read_only
            and (str(share) in call or "/tmp/" not in call)
        ):
            problems.append(f"changed the file system: {call[:200]}")
    if not started:
        problems.append("the pinned program never started")
    return problems


@pytest.mark.timeout(1200)
def test_every_admitted_argument_list_does_only_what_its_rule_allows(
    share: Path, tmp_path: Path
) -> None:
    policy = load_policy(None)
    roots = [Root(share, writable=True)]
    check = path_check(roots, str(share))
    admitted = []
    for rule, argv in candidates(policy, share):
        decision = policy.decide(argv, check)
        if decision.runs and decision.path is not None:
            admitted.append((rule, argv, decision))
    assert len(admitted) > 300, len(admitted)

    async def all_of_them() -> list[Finding]:
        slots = asyncio.Semaphore(4)
        findings: list[Finding] = []

        async def one(index: int, rule: Rule | None, argv: list[str], decision: Decision) -> None:
            async with slots:
                trace = await traced(argv, decision, share)
            program = str(decision.path)
            for problem in judge(trace, argv, program, share, reads_only(rule)):
                findings.append(Finding(shlex.join(argv), problem))

        await asyncio.gather(*(one(i, *item) for i, item in enumerate(admitted)))
        return findings

    findings = asyncio.run(all_of_them())
    assert not findings, "\n".join(f"{f.argv}: {f.what}" for f in findings[:40])


OLD_XXD = """
[program.xxd]
paths = ["/usr/bin/xxd"]
style = "options_first"
[[program.xxd.rule]]
id = "xxd-before-issue-10"
reason = "xxd's grammar as it was: getopt's reading of -ps"
flags = ["-p", "-u"]
options = ["-c=int", "-s=opaque"]
positionals = ["read_path?"]
"""


def test_the_tracer_finds_xxds_ps_under_the_grammar_that_missed_it(share: Path) -> None:
    """The test's own power: with xxd's old grammar, it finds `-ps VALUE` by itself."""
    policy = load_text(OLD_XXD)
    check = path_check([Root(share, writable=True)], str(share))
    found = []
    for argv in generated(policy.rules()[0]):
        decision = policy.decide(argv, check)
        if decision.runs and decision.path is not None:
            trace = asyncio.run(traced(argv, decision, share))
            if judge(trace, argv, decision.path, share, read_only=True):
                found.append(argv)
    assert ["xxd", "-ps", SENTINEL, "a.txt"] in found, found


WRITERS = """
[program.sort]
paths = ["/usr/bin/sort"]
[[program.sort.rule]]
id = "sort-with-output"
reason = "a mistake: -o writes the file its value names"
options = ["-o=opaque"]
positionals = ["read_path..."]

[program.git]
paths = ["/usr/bin/git"]
[[program.git.rule]]
id = "git-diff-with-output"
reason = "a mistake: --output writes the diff to a file"
subcommand = ["diff"]
options = ["--output=opaque"]
[[program.git.rule]]
id = "git-log-with-output"
reason = "a mistake: --output, mislabelled as a path read"
subcommand = ["log"]
options = ["--output=read_path"]

[program.wget]
paths = ["/usr/bin/wget"]
[[program.wget.rule]]
id = "wget-with-log-file"
reason = "a mistake: -o names wget's log file"
options = ["-o=read_path"]
positionals = ["opaque"]
"""


def test_the_tracer_finds_options_that_write_their_value(share: Path) -> None:
    """The test's own power over writes: a grammar that admits an option writing the
    file its value names is caught, whatever kind the grammar gave the value."""
    policy = load_text(WRITERS)
    check = path_check([Root(share, writable=True)], str(share))
    caught: dict[str, list[str]] = {}
    for rule in policy.rules():
        for argv in generated(rule):
            decision = policy.decide(argv, check)
            if not (decision.runs and decision.path is not None):
                continue
            trace = asyncio.run(traced(argv, decision, share))
            problems = judge(trace, argv, decision.path, share, read_only=True)
            if problems:
                caught.setdefault(rule.id, []).extend(problems)
        (share / WRITTEN).unlink(missing_ok=True)
    assert set(caught) == {r.id for r in policy.rules()}, caught
    assert any(WRITTEN in p for p in caught["git-log-with-output"]), caught
    assert any("sentinel" in p for p in caught["git-diff-with-output"]), caught
