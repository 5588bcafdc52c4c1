"""Actions and errors that foreign logs show only inside message text, as exact line spans.

Chat-style logs (mini-SWE-agent, Magentic-One, AG2/CaptainAgent, MAST's raw traces) carry no
tool-call records: the agent writes a fenced code block, the next message shows the exit code and
output, a browser agent says "I clicked 'Credits'." and pastes the page. The helpers here find
those parts of a message text and name their lines (1-based, inclusive, within the decoded
string), so an adapter can add ``tool_call`` / ``tool_result`` / ``error`` events whose ref is the
message's pointer plus ``#La-Lb`` (see :mod:`pipeline.adapters.spans`). The message event itself
is always kept; derived events share its step index.

Everything here is deterministic text matching, documented pattern by pattern; nothing guesses
what a message "means" beyond what it literally shows.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any

from pipeline.adapters.base import Emitter, args_digest
from pipeline.adapters.contract import SourceEvent
from pipeline.core.canonical import digest, sha256_text

_FENCE = re.compile(r"^\s*```\s*([\w.+-]*)\s*$")
# Languages whose fenced blocks are executed by the chat frameworks here (AG2's code executor,
# Magentic-One's ComputerTerminal, mini-SWE-agent's bash action).
EXECUTABLE = {"", "python", "py", "python3", "sh", "bash", "shell", "console", "mswea_bash_command"}


@dataclass(frozen=True)
class Span:
    """Lines ``first..last`` (1-based, inclusive) of a decoded string, and the text they hold."""

    first: int
    last: int
    text: str


@dataclass(frozen=True)
class CodeBlock:
    """A fenced code block: the fence lines included in the span, the code without them."""

    span: Span
    lang: str
    code: str


def lines_of(text: str) -> list[str]:
    """The lines a ``#La-Lb`` suffix counts (the same split as the ref resolver)."""
    return text.split("\n")


def span(lines: list[str], first: int, last: int) -> Span:
    """The span of lines ``first..last`` (1-based), trailing blank lines dropped."""
    while last > first and not lines[last - 1].strip():
        last -= 1
    return Span(first, last, "\n".join(lines[first - 1 : last]))


def code_blocks(text: str) -> list[CodeBlock]:
    """Fenced code blocks of a message (an unclosed fence is no block: the text was cut off)."""
    lines = lines_of(text)
    out: list[CodeBlock] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        close = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        if close is None:
            break
        code = "\n".join(lines[i + 1 : close])
        out.append(CodeBlock(Span(i + 1, close + 1, "\n".join(lines[i : close + 1])), m.group(1).lower(), code))
        i = close + 1
    return out


def executable_blocks(text: str) -> list[CodeBlock]:
    """The code blocks an executor would run (python / shell; not json, text or diff examples)."""
    return [b for b in code_blocks(text) if b.lang in EXECUTABLE and b.code.strip()]


_PREAMBLE = re.compile(r"^\s*(?:#|set\s+[-+][A-Za-z]|\$\s*$)")
_SHELLS = {"bash", "sh", "zsh", "dash", "/bin/bash", "/bin/sh", "/bin/zsh", "/usr/bin/bash", "pwsh", "powershell"}


def shell_command(cmd: Any) -> str:
    """The command a shell tool ran, as text: ``["bash", "-lc", "ls -la"]`` is ``ls -la``, not ``bash``.

    Agent harnesses (Codex CLI, OpenHands, SWE-agent tools) pass the command as an argv list that
    wraps the real script in a login shell; the script is what the agent chose to run.
    """
    if isinstance(cmd, list) and all(isinstance(c, str) for c in cmd):
        if len(cmd) >= 3 and cmd[0].rsplit("/", 1)[-1] in {s.rsplit("/", 1)[-1] for s in _SHELLS} and cmd[1] in (
            "-lc", "-c", "-l", "-Command", "-NoProfile"
        ):  # fmt: skip
            return str(cmd[-1])
        return shlex.join(cmd)
    return cmd if isinstance(cmd, str) else str(cmd)


def normal_command(script: str) -> str:
    """A shell script as the commands it runs: comment and blank lines dropped, spaces collapsed.

    Two calls that run the same commands are the same call for the repeat probes, whatever
    comments or indentation an agent wrapped them in.
    """
    lines = (" ".join(ln.split()) for ln in script.splitlines())
    return "\n".join(ln for ln in lines if ln and not ln.startswith("#"))


def command_digest(script: str, workdir: Any = None) -> str:
    """The arguments digest of a shell call: its normalised commands (and working folder, when given)."""
    return args_digest(normal_command(script)) if workdir in (None, "") else digest([normal_command(script), workdir])


def sub_event(
    em: Emitter, kind: str, ptr: str, part: Span, *, line: int | None = None, inner: str = "", **fields: Any
) -> SourceEvent:
    """An event whose ref is lines ``part`` of the string at ``ptr`` (its message keeps ``ptr``).

    ``inner`` descends into a string that holds JSON first (``#/content``: MAST's JSON traces).
    """
    ev = em.event(kind, ptr, line=line, **fields)
    ev.json_pointer = f"{ev.json_pointer or ''}{inner}#L{part.first}-L{part.last}"
    return ev


def command_tool(command: str) -> str:
    """The tool a shell command runs: its first word after ``cd DIR &&`` / env assignments.

    Comment lines, blank lines and ``set -e``-style option lines before the first command are
    skipped: a block that opens with ``# install deps`` runs ``pip``, never a tool named ``#``.
    """
    first = next((ln for ln in command.splitlines() if ln.strip() and not _PREAMBLE.match(ln)), "")
    words = first.strip().split()
    if words and words[0] == "sudo":
        words = words[1:]
    while words:
        if words[0] == "cd" and len(words) >= 3 and words[2] in ("&&", ";"):
            words = words[3:]
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=\S*", words[0]):
            words = words[1:]
        else:
            break
    if len(words) >= 3 and words[0] in ("python", "python3") and words[1] == "-m":
        return words[2]  # "python -m pytest": the tool is pytest (a check), not the interpreter
    return words[0] if words else ""


def call_event(
    em: Emitter, ptr: str, block: CodeBlock, *, call_id: str, actor: str | None, step: int | None, **fields: Any
) -> SourceEvent:
    """A ``tool_call`` for one executed code block (tool = shell command, or ``python``)."""
    shell = block.lang in ("sh", "bash", "shell", "console", "mswea_bash_command")
    tool = command_tool(block.code) if shell else ("python" if block.lang in ("python", "py", "python3") else "code")
    return sub_event(
        em,
        "tool_call",
        ptr,
        block.span,
        actor=actor,
        step_index=step,
        tool_name=tool or "code",
        call_id=call_id,
        args_digest=command_digest(block.code) if shell else args_digest(block.code),
        text=block.code,
        detail="code_block",
        **fields,
    )


def result_event(
    em: Emitter,
    ptr: str,
    part: Span,
    *,
    failed: bool,
    call_id: str | None,
    actor: str | None,
    step: int | None,
    tool_name: str | None = None,
    detail: str | None = None,
    **fields: Any,
) -> SourceEvent:
    """A ``tool_result`` (or ``error`` when the output shows a failure) for lines of a message."""
    return sub_event(
        em,
        "error" if failed else "tool_result",
        ptr,
        part,
        actor=actor,
        step_index=step,
        tool_name=tool_name,
        call_id=call_id,
        result_digest=sha256_text(part.text),
        text=part.text,
        detail="tool_error" if failed else detail,
        **fields,
    )


# Exit codes as the executors print them.
_EXIT = [
    re.compile(r"exitcode: (?P<code>-?\d+)"),  # AG2: "exitcode: 1 (execution failed)"
    re.compile(r"exited with Unix exit code: (?P<code>-?\d+)"),  # Magentic-One ComputerTerminal
    re.compile(r"The Unix exit code was: (?P<code>-?\d+)"),  # Magentic-One, no output
    re.compile(r"<returncode>\s*(?P<code>-?\d+)\s*</returncode>"),  # mini-SWE-agent
]


def exit_code(text: str) -> int | None:
    """The exit code an executor's message reports, if it reports one."""
    for pat in _EXIT:
        m = pat.search(text[:2000])
        if m:
            return int(m.group("code"))
    return None


# A Python traceback with its closing exception line, e.g. a harness error appended to a message.
_TRACEBACK = re.compile(r"^.*Traceback \(most recent call last\):")
_EXC_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)\b.*")


def tracebacks(text: str) -> list[Span]:
    """Each traceback in a text: from its header (or the 'Error ...' line just above) to the exception line."""
    lines = lines_of(text)
    out: list[Span] = []
    i = 0
    while i < len(lines):
        if not _TRACEBACK.match(lines[i]):
            i += 1
            continue
        first = i
        if i > 0 and re.match(r"^\s*Error\b", lines[i - 1]):
            first = i - 1  # "Error processing publish message" announces the traceback
        end = next((j for j in range(i + 1, min(len(lines), i + 400)) if _EXC_LINE.match(lines[j])), None)
        last = end if end is not None else min(len(lines) - 1, i + 1)
        out.append(span(lines, first + 1, last + 1))
        i = last + 1
    return out


# An agent saying in its own words that it could not do something (never matched inside a tool's
# output, which quotes web pages and files).
_CANNOT = re.compile(
    r"\b(?:I|we) (?:cannot|can't|can not|am unable to|was unable to|were unable to|could not|couldn't|"
    r"am not able to|was not able to|don't have (?:the ability|access)|do not have (?:the ability|access))"
    r"(?: to)? (?:directly )?(?:access|open|load|retrieve|view|browse|download|read|reach|find|locate|play|listen|"
    r"run|execute)\b",
    re.IGNORECASE,
)


def inability(text: str) -> Span | None:
    """The first line where an agent states it cannot access / open / find something."""
    lines = lines_of(text)
    for n, line in enumerate(lines, start=1):
        if _CANNOT.search(line):
            return Span(n, n, line)
    return None
