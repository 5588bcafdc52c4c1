"""Aider chat histories: ``.aider.chat.history.md``.

The file is what aider appends as it runs: ``# aider chat started at <time>`` opens a session;
``#### `` starts each line the user typed; a line starting ``> `` opens aider's own output, which runs
to the first line aider ended with its two-space line break (a multi-line output, such as a test run,
is quoted on its first line only); everything else is the model's answer, in which SEARCH/REPLACE
blocks (``<<<<<<< SEARCH`` / ``=======`` / ``>>>>>>> REPLACE``, or ``ORIGINAL`` / ``UPDATED``) and
unified-diff fences are edits. Refs are line ranges (no pointer).

Events: the user's words (``message``); ``/run`` / ``/test`` / ``/lint`` / ``/web`` (a
``tool_call`` whose next output block is its ``tool_result``, ``error`` when it failed); ``/ask``,
``/code``, ``/architect``, ``/help`` (messages); other commands such as ``/add``, ``/drop``,
``/undo``, ``/clear`` (``state_change``); the answer's prose (``message``) and each edit block
(``tool_call`` ``edit`` with the file as target), whose output block is their result (``error`` when
aider could not apply it); other output (``other``, or ``error`` when it reports one). One cell per
session; a session in which the user typed nothing is an excluded cell. Each event's timestamp is
its session's start (the only time the file records). Cost, tokens, commits and applied or failed
edits go to the sidecar.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path, PurePosixPath
from typing import Any

from pipeline.adapters.base import Adapter, CellSource, Discovery, looks_like_error
from pipeline.adapters.contract import SourceEvent
from pipeline.core.canonical import digest, sha256_text
from pipeline.core.limits import check_size

NAME = "aider"
_HEADER = re.compile(r"^# aider chat started at (\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})")
_OUTPUT = re.compile(r"^>( |$)")
_TOOLS = {"/run": "run", "/test": "test", "/lint": "lint", "/web": "web"}
_SAYS = {"/ask", "/code", "/architect", "/help", "/context"}
_EDIT_OPEN = re.compile(r"^<{7} (SEARCH|ORIGINAL|HEAD)\s*$")
_EDIT_MID = re.compile(r"^={7}\s*$")
_EDIT_CLOSE = re.compile(r"^>{7} (REPLACE|UPDATED|updated)\s*$")
_EDIT_FAILED = re.compile(r"SearchReplaceNoExactMatch|Failed to apply edit|did not match|Malformed response", re.I)
_TEST_FAILED = re.compile(r"\b\d+ failed\b|exit code:? [1-9]|\bFAILED\b|Error:|Traceback")
_SESSION_COST = re.compile(r"Cost: \$[\d.]+ (?:request|message), \$([\d.]+) session")


def score(rel: str, head: str) -> tuple[float, str]:
    """How sure the head of a file is an aider chat history (0..1) and why."""
    if not rel.endswith((".md", ".markdown", ".txt")):
        return 0.0, "not a .md file"
    if re.search(r"^# aider chat started at \d{4}-\d{2}-\d{2}", head, re.M):
        return 0.95, "'# aider chat started at' session headers"
    if rel.rsplit("/", 1)[-1] == ".aider.chat.history.md" and re.search(r"^#### ", head, re.M):
        return 0.7, "named .aider.chat.history.md with #### user lines"
    return 0.0, "no aider session header"


def sniff(rel: str, head: str) -> bool:
    """An aider chat history."""
    return score(rel, head)[0] >= 0.5


@dataclass
class _Block:
    kind: str  # user / output / assistant / preamble
    start: int  # 1-based, inclusive
    end: int
    lines: list[str]


@dataclass
class _Session:
    start: int
    end: int
    started: str | None
    blocks: list[_Block] = field(default_factory=list)


def _text(path: Path, rel: str) -> str:
    check_size(path.stat().st_size, "LUNASOL_MAX_FILE_BYTES", rel, "the file")
    return path.read_text(encoding="utf-8")


def _sessions(text: str) -> list[_Session]:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    sessions: list[_Session] = []
    cur = _Session(1, 0, None)
    i = 0
    n = len(lines)
    while i < n:
        line = lines[i]
        m = _HEADER.match(line)
        if m:
            if cur.blocks:
                cur.end = i
                sessions.append(cur)
            cur = _Session(i + 1, 0, m.group(1).replace(" ", "T"))
            i += 1
            continue
        if not line.strip():
            i += 1
            continue
        if line.startswith("####"):
            j = i
            while j + 1 < n and lines[j + 1].startswith("####"):
                j += 1
            cur.blocks.append(
                _Block("user", i + 1, j + 1, [x[4:].removeprefix(" ").rstrip() for x in lines[i : j + 1]])
            )
            i = j + 1
            continue
        if _OUTPUT.match(line):
            j = i
            while True:
                # aider ends each output it writes with a two-space break; a multi-line output is
                # quoted on its first line only, so each output runs to that break. Outputs that
                # follow each other are one block.
                while not _closes(lines[j]) and j + 1 < n and not _starts_other(lines[j + 1]):
                    j += 1
                if j + 1 < n and _OUTPUT.match(lines[j + 1]):
                    j += 1
                    continue
                break
            cur.blocks.append(_Block("output", i + 1, j + 1, lines[i : j + 1]))
            i = j + 1
            continue
        j = i
        while j + 1 < n and not _starts_other(lines[j + 1]) and not _OUTPUT.match(lines[j + 1]):
            j += 1
        k = j
        while k > i and not lines[k].strip():
            k -= 1
        kind = "assistant" if cur.started is not None or sessions else "preamble"
        cur.blocks.append(_Block(kind, i + 1, k + 1, lines[i : k + 1]))
        i = j + 1
    if cur.blocks or cur.started is not None:
        cur.end = n
        sessions.append(cur)
    for a, b in pairwise(sessions):
        a.end = b.start - 1
    return sessions


def _closes(line: str) -> bool:
    return line.endswith("  ") and bool(line.strip())


def _starts_other(line: str) -> bool:
    return line.startswith("####") or bool(_HEADER.match(line))


@dataclass
class _Edit:
    start: int
    end: int
    path: str
    search: str
    replace: str


def _fence(line: str) -> bool:
    # Markdown fences, and the <source>/</source> fences some aider edit formats use
    return line.startswith(("```", "<source>", "</source>"))


def _edits(block: _Block) -> list[_Edit]:
    """SEARCH/REPLACE blocks and unified-diff fences of one answer, with their line ranges."""
    out: list[_Edit] = []
    lines = block.lines
    i = 0
    while i < len(lines):
        if _EDIT_OPEN.match(lines[i]):
            start = i
            fname = ""
            k = i - 1
            if k >= 0 and _fence(lines[k]):
                k -= 1
            if k >= 0 and lines[k].strip() and not _fence(lines[k]):
                fname = lines[k].strip().strip("`*:")
                start = k
            mid = next((j for j in range(i + 1, len(lines)) if _EDIT_MID.match(lines[j])), None)
            close = next((j for j in range(mid or i, len(lines)) if _EDIT_CLOSE.match(lines[j])), None)
            if mid is None or close is None:
                i += 1
                continue
            end = close + 1 if close + 1 < len(lines) and _fence(lines[close + 1]) else close
            out.append(_Edit(block.start + start, block.start + end, fname, "\n".join(lines[i + 1 : mid]),
                             "\n".join(lines[mid + 1 : close])))  # fmt: skip
            i = end + 1
            continue
        if lines[i].startswith("```diff"):
            close = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
            body = lines[i + 1 : close] if close is not None else []
            target = next((x[4:].strip().removeprefix("b/") for x in body if x.startswith("+++ ")), "")
            if close is not None and target and any(x.startswith("--- ") for x in body):
                out.append(_Edit(block.start + i, block.start + close, target, "\n".join(body), ""))
                i = close + 1
                continue
        i += 1
    return out


def _harness(session: _Session) -> str | None:
    for b in session.blocks:
        if b.kind == "output":
            for line in b.lines:
                m = re.search(r"Aider (v[\w.\-]+)", line)
                if m:
                    return f"Aider {m.group(1)}"
    return None


def _num(text: str) -> float:
    t = text.replace(",", "")
    return float(t[:-1]) * 1000 if t.endswith("k") else float(t)


def _outcome(session: _Session) -> dict[str, Any]:
    outs = "\n".join(line for b in session.blocks if b.kind == "output" for line in b.lines)
    costs = [float(m.group(1)) for m in _SESSION_COST.finditer(outs)]
    sent = received = 0.0
    for m in re.finditer(r"Tokens: ([\d.,]+k?) sent.*?, ([\d.,]+k?) received", outs):
        sent += _num(m.group(1))
        received += _num(m.group(2))
    return {
        "label": None,
        "cost": costs[-1] if costs else None,
        "tokens_sent": sent or None,
        "tokens_received": received or None,
        "commits": re.findall(r"^> Commit ([0-9a-f]{7,}) ", outs, re.M),
        "edits_applied": len(re.findall(r"Applied edit to ", outs)),
        "edits_failed": len(_EDIT_FAILED.findall(outs)),
        "model": next(iter(re.findall(r"^> (?:Main model|Models?): (.+?)\s*$", outs, re.M)), None),
    }


def discover(bundle: Path, paths: list[str]) -> Discovery:
    """One cell per session of each history file."""
    cells: list[CellSource] = []
    skipped: list[tuple[str, str]] = []
    for rel in paths:
        if not rel.endswith((".md", ".markdown", ".txt")):
            skipped.append((rel, "not an aider chat history (.md)"))
            continue
        try:
            text = _text(bundle / rel, rel)
        except (OSError, UnicodeDecodeError):
            skipped.append((rel, "not UTF-8 text"))
            continue
        if not score(rel, text[:32768])[0] >= 0.5:
            skipped.append((rel, "not an aider chat history (no '# aider chat started at' header)"))
            continue
        for s in _sessions(text):
            users = [b for b in s.blocks if b.kind == "user"]
            first = " ".join(users[0].lines)[:200] if users else ""
            run = f"{PurePosixPath(rel).parent.name or rel}@L{s.start}"
            cells.append(
                CellSource(
                    run_id=run,
                    task_id=run,
                    path=rel,
                    selector={"lines": [s.start, s.end], "started": s.started},
                    files=[rel],
                    harness=_harness(s) or "Aider",
                    task_summary=first,
                    step_index_base=0,
                    source_steps=len(s.blocks) + (1 if s.started is not None else 0),
                    eligibility="valid_behavior" if users else "excluded",
                    exclusion_reason=None if users else "the user typed nothing in this aider session",
                    outcome=_outcome(s),
                )
            )
    harness = " + ".join(sorted({c.harness for c in cells if c.harness})) or "Aider"
    return Discovery(cells=cells, skipped=skipped, harness=harness)


def _event(rel: str, kind: str, a: int, b: int, **fields: Any) -> SourceEvent:
    return SourceEvent(kind=kind, source_path=rel, line_start=a, line_end=b, **fields)


def _session_events(rel: str, s: _Session) -> Iterator[SourceEvent]:
    common: dict[str, Any] = {"ts": s.started, "session_id": f"{rel}@L{s.start}"}
    if s.started is not None:
        yield _event(rel, "state_change", s.start, s.start, actor="aider", detail="session_start",
                     text=f"aider chat started at {s.started}", state_digest=digest(["aider", rel, s.start]),
                     step_index=0, **common)  # fmt: skip
    pending: tuple[str, str, bool] | None = None  # (call id, tool, is a shell command) awaiting its output
    for n, blk in enumerate(s.blocks, start=1):
        c = {**common, "step_index": n}
        text = "\n".join(blk.lines)
        if blk.kind == "user":
            word = blk.lines[0].split(" ", 1)[0] if blk.lines and blk.lines[0].startswith("/") else ""
            rest = text[len(word) :].strip()
            call_id = f"L{blk.start}"
            if word in _TOOLS:
                args = {"command": rest}
                tool = _TOOLS[word]
                yield _event(rel, "tool_call", blk.start, blk.end, actor="user", tool_name=tool, call_id=call_id,
                             args_digest=digest(args), text=rest, detail=word, **c)  # fmt: skip
                pending = (call_id, _TOOLS[word], True)
            elif word and word not in _SAYS:
                yield _event(rel, "state_change", blk.start, blk.end, actor="user", detail=word, text=text,
                             state_digest=digest([word, rest, blk.start]), target=rest or None, **c)  # fmt: skip
                pending = None
            else:
                yield _event(rel, "message", blk.start, blk.end, actor="user", detail=word or None, text=text, **c)
                pending = None
        elif blk.kind == "assistant":
            edits = _edits(blk)
            cursor = blk.start
            for e in edits:
                if e.start > cursor:
                    yield from _prose(rel, blk, cursor, e.start - 1, c)
                args = {"path": e.path, "search": e.search, "replace": e.replace}
                yield _event(rel, "tool_call", e.start, e.end, actor="assistant", tool_name="edit",
                             call_id=f"L{e.start}", args_digest=digest(args), target=e.path or None,
                             text=f"edit {e.path}", **c)  # fmt: skip
                cursor = e.end + 1
            if cursor <= blk.end:
                yield from _prose(rel, blk, cursor, blk.end, c)
            pending = (f"L{edits[0].start}", "edit", False) if edits else None
        elif blk.kind == "output":
            yield _output_event(rel, blk, text, pending, c)
            pending = None
        else:
            yield _event(rel, "other", blk.start, blk.end, actor="aider", detail="preamble", text=text, **c)


def _prose(rel: str, blk: _Block, a: int, b: int, c: dict[str, Any]) -> Iterator[SourceEvent]:
    lines = blk.lines[a - blk.start : b - blk.start + 1]
    while lines and not lines[-1].strip():
        lines.pop()
        b -= 1
    while lines and not lines[0].strip():
        lines.pop(0)
        a += 1
    if lines:
        yield _event(rel, "message", a, b, actor="assistant", text="\n".join(lines), **c)


def _output_event(
    rel: str, blk: _Block, text: str, pending: tuple[str, str, bool] | None, c: dict[str, Any]
) -> SourceEvent:
    body = "\n".join((line[2:] if line.startswith("> ") else line.removeprefix(">")).rstrip() for line in blk.lines)
    if pending is not None:
        call_id, tool, shell = pending
        if shell:
            failed = bool(_TEST_FAILED.search(body)) or looks_like_error(body)
        else:
            failed = bool(_EDIT_FAILED.search(body)) and "Applied edit to" not in body
        kind = "error" if failed else "tool_result"
        detail = ("tool_error" if shell else "edit_failed") if failed else None
        return _event(rel, kind, blk.start, blk.end, actor="environment", call_id=call_id, tool_name=tool,
                      text=body, result_digest=sha256_text(body), detail=detail, **c)  # fmt: skip
    if re.search(r"litellm\.\w*Error|APIError|RateLimitError|^Error:|Traceback \(most recent", body, re.M):
        return _event(rel, "error", blk.start, blk.end, actor="aider", detail="aider_error", text=body, **c)
    return _event(rel, "other", blk.start, blk.end, actor="aider", detail="aider_output", text=body, **c)


def read(bundle: Path, cell: dict[str, Any]) -> Iterator[SourceEvent]:
    """Events of one session, in file order."""
    rel = cell["path"]
    a, b = (cell.get("selector") or {}).get("lines") or [1, 0]
    text = _text(bundle / rel, rel)
    for s in _sessions(text):
        if s.start == a and (s.end == b or not b):
            yield from _session_events(rel, s)
            return


ADAPTER = Adapter(
    name=NAME,
    description="Aider .aider.chat.history.md: sessions, user turns, answers, edit blocks, > output",
    sniff=sniff,
    discover=discover,
    read=read,
    score=score,
    detects=".aider.chat.history.md with '# aider chat started at' headers",
)
