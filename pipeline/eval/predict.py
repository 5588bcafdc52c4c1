"""Where each prediction source says a cell went wrong: (step index, agent) per cell, or modes per cell.

Sources, each scored separately:

* ``weakness_cards``: the first divergence of the run's weakness cards
  (``weakness-shortlist.json``: ``first_divergence.cells`` and ``event_refs``); per cell the
  earliest cited event.
* ``probe_hits``: the earliest evidence event of the deterministic probes (table ``probe_hits``,
  computed on the fly with :mod:`pipeline.probes` when the run has no such table).
* baselines, deterministic and model-free: ``first_error`` (the first ``error`` event: a tool
  result that failed or printed an error, a harness error), ``first_error_cause`` (the agent
  step just before it), ``first_step`` / ``last_step`` (the
  first / last step of a non-user actor), and for failure modes the checks in
  :func:`mode_checks` (identical repeated messages or tool calls -> step repetition; a run stopped
  at a step cap -> unaware of termination conditions).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from pipeline.artifacts.rundir import SHORTLIST, RunDir
from pipeline.core import duck
from pipeline.eval.checks import run_checks
from pipeline.eval.events import USER_ACTORS, Event
from pipeline.probes import run_probes

STEP_REPETITION = "1.3 Step Repetition"
TERMINATION = "1.5 Unaware of Termination Conditions"


@dataclass(frozen=True)
class Prediction:
    """One source's answer for one cell."""

    step: int | None
    agent: str | None
    event_id: str


def normalise_agent(name: str | None) -> str:
    """Agent names compare without role suffixes, case, spaces or underscores ("Orchestrator (thought)")."""
    if not name:
        return ""
    base = re.sub(r"\s*\(.*\)\s*$", "", name)
    return re.sub(r"[\s_-]+", "", base).lower()


def load_events(con: duckdb.DuckDBPyConnection) -> dict[str, list[Event]]:
    """Events per cell, in seq order."""
    rows = con.execute(
        "SELECT event_id, cell_id, seq, kind, actor, step_index, coalesce(text, ''), tool_name, args_digest, "
        "source_path, line_start, line_end, detail FROM events ORDER BY cell_id, seq"
    ).fetchall()
    out: dict[str, list[Event]] = {}
    for r in rows:
        out.setdefault(r[1], []).append(Event(*r))
    return out


def _stepped(events: list[Event]) -> list[Event]:
    # Agent steps: numbered events by an agent, not the user's turns nor tool / environment output.
    return [
        e
        for e in events
        if e.step_index is not None
        and e.kind not in ("tool_result", "error")
        and (e.actor or "").lower() not in USER_ACTORS
    ]


def _pred(e: Event | None) -> Prediction | None:
    return None if e is None else Prediction(e.step_index, e.actor, e.event_id)


def baseline_first_error(events: list[Event]) -> Prediction | None:
    """The first error event that has a step index."""
    return _pred(next((e for e in events if e.kind == "error" and e.step_index is not None), None))


def baseline_first_error_cause(events: list[Event]) -> Prediction | None:
    """The agent step just before the first error: the action whose result failed."""
    first = next((e for e in events if e.kind == "error" and e.step_index is not None), None)
    if first is None:
        return None
    before = [e for e in _stepped(events) if e.seq < first.seq and e.step_index != first.step_index]
    return _pred(before[-1] if before else None)


def baseline_first_step(events: list[Event]) -> Prediction | None:
    """The first step taken by an agent (not the user, system or environment)."""
    s = _stepped(events)
    return _pred(s[0] if s else None)


def baseline_last_step(events: list[Event]) -> Prediction | None:
    """The last step taken by an agent."""
    s = _stepped(events)
    return _pred(s[-1] if s else None)


def _event_for_ref(ref: str, events: list[Event], by_id: dict[str, Event]) -> Event | None:
    if ref in by_id:
        return by_id[ref]
    m = re.match(r"^(?P<path>[^#]+)#L(?P<a>\d+)(?:-L(?P<b>\d+))?(?P<ptr>/.*)?$", ref)
    if not m:
        return None
    a, b = int(m["a"]), int(m["b"] or m["a"])
    ptr = m["ptr"]
    for e in events:
        if e.source_path == m["path"] and e.line_start <= a and b <= e.line_end:
            return e
    del ptr
    return None


def from_weakness_cards(run_dir: Path, events: dict[str, list[Event]]) -> tuple[dict[str, Prediction], str]:
    """Per cell, the earliest event a weakness card's first divergence cites; plus a status line."""
    data = RunDir(run_dir).document(SHORTLIST)
    if data is None:
        return {}, f"no {SHORTLIST.filename} in the run: no predictions from weakness cards"
    by_id = {e.event_id: e for evs in events.values() for e in evs}
    out: dict[str, Prediction] = {}
    cards = data.get("weaknesses") or []
    for card in cards:
        fd = card.get("first_divergence") or {}
        for cell in fd.get("cells") or []:
            cands = [_event_for_ref(r, events.get(cell, []), by_id) for r in fd.get("event_refs") or []]
            hits = sorted((e for e in cands if e is not None and e.cell_id == cell), key=lambda e: e.seq)
            if hits and (cell not in out or hits[0].seq < by_id[out[cell].event_id].seq):
                out[cell] = _pred(hits[0])  # type: ignore[assignment]
    return out, f"{len(cards)} weakness cards, first divergence in {len(out)} cells"


def _probe_rows(con: duckdb.DuckDBPyConnection) -> tuple[list[tuple[str, str, int]], str]:
    sql = f"SELECT table_name FROM information_schema.tables WHERE {duck.CURRENT}"
    tables = {r[0] for r in con.execute(sql).fetchall()}
    if "probe_hits" in tables:
        rows = con.execute("SELECT cell_id, probe_id, first_seq FROM probe_hits").fetchall()
        return [(r[0], r[1], int(r[2])) for r in rows], "table probe_hits"
    try:
        hits = run_probes(con)
    except duckdb.Error as exc:
        return [], f"no probe_hits table; computing probes failed ({exc.__class__.__name__})"
    return [(h.cell_id, h.probe_id, h.first_seq) for h in hits], "computed with pipeline.probes (run had no probe_hits)"


def from_probe_hits(
    con: duckdb.DuckDBPyConnection, events: dict[str, list[Event]]
) -> tuple[dict[str, Prediction], dict[str, set[str]], str]:
    """Per cell the earliest probe evidence event, the probes that fired per cell, and a status line."""
    rows, how = _probe_rows(con)
    first: dict[str, int] = {}
    fired: dict[str, set[str]] = {}
    for cell, probe, seq in rows:
        fired.setdefault(cell, set()).add(probe)
        first[cell] = min(seq, first.get(cell, seq))
    out: dict[str, Prediction] = {}
    for cell, seq in first.items():
        ev = next((e for e in events.get(cell, []) if e.seq == seq), None)
        if ev is not None:
            # A probe's earliest evidence may be a context event without a step: use the next step.
            if ev.step_index is None:
                ev = next((e for e in events[cell] if e.seq >= seq and e.step_index is not None), ev)
            out[cell] = Prediction(ev.step_index, ev.actor, ev.event_id)
    return out, fired, f"{len(rows)} probe hits ({how})"


PROBE_MODES = {
    "repeat_call_same_state": STEP_REPETITION,
    "check_rerun_unchanged_source": STEP_REPETITION,
    "identical_result": STEP_REPETITION,
    "repeated_failure": STEP_REPETITION,
}


def mode_checks(events: list[Event]) -> set[str]:
    """Failure modes the deterministic checks see in one cell (MAST-14 titles)."""
    found = run_checks(events, {})
    modes: set[str] = set()
    if "repeated_tool_call" in found or "repeated_message" in found:
        modes.add(STEP_REPETITION)
    if "step_cap" in found:
        modes.add(TERMINATION)
    return modes


def read_json_field(value: str | None) -> dict[str, Any]:
    """outcomes.extra as a dict ({} when empty)."""
    if not value:
        return {}
    data = json.loads(value)
    return data if isinstance(data, dict) else {}
