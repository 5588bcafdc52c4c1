"""Tool calls, results and errors shown inside multi-agent chat messages (Magentic-One, AG2, MAST traces).

Who&When and MAST logs are conversations: no record says "tool call". What the messages show,
matched literally (each rule below is one pattern):

* **executed code** (AG2 / CaptainAgent, Magentic-One's Assistant -> ComputerTerminal): a
  message with fenced python / shell blocks, answered by an executor's message (``exitcode: N``,
  ``exited with Unix exit code: N``). Each block of the last such message before the executor's
  reply becomes a ``tool_call`` (tool ``python`` / the shell command), the reply its result
  (``error`` when the exit code is not 0 or it prints a traceback). Blocks nobody executed stay text.
* **browser and file actions** (Magentic-One's WebSurfer / FileSurfer): the reply's first line
  says what was done (``I typed 'X' into the browser search bar.``, ``I clicked 'X'.``,
  ``I scrolled down one page in the browser.``, ``Address: file:///...``): a ``tool_call`` for
  that line (tool ``web_search``, ``web_click``, ``web_scroll_down``, ``open_file``, ...), the
  rest of the message its ``tool_result`` (``error`` for an error page: ``Error 404``, ``Access
  Denied``, ...).
* **harness tracebacks** printed into a message (``Error processing publish message`` and a
  Python traceback): an ``error`` by ``harness`` over exactly those lines.
* **an agent saying it cannot access / open / find something** in its own words (never inside a
  tool's output): an ``error`` with ``detail = reported_failure`` over that line.

Each derived event's ref is the message's string pointer plus the exact ``#La-Lb`` lines; the
message event stays as it was and every derived event carries its step index.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.adapters.base import Emitter, args_digest, looks_like_error
from pipeline.adapters.contract import SourceEvent
from pipeline.adapters.embedded import (
    CodeBlock,
    Span,
    call_event,
    executable_blocks,
    exit_code,
    inability,
    lines_of,
    result_event,
    span,
    sub_event,
    tracebacks,
)


@dataclass(frozen=True)
class ChatTurn:
    """One message of a chat log, and how to point into the string that holds its text.

    ``ptr`` is the pointer of that string (``/history/3/content``, ``/2/trace``); ``offset`` the
    line of that string where the text's first line is (1 when the text is the whole string).
    """

    step: int
    actor: str
    text: str
    ptr: str
    offset: int = 1
    line: int | None = None  # JSON Lines document line, when the file is JSONL
    inner: str = ""  # pointer into a string that holds JSON (MAST: "#/trajectory/3/content")
    executor: bool | None = None  # the reader already knows this turn is tool output (None: decide here)


# Speakers that only ever report execution (their every message is tool output), and speakers that
# may also just talk (a proxy handing over the task): those need an exit code or code to answer.
_TERMINAL = re.compile(r"terminal|code_?exec", re.IGNORECASE)
_EXECUTOR = re.compile(r"terminal|executor|code_?exec|user_?proxy", re.IGNORECASE)
_WEB = re.compile(r"websurfer|web_?surfer|browser", re.IGNORECASE)
_FILE = re.compile(r"filesurfer|file_?surfer", re.IGNORECASE)
_SPEAKERS_NOT_AGENTS = {"human", "user", "system", "harness", "environment", "tool", ""}

# First line of a WebSurfer reply -> (tool, argument groups)
_WEB_ACTIONS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"^I typed '(?P<arg>.*)' into the browser search bar\.?$"), "web_search"),
    (re.compile(r"^I typed '(?P<arg>.*)' into the browser address bar\.?$"), "web_open_url"),
    (re.compile(r"^I typed '(?P<arg>.*)' into '(?P<field>.*)'\.?$"), "web_type"),
    (re.compile(r"^I clicked '(?P<arg>.*)'\.?$"), "web_click"),
    (re.compile(r"^I clicked (?P<arg>the control)\.?$"), "web_click"),
    (re.compile(r"^I scrolled (?P<arg>down|up) one page in the browser\.?$"), "web_scroll"),
    (re.compile(r"^I input '(?P<arg>.*)'\.?$"), "web_input"),
    (re.compile(r"^I (?P<verb>[a-z]+(?: [a-z]+)?) '(?P<arg>.*)'\.?$"), "web_action"),
]
_FILE_OPEN = re.compile(r"^Address: (?P<arg>\S+)\s*$")
# Error pages as a browser shows them (titles and banners, not any mention of a number).
_ERROR_PAGE = re.compile(
    r"\bError 404\b|\b404 Not Found\b|\b404 - (?:Page )?Not Found\b|\b403 Forbidden\b|\bAccess Denied\b|"
    r"\bPage Not Found\b|This site can.t be reached|\bERR_[A-Z_]{4,}\b|\b(?:429 )?Too Many Requests\b|"
    r"verify you are (?:a )?human|\bAre you a robot\b",
    re.IGNORECASE,
)


def is_executor(actor: str, text: str) -> bool:
    """A code executor's reply: its name says so, or it opens with AG2's ``exitcode:`` line."""
    return bool(_EXECUTOR.search(actor.replace(" ", ""))) or text.lstrip().startswith("exitcode:")


def _norm(actor: str) -> str:
    return re.sub(r"[\s_-]+", "", actor).lower()


def web_action(first_line: str) -> tuple[str, dict[str, str]] | None:
    """(tool, arguments) of a WebSurfer reply's first line, when it states an action."""
    line = first_line.strip()
    for pat, tool in _WEB_ACTIONS:
        m = pat.match(line)
        if m:
            args = {k: v for k, v in m.groupdict().items() if v is not None}
            if tool == "web_action":
                tool = "web_" + args.pop("verb").replace(" ", "_")
            return tool, args
    return None


class _Sub:
    """Events inside one turn: spans of the turn's text mapped onto the string the pointer names."""

    def __init__(self, em: Emitter, turn: ChatTurn) -> None:
        self.em, self.turn = em, turn

    def at(self, part: Span) -> Span:
        k = self.turn.offset - 1
        return Span(part.first + k, part.last + k, part.text)

    def event(self, kind: str, part: Span, **fields: object) -> SourceEvent:
        t = self.turn
        return sub_event(self.em, kind, t.ptr, self.at(part), line=t.line, inner=t.inner, **fields)


def _executor_result(em: Emitter, t: ChatTurn, call_id: str | None, tool: str | None) -> tuple[SourceEvent, bool]:
    lines = lines_of(t.text)
    whole = span(lines, 1, len(lines))
    code = exit_code(t.text)
    failed = code != 0 if code is not None else looks_like_error(t.text)
    sub = _Sub(em, t)
    ev = result_event(
        em,
        t.ptr,
        sub.at(whole),
        failed=failed,
        call_id=call_id,
        actor=t.actor,
        step=t.step,
        tool_name=tool or "code_execution",
        detail=f"exit code {code}" if code is not None else None,
        line=t.line,
        inner=t.inner,
    )
    return ev, failed


def _surfer_events(em: Emitter, t: ChatTurn, web: bool) -> list[SourceEvent]:
    lines = lines_of(t.text)
    first = lines[0] if lines else ""
    if web:
        found = web_action(first)
    else:
        m = _FILE_OPEN.match(first)
        found = ("open_file", {"arg": m.group("arg")}) if m else None
    if found is None:
        return []
    tool, args = found
    sub = _Sub(em, t)
    cid = f"s{t.step}"
    target = args.get("arg") if tool in ("open_file", "web_open_url") else None
    out = [
        sub.event(
            "tool_call",
            Span(1, 1, first),
            actor=t.actor,
            step_index=t.step,
            tool_name=tool,
            call_id=cid,
            args_digest=args_digest(args),
            target=target,
            text=first.strip(),
            detail="stated_action",
        )
    ]
    if len(lines) > 1 and any(x.strip() for x in lines[1:]):
        rest = span(lines, 2, len(lines))
        body = rest.text
        # The page text minus any harness traceback printed into it (that is reported on its own).
        failed = bool(_ERROR_PAGE.search(body[:3000]))
        out.append(
            result_event(
                em,
                t.ptr,
                sub.at(rest),
                failed=failed,
                call_id=cid,
                actor=t.actor,
                step=t.step,
                tool_name=tool,
                detail="page" if web else "file",
                line=t.line,
                inner=t.inner,
            )
        )
    return out


def derive(em: Emitter, turns: list[ChatTurn]) -> tuple[dict[int, list[SourceEvent]], dict[int, SourceEvent]]:
    """Derived events per turn (emitted after the turn's own event), and executor turns' result events.

    An executor turn's result replaces that turn's plain event (the reply is wholly tool output);
    every other turn keeps its message event and gets the derived events after it.
    """
    extra: dict[int, list[SourceEvent]] = {}
    results: dict[int, SourceEvent] = {}
    pending: tuple[ChatTurn, list[CodeBlock]] | None = None  # code written since the last execution
    for t in turns:
        evs: list[SourceEvent] = []
        exe = t.executor if t.executor is not None else is_executor(t.actor, t.text)
        quiet = pending is None and not _TERMINAL.search(t.actor.replace(" ", ""))
        if exe and t.executor is None and exit_code(t.text) is None and (executable_blocks(t.text) or quiet):
            # An executor agent writing the code it will run (HyperAgent's inner assistant), or a
            # proxy speaking with no code to run (AG2's user_proxy handing over the task): no result.
            exe = False
        if exe:
            call_id = tool = None
            if pending is not None:
                author, blocks = pending
                calls = [
                    call_event(
                        em,
                        author.ptr,
                        _shift(b, author.offset),
                        call_id=f"c{author.step}-{k}",
                        actor=author.actor,
                        step=author.step,
                        line=author.line,
                        inner=author.inner,
                    )
                    for k, b in enumerate(blocks)
                ]
                extra.setdefault(author.step, []).extend(calls)
                call_id, tool = calls[-1].call_id, calls[-1].tool_name
                pending = None
            results[t.step], _ = _executor_result(em, t, call_id, tool)
        else:
            blocks = executable_blocks(t.text)
            if blocks:
                pending = (t, blocks)
            norm = _norm(t.actor)
            if _WEB.search(norm) or _FILE.search(norm):
                evs.extend(_surfer_events(em, t, web=bool(_WEB.search(norm))))
            elif norm not in _SPEAKERS_NOT_AGENTS:
                said = inability(_without_code(t.text))
                if said is not None:
                    evs.append(
                        _Sub(em, t).event(
                            "error",
                            said,
                            actor=t.actor,
                            step_index=t.step,
                            detail="reported_failure",
                            text=said.text.strip(),
                        )
                    )
        for tb in tracebacks(t.text):
            if results.get(t.step) is not None:
                break  # an executor's traceback is its result's failure, not a harness error
            evs.append(
                _Sub(em, t).event(
                    "error", tb, actor="harness", step_index=t.step, detail="harness_traceback", text=tb.text
                )
            )
        if evs:
            extra.setdefault(t.step, []).extend(evs)
    for step, evs in extra.items():
        evs.sort(key=_in_text_order)
        extra[step] = evs
    return extra, results


def _in_text_order(e: SourceEvent) -> int:
    m = re.search(r"#L(\d+)-L\d+$", e.json_pointer or "")
    return int(m.group(1)) if m else 0


def _shift(b: CodeBlock, offset: int) -> CodeBlock:
    k = offset - 1
    return CodeBlock(Span(b.span.first + k, b.span.last + k, b.span.text), b.lang, b.code)


def _without_code(text: str) -> str:
    # Blank out fenced blocks (keeping line numbers): code and pasted output are not the agent's words.
    lines = lines_of(text)
    inside = False
    for i, line in enumerate(lines):
        if line.strip().startswith("```"):
            inside = not inside
            lines[i] = ""
        elif inside:
            lines[i] = ""
    return "\n".join(lines)


Deriver = Callable[[Emitter, list[ChatTurn]], tuple[dict[int, list[SourceEvent]], dict[int, SourceEvent]]]
