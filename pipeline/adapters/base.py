"""What every adapter shares: the cell description found at import time and an event builder.

An adapter module exposes one :class:`Adapter`: ``sniff`` (does this file look like my format?),
``discover`` (which runs are in these raw files, with their outcome labels) and ``read`` (the
IR events of one cell). Import writes what ``discover`` found into the request's ``source``
block, so ``read`` later needs nothing but the frozen bundle.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pipeline.adapters.contract import SourceEvent
from pipeline.adapters.spans import JsonFile
from pipeline.core.canonical import digest, sha256_text
from pipeline.core.limits import check_size


@dataclass
class CellSource:
    """One run found in the raw files: where it is, what it is, and its outcome labels."""

    run_id: str
    task_id: str
    path: str  # primary raw file, bundle-relative (raw/...)
    selector: dict[str, Any] = field(default_factory=dict)  # which part of the file(s) is this run
    files: list[str] = field(default_factory=list)  # every raw file the run reads from
    harness: str | None = None
    task_summary: str = ""
    step_index_base: int | None = None
    source_steps: int = 0  # steps as the source counts them (tests compare the IR to this)
    eligibility: Literal["valid_behavior", "excluded"] = "valid_behavior"
    exclusion_reason: str | None = None
    outcome: dict[str, Any] = field(default_factory=dict)  # label, quality, ... and label fields
    label_texts: list[str] = field(default_factory=list)  # label values that must never reach events
    content_key: str | None = None  # digest of the run's records: the same run found twice is one cell
    label_keys: list[str] = field(default_factory=list)  # ids a separate label file may use for this run


@dataclass
class Discovery:
    """What one adapter found under ``raw/``."""

    cells: list[CellSource]
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, why it holds no run)
    harness: str | None = None
    warnings: list[tuple[str, str]] = field(default_factory=list)  # (path, what was left out of a run file)
    aux: list[str] = field(default_factory=list)  # files read for outcomes or mappings, not runs (kept in raw/)


# How sure an adapter is that a file is its format (0..1) and why, in a few words.
Score = tuple[float, str]


@dataclass(frozen=True)
class Adapter:
    """One trajectory format, registered under the ``lunasol.formats`` entry point (docs/adapters.md)."""

    name: str
    description: str
    sniff: Callable[[str, str], bool]  # (relative path, head of text) -> looks like this format
    discover: Callable[[Path, list[str]], Discovery]  # (bundle, raw paths) -> runs
    read: Callable[[Path, dict[str, Any]], Iterator[SourceEvent]]  # (bundle, cell source block) -> events
    # (relative path, head of text) -> (score, reason) from the format's distinctive fields; None:
    # 0.5 when ``sniff`` matches (adapters written before scores)
    score: Callable[[str, str], Score] | None = None
    detects: str = ""  # what files it claims, for `lunasol formats`

    def sureness(self, rel: str, head: str) -> Score:
        """:attr:`score`, or 0.5 / 0 from ``sniff`` for an adapter that has none."""
        if self.score is not None:
            return self.score(rel, head)
        return (0.5, "its sniff matched") if self.sniff(rel, head) else (0.0, "")


_JSON_CACHE: dict[tuple[str, int, int], JsonFile] = {}


def load_json(path: Path, max_depth: int = 4, source: str | None = None) -> JsonFile:
    """Parse a JSON / JSONL file once per process (keyed by path, size and mtime).

    ``source`` names the file in errors (default: its name); sizes are bounded (pipeline.core.limits).
    """
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    jf = _JSON_CACHE.get(key)
    if jf is None or jf.max_depth < max_depth:
        where = source or path.name
        check_size(st.st_size, "LUNASOL_MAX_FILE_BYTES", where, "the file")
        jf = JsonFile(path.read_text(encoding="utf-8"), max_depth=max_depth, source=where)
        if len(_JSON_CACHE) > 64:
            _JSON_CACHE.clear()
        _JSON_CACHE[key] = jf
    return jf


def first_docs(
    bundle: Path,
    paths: list[str],
    skipped: list[tuple[str, str]],
    *,
    max_depth: int,
    suffix: str = ".json",
    wrong_suffix: str = "not a JSON file",
) -> Iterator[tuple[str, Any]]:
    """(path, first parsed document) of each path ending in ``suffix``; the others go to ``skipped``.

    A path with another ending is skipped as ``wrong_suffix``, one that does not parse as "not
    valid JSON". Lazy, so what the caller skips for its own reasons keeps the order of ``paths``.
    """
    for rel in paths:
        if not rel.endswith(suffix):
            skipped.append((rel, wrong_suffix))
            continue
        try:
            doc = load_json(bundle / rel, max_depth, rel).docs[0][1]
        except (ValueError, UnicodeDecodeError):
            skipped.append((rel, "not valid JSON"))
            continue
        yield rel, doc


def skipped_lines_warning(rel: str, lines: list[int], what: str = "records") -> tuple[str, str]:
    """The warning for lines of a JSON Lines file that were left out: how many, and which."""
    shown = ", ".join(str(n) for n in lines[:5]) + (f" and {len(lines) - 5} more" if len(lines) > 5 else "")
    return rel, f"{len(lines)} line(s) are not {what} and were skipped (line {shown})"


def joined_harnesses(cells: list[CellSource]) -> str | None:
    """The batch's harness names, sorted and joined with " + " (None when no cell names one)."""
    return " + ".join(sorted({c.harness for c in cells if c.harness})) or None


def flag_label(passed: Any) -> str | None:
    """Outcome label from a pass/fail flag: None when the source says nothing."""
    return None if passed is None else ("completed" if passed else "workflow_failed")


def score_label(score: float | None) -> str | None:
    """Outcome label from a score: a full score (1.0 or more) is ``completed``."""
    return flag_label(None if score is None else score >= 1.0)


def json_text(value: Any) -> str:
    """A JSON value as event text: sorted keys, non-ASCII kept as written."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def as_dict(value: Any) -> dict[str, Any]:
    """``value`` when it is a JSON object, else an empty dict (foreign logs omit or null fields)."""
    return value if isinstance(value, dict) else {}


def as_text(value: Any) -> str:
    """Message content of any common shape as plain text (strings, content-part lists, objects)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for item in value:
            if isinstance(item, dict):
                if "text" in item and isinstance(item["text"], str):
                    parts.append(item["text"])
                elif item.get("type") in ("tool_use", "tool_result", "image", "thinking", "reasoning"):
                    continue  # rendered as their own events by the adapters that know them
                else:
                    parts.append(json_text(item))
            else:
                parts.append(as_text(item))
        return "\n".join(p for p in parts if p)
    return json_text(value)


def args_digest(args: Any) -> str:
    """Digest of tool arguments; a JSON string is parsed first so equal calls digest equally."""
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return sha256_text(args)
    return digest(args)


_ERROR_MARK = re.compile(
    r"exitcode: [1-9]|\(execution failed\)|Traceback \(most recent call last\)|^\s*Error:|\bERROR\b|"
    r"command not found|No such file or directory|\bException:|\[Errno \d+\]",
    re.MULTILINE,
)


def looks_like_error(text: str) -> bool:
    """Deterministic error-output check for tool results that carry no explicit error flag."""
    return bool(_ERROR_MARK.search(text[:4000]))


class Emitter:
    """Builds SourceEvents for one raw JSON file, each with the exact lines and pointer of its element."""

    def __init__(self, bundle: Path, rel: str, max_depth: int = 4) -> None:
        self.rel = rel
        self.jf = load_json(bundle / rel, max_depth, rel)

    def doc(self, line: int | None = None) -> Any:
        """The parsed document (the one on ``line`` for JSON Lines)."""
        if line is None:
            return self.jf.docs[0][1]
        for ln, d in self.jf.docs:
            if ln == line:
                return d
        raise KeyError(line)

    def event(self, kind: str, ptr: str, *, line: int | None = None, **fields: Any) -> SourceEvent:
        """One event whose ref is the element at ``ptr`` (in the document on ``line`` for JSONL)."""
        loc = self.jf.locate(ptr, line)
        return SourceEvent(
            kind=kind,
            source_path=self.rel,
            line_start=loc.line_start,
            line_end=loc.line_end,
            json_pointer=self.ref_pointer(ptr),
            **fields,
        )

    def ref_pointer(self, ptr: str) -> str | None:
        """The pointer an event's ref carries for the element at ``ptr`` (None for the whole document)."""
        return ptr or None


def tool_result_event(
    em: Emitter,
    ptr: str,
    output: str,
    *,
    is_error: bool | None,
    line: int | None = None,
    **fields: Any,
) -> SourceEvent:
    """A tool output: kind ``error`` when the tool reported (or visibly printed) an error, else ``tool_result``."""
    err = looks_like_error(output) if is_error is None else is_error
    detail = fields.pop("detail", None)
    return em.event(
        "error" if err else "tool_result",
        ptr,
        line=line,
        detail="tool_error" if err else detail,
        text=output,
        result_digest=sha256_text(output),
        **fields,
    )
