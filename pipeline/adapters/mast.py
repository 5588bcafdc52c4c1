"""MAST / MAD human-labelled traces: raw multi-agent logs split into speaker turns.

The file is a JSON list of ``{mas_name, benchmark_name, trace_id, round, trace, annotations}``,
where ``trace`` is one raw log per run in one of seven multi-agent styles.

Splitting a trace into speaker turns works on the trace's own lines:

* a JSON trace (HyperAgent, AG2) contributes its ``trajectory``: a list of messages (one turn
  each) or a list of log lines (split like text); its ``problem_statement`` is a context message;
  ``note`` and ``other_data`` (annotators' notes, gold answer / patch) are labels;
* a text trace that ends with ``Evaluation`` and a JSON verdict (AppWorld's evaluator) has that
  trailer cut off into the sidecar (``trace_labels.trace_evaluation``): it is an outcome;
* a JSON trace with a ``content`` log (MetaGPT) is split inside that string;
* a text trace is split at header lines. Each known style is a set of header patterns (loguru
  lines of MetaGPT / OpenManus, HyperAgent log lines, AppWorld's "Response from X Agent",
  ChatDev's "[ts INFO] Role: ", autogen's "a (to b):", Magentic-One's "---------- X ----------");
  the style with the most header lines wins; lines before the first header form a preamble turn;
  with no header at all the trace is one turn.

Refs: the file line holding the trace, pointer ``/<i>/trace`` and a suffix inside the string:
``#L<a>-L<b>`` (lines of the decoded trace) or ``#/content#L<a>-L<b>`` (lines of a string inside a
JSON trace). Step index = 0-based turn number (the source numbers nothing).

Annotators' votes go to the sidecar as ``failure_modes`` keyed by MAST-14 mode (mapped through
``mast_taxonomy_crosswalk.json`` when it is among the raw files), with the 2-of-3 majority.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.adapters.base import (
    Adapter,
    CellSource,
    Discovery,
    Emitter,
    Score,
    args_digest,
    load_json,
    looks_like_error,
)
from pipeline.adapters.chat_actions import ChatTurn, derive
from pipeline.adapters.contract import SourceEvent
from pipeline.adapters.spans import LineIndex, value_spans
from pipeline.core.canonical import read_json, sha256_text

NAME = "mast"

_LOGURU = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[.,]\d+ \| (?P<level>\w+)\s*\| (?P<src>[\w.<>]+):[\w<>]+:\d+ - (?P<msg>.*)$"
)
_STYLES: dict[str, list[re.Pattern[str]]] = {
    "loguru": [_LOGURU],
    "hyperagent": [re.compile(r"^HyperAgent_\S+ - (?P<level>[A-Z]+) - (?P<msg>.*)$")],
    "appworld": [
        re.compile(r"^\s*Response from (?P<actor>.+?) Agent\s*$"),
        re.compile(r"^\s*Message to (?P<to>.+?) Agent\s*$"),
        re.compile(r"^\s*(?P<exec>Code Execution Output)\s*$"),
        re.compile(r"^\s*(?P<loop>(?:Entering|Exiting) .+? Agent message loop)\s*$"),
        re.compile(r"^\*{5,} (?P<task>Task .*?)\s*\*{5,}\s*$"),
    ],
    "chatdev": [
        re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d INFO\] (?P<actor>[^:\n*\[]{1,60}?): ?(?P<msg>.*)$"),
        re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d INFO\] (?P<note>.*)$"),
    ],
    "autogen": [re.compile(r"^(?P<actor>[\w .@-]{1,60}?) \(to (?P<to>[\w .@-]{1,60})\):\s*$")],
    "magentic": [
        re.compile(r"^-{5,}\s*(?P<actor>[^-].*?)\s*-{5,}\s*$"),
        re.compile(
            r"^(?P<actor>[A-Z]\w*(?:Orchestrator|Surfer|Terminal|Coder|Executor))\s*(?:\((?P<sub>[^)]*)\))?:(?:\s|$)"
        ),
    ],
}
_ROLE_IN_MSG = re.compile(r"^(?:\S+ )?(?P<name>[A-Z][\w]*)\((?P<role>[\w ]+)\):")
_MANUS = re.compile(r"^\W*\s*(?P<actor>[A-Z][\w]*)(?:'s thoughts| selected)")
_HANDOFF = re.compile(r"^(?P<actor>[\w-]+)->(?P<to>[\w-]+):")
_RESPONSE = re.compile(r"^(?P<actor>[\w-]+)'s Response:")


@dataclass
class Turn:
    """One speaker turn: lines ``first..last`` (1-based) of the unit it was split from."""

    first: int
    last: int
    text: str
    actor: str | None
    kind: str = "message"
    detail: str | None = None
    target: str | None = None
    tool_name: str | None = None
    args: Any = None
    inner: str | None = None  # where the text sits verbatim: a pointer suffix into the trace (None: not verbatim)


def _header(style: str, line: str) -> re.Match[str] | None:
    for pat in _STYLES[style]:
        m = pat.match(line)
        if m:
            return m
    return None


def choose_style(lines: list[str]) -> str | None:
    """The log style with the most header lines (None when no line is a header)."""
    best, count = None, 0
    for style in _STYLES:
        n = sum(1 for ln in lines if _header(style, ln))
        if n > count:
            best, count = style, n
    return best


def _classify(style: str, m: re.Match[str], block: str) -> dict[str, Any]:
    g = m.groupdict()
    if style == "appworld":
        if g.get("exec"):
            return {"actor": "environment", "kind": "tool_result", "tool_name": "code_execution"}
        if g.get("to"):
            return {"actor": "caller", "detail": "message_to", "target": g["to"]}
        if g.get("loop") or g.get("task"):
            return {"actor": "harness", "kind": "other", "detail": (g.get("loop") or g.get("task") or "")[:60]}
        return {"actor": g.get("actor")}
    msg = g.get("msg") or ""
    if style == "hyperagent":
        if hm := _HANDOFF.match(msg):
            return {"actor": hm.group("actor"), "detail": "handoff", "target": hm.group("to")}
        if rm := _RESPONSE.match(msg):
            return {"actor": rm.group("actor")}
        return {"actor": "harness", "kind": "other"}
    if style == "loguru":
        if rm := _ROLE_IN_MSG.match(msg):
            return {"actor": f"{rm.group('name')}({rm.group('role')})"}
        if "Tool arguments:" in msg:
            raw = msg.split("Tool arguments:", 1)[1].strip() + block
            return {"actor": "agent", "kind": "tool_call", "args": raw.strip()}
        if "completed its mission" in msg or "Observed output of cmd" in msg:
            tool = re.search(r"`?'?(\w+)'? (?:completed|executed)", msg)
            return {"actor": "environment", "kind": "tool_result", "tool_name": tool.group(1) if tool else None}
        if mm := _MANUS.match(msg):
            return {"actor": mm.group("actor")}
        return {"actor": g.get("src"), "kind": "other", "detail": g.get("level")}
    if style == "chatdev" and g.get("note") is not None:
        return {"actor": "harness", "kind": "other"}
    return {"actor": g.get("actor"), "target": g.get("to"), "detail": g.get("sub")}


def split_lines(lines: list[str]) -> list[Turn]:
    """Split log lines into turns at the chosen style's header lines (see module doc)."""
    style = choose_style(lines)
    starts: list[tuple[int, re.Match[str] | None]] = []
    if style is not None:
        starts = [(i, m) for i, ln in enumerate(lines) if (m := _header(style, ln))]
    if not starts or starts[0][0] != 0:
        first_nonblank = next((i for i, ln in enumerate(lines) if ln.strip()), None)
        if first_nonblank is not None and (not starts or first_nonblank < starts[0][0]):
            starts.insert(0, (first_nonblank, None))
    turns: list[Turn] = []
    for k, (i, m) in enumerate(starts):
        end = starts[k + 1][0] if k + 1 < len(starts) else len(lines)
        last = end - 1
        while last > i and not lines[last].strip():
            last -= 1
        text = "\n".join(lines[i : last + 1])
        info: dict[str, Any] = (
            {"actor": None, "detail": "preamble"}
            if m is None
            else _classify(style or "", m, "\n".join(lines[i + 1 : last + 1]))
        )
        turns.append(Turn(first=i + 1, last=last + 1, text=text, **info))
    return turns


def _content_lines(content: Any) -> str:
    return "\n".join(content) if isinstance(content, list) else str(content or "")


def _evaluation_trailer(lines: list[str]) -> int | None:
    """Index of an ``Evaluation`` line followed by one JSON object up to the end (AppWorld's verdict)."""
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].strip() == "Evaluation":
            try:
                json.loads("\n".join(lines[i + 1 :]))
            except json.JSONDecodeError:
                return None
            return i
    return None


def split_trace(trace: str) -> tuple[list[tuple[str, Turn]], dict[str, Any], str]:
    """Turns of one trace as (suffix prefix, turn), the JSON trace's label parts, and its task text."""
    labels: dict[str, Any] = {}
    task = ""
    try:
        doc = json.loads(trace)
    except json.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict):
        lines = trace.split("\n")
        cut = _evaluation_trailer(lines)
        if cut is not None:  # the benchmark's verdict, appended to the log: an outcome, not a turn
            labels["trace_evaluation"] = json.loads("\n".join(lines[cut + 1 :]))
            lines = lines[:cut]
        turns = split_lines(lines)
        for t in turns:
            t.inner = ""  # a text trace: each turn is lines first..last of the trace itself
        return [("", t) for t in turns], labels, task
    labels = {k: doc[k] for k in ("note", "other_data", "cost") if k in doc}
    task = _content_lines(doc.get("problem_statement") or doc.get("prompt") or "")
    index = LineIndex(trace)
    spans = value_spans(trace, 3)
    out: list[tuple[str, Turn]] = []
    if "problem_statement" in doc or "prompt" in doc:
        key = "problem_statement" if "problem_statement" in doc else "prompt"
        a, b = index.span(*spans[f"/{key}"])
        out.append(("", Turn(a, b, task, "user", detail="task")))
    traj = doc.get("trajectory")
    if isinstance(traj, list) and traj and all(isinstance(x, dict) for x in traj):
        for j, msg in enumerate(traj):
            a, b = index.span(*spans[f"/trajectory/{j}"])
            text = _content_lines(msg.get("content"))
            kind = "tool_result" if looks_like_error(text) and msg.get("role") == "user" else "message"
            inner = f"#/trajectory/{j}/content" if isinstance(msg.get("content"), str) else None
            actor = str(msg.get("name") or msg.get("role"))
            out.append(("", Turn(a, b, text, actor, kind=kind, detail=msg.get("role"), inner=inner)))
    elif isinstance(traj, list):
        # One log line per array element, each on its own line of the pretty-printed trace.
        elem_lines = [index.span(*spans[f"/trajectory/{j}"])[0] for j in range(len(traj))]
        for t in split_lines([str(x) for x in traj]):
            a, b = t.first - 1, t.last - 1
            # The turn's text lines are the trace's own lines when each element is one line of it.
            verbatim = all("\n" not in str(x) for x in traj[a : b + 1]) and elem_lines[a : b + 1] == list(
                range(elem_lines[a], elem_lines[a] + b - a + 1)
            )
            turn = Turn(elem_lines[a], elem_lines[b], t.text, t.actor, t.kind, t.detail, t.target, t.tool_name, t.args)
            turn.inner = "" if verbatim else None
            out.append(("", turn))
    elif isinstance(doc.get("content"), str):
        for t in split_lines(doc["content"].split("\n")):
            t.inner = "#/content"
            out.append(("#/content", t))
    return out, labels, task


def _crosswalk(bundle: Path, paths: list[str]) -> dict[str, str]:
    for rel in paths:
        if rel.endswith("mast_taxonomy_crosswalk.json"):
            try:
                data = read_json(bundle / rel)
            except (ValueError, UnicodeDecodeError):
                return {}  # a damaged crosswalk: votes keep their source titles
            if not isinstance(data, dict):
                return {}
            table: dict[str, str] = {}
            for key in ("map_round1_to_mast14", "map_round2_3_to_mast14"):
                table.update(data.get(key) or {})
            for m in data.get("mast14") or []:
                title = f"{m['code']} {m['name']}"
                table[title] = title
            return table
    return {}


def failure_modes(annotations: list[Any], crosswalk: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Votes per failure mode (MAST-14 title when the crosswalk knows it), with the 2-of-3 majority."""
    modes: dict[str, dict[str, Any]] = {}
    for a in annotations:
        if not isinstance(a, dict):
            continue
        title = " ".join(str(a.get("failure mode", "")).split("\n", 1)[0].split())
        name = crosswalk.get(title) or (f"unmapped: {title}" if crosswalk else title)
        votes = [bool(a[k]) for k in sorted(a) if k.startswith("annotator")]
        modes[name] = {"votes": votes, "majority": sum(votes) * 2 > len(votes), "source_title": title}
    return modes


def sniff(rel: str, head: str) -> bool:
    """A JSON list of records with ``trace`` and ``annotations``."""
    return rel.endswith(".json") and '"trace"' in head and ('"mas_name"' in head or '"trace_id"' in head)


def score(rel: str, head: str) -> Score:
    """MAD records: ``trace`` with ``mas_name`` (or ``trace_id``)."""
    if not sniff(rel, head):
        return 0.0, ""
    return (
        (0.9, "records with trace and mas_name") if '"mas_name"' in head else (0.7, "records with trace and trace_id")
    )


def discover(bundle: Path, paths: list[str]) -> Discovery:
    """One cell per record."""
    cells: list[CellSource] = []
    skipped: list[tuple[str, str]] = []
    cw = _crosswalk(bundle, paths)
    for rel in paths:
        doc = None
        if rel.endswith(".json"):
            try:
                doc = load_json(bundle / rel, 2).docs[0][1]
            except (ValueError, UnicodeDecodeError):
                doc = None
        if not (
            isinstance(doc, list) and doc and all(isinstance(r, dict) and isinstance(r.get("trace"), str) for r in doc)
        ):
            skipped.append((rel, "not a list of MAST trace records"))
            continue
        for i, rec in enumerate(doc):
            turns, trace_labels, task = split_trace(rec["trace"])
            anns = rec.get("annotations") or []
            texts = [str(a.get("failure mode")) for a in anns if isinstance(a, dict)]
            for v in trace_labels.values():
                if isinstance(v, dict) and isinstance(v.get("text"), list):
                    texts.extend(t for t in v["text"] if isinstance(t, str) and len(t) > 20)
            if "trace_evaluation" in trace_labels:
                texts.append(json.dumps(trace_labels["trace_evaluation"], indent=4)[:300])
            mas = str(rec.get("mas_name") or "MAS")
            cells.append(
                CellSource(
                    run_id=f"trace-{rec.get('trace_id', i)}",
                    task_id=f"{rec.get('benchmark_name') or 'task'}-{rec.get('trace_id', i)}",
                    path=rel,
                    selector={"index": i},
                    files=[rel],
                    harness=mas,
                    task_summary=task[:500],
                    step_index_base=0,
                    source_steps=len(turns),
                    outcome={
                        "label": None,
                        "failure_modes": failure_modes(anns, cw),
                        "annotations": anns,
                        "trace_labels": trace_labels,
                        **{k: rec[k] for k in ("mas_name", "benchmark_name", "trace_id", "round") if k in rec},
                    },
                    label_texts=[t for t in texts if len(t) > 20],
                    content_key=sha256_text(rec["trace"]),
                    label_keys=[str(rec.get("trace_id", i))],
                )
            )
    harnesses = sorted({c.harness for c in cells if c.harness})
    aux = [rel for rel in paths if rel.endswith("mast_taxonomy_crosswalk.json") and cw]
    return Discovery(
        cells=cells, skipped=skipped, harness="MAST traces: " + ", ".join(harnesses) if harnesses else None, aux=aux
    )


def read(bundle: Path, cell: dict[str, Any]) -> Iterator[SourceEvent]:
    """Events of one record's trace, one per turn."""
    em = Emitter(bundle, cell["path"], max_depth=2)
    i = int((cell.get("selector") or {})["index"])
    rec = em.doc()[i]
    turns, _, _ = split_trace(rec["trace"])
    base = f"/{i}/trace"
    chat = [
        ChatTurn(
            step=step,
            actor=t.actor or "",
            text=t.text,
            ptr=base,
            offset=t.first if t.inner in ("", "#/content") else 1,
            inner=t.inner,
            executor=t.kind == "tool_result" or None,
        )
        for step, (_, t) in enumerate(turns)
        if t.inner is not None and t.kind in ("message", "tool_result")
    ]
    extra, results = derive(em, chat)
    for step, (prefix, t) in enumerate(turns):
        ev = em.event(t.kind, base, actor=t.actor, detail=t.detail, target=t.target, step_index=step, text=t.text)
        ev.json_pointer = f"{base}{prefix}#L{t.first}-L{t.last}"
        res = results.get(step)
        if res is not None and t.kind == "message":  # an executor's turn is the result of the code before it
            ev.kind, ev.detail, ev.call_id = res.kind, res.detail, res.call_id
            ev.tool_name, ev.result_digest = res.tool_name, sha256_text(t.text)
        if t.kind == "tool_call":
            ev.tool_name = t.tool_name
            ev.args_digest = args_digest(t.args)
        elif t.kind == "tool_result":
            ev.tool_name = t.tool_name
            ev.result_digest = sha256_text(t.text)
            if looks_like_error(t.text):
                ev.kind, ev.detail = "error", "tool_error"
        yield ev
        yield from extra.get(step, [])


ADAPTER = Adapter(
    name=NAME,
    description="MAST/MAD human-labelled traces (raw multi-agent logs split into turns; failure-mode votes as labels)",
    sniff=sniff,
    score=score,
    detects="*.json lists of records with trace and mas_name",
    discover=discover,
    read=read,
)
