"""``lunasol diff A B --html FILE``: one self-contained side-by-side page (no script, no network).

Each changed field is a row: its path, A's value and B's value in full, removed words marked in A
and added words in B (:func:`pipeline.diff.words.sides_html`). Everything is escaped.
"""

from __future__ import annotations

import json
from typing import Any

from markupsafe import escape

from pipeline.diff.compare import Item, RunDiff, Section
from pipeline.diff.decisions import Decisions, ids, support_line
from pipeline.diff.match import FieldChange
from pipeline.diff.words import sides_html

_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:0 20px 40px;color:#1d232b}
h1{font-size:18px}h2{font-size:16px;border-bottom:1px solid #d9dee5;margin-top:24px}
table{border-collapse:collapse;width:100%;table-layout:fixed}
td,th{border:1px solid #d9dee5;padding:4px 8px;vertical-align:top;text-align:left;overflow-wrap:anywhere}
th{background:#f5f7fa}td.p{width:16%;font-family:monospace;font-size:12.5px}
del{background:#ffd7d5;text-decoration:line-through}ins{background:#ccf0d1;text-decoration:none}
.muted{color:#5f6874}tr.item td{background:#f5f7fa;font-weight:600}
"""


def _text(v: Any) -> str:
    if v is None:
        return ""
    return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, sort_keys=True, indent=1)


def _row(c: FieldChange) -> str:
    if c.added is not None or c.removed is not None:
        a = "".join(f"<del>{escape(_text(x))}</del><br>" for x in c.removed or [])
        b = "".join(f"<ins>{escape(_text(x))}</ins><br>" for x in c.added or [])
    else:
        a, b = sides_html(_text(c.a), _text(c.b))
    return f'<tr><td class="p">{escape(c.path)}</td><td>{a}</td><td>{b}</td></tr>'


def _item(it: Item) -> str:
    ids = f"{it.a_id or '—'} ↔ {it.b_id or '—'}"
    head = f'<tr class="item"><td colspan="3">{escape(it.status)}: {escape(ids)} {escape(it.kind or "")}</td></tr>'
    return head + "".join(_row(c) for c in it.changes)


def _table(rows: list[str]) -> str:
    if not rows:
        return '<p class="muted">no differences</p>'
    return "<table><tr><th>field</th><th>A</th><th>B</th></tr>" + "".join(rows) + "</table>"


def _decisions(d: Decisions) -> str:
    rows = ["<table><tr><th>card</th><th>what it says</th><th>support and decision</th><th>fields changed</th></tr>"]
    for w in d.weaknesses:
        extra = [support_line(w)]
        if w.confidence_a or w.confidence_b:
            extra.append(f"confidence {w.confidence_a or '—'} → {w.confidence_b or '—'}")
        if w.gate1_a or w.gate1_b:
            extra.append(f"gate 1 {w.gate1_a or '—'} → {w.gate1_b or '—'}")
        rows.append(
            f"<tr><td>{escape(w.status)} {escape(ids(w.status, w.a_id, w.b_id))}</td><td>{escape(w.statement)}</td>"
            f"<td>{'<br>'.join(str(escape(x)) for x in extra)}</td><td>{escape(', '.join(w.changed_fields))}</td></tr>"
        )
    for p in d.proposals:
        src = f"for {p.source_weakness_a or '—'} → {p.source_weakness_b or '—'}"
        verdict = f"validation {p.verdict_a or '—'} → {p.verdict_b or '—'}"
        rows.append(
            f"<tr><td>{escape(p.status)} {escape(ids(p.status, p.a_id, p.b_id))}</td><td>{escape(p.summary)}</td>"
            f"<td>{escape(src)}<br>{escape(verdict)}</td><td>{escape(', '.join(p.changed_fields))}</td></tr>"
        )
    for q in d.asks:
        counts = [
            ", ".join(f"{k} {v}" for k, v in c.items()) if c is not None else "—" for c in (q.counts_a, q.counts_b)
        ]
        moved = f"{len(q.answers_changed)} cells answered differently" if q.answers_changed else ""
        rows.append(
            f"<tr><td>{escape(q.status)} {escape(q.ask_id)}</td><td>{escape(q.question)}</td>"
            f"<td>{escape(counts[0])} → {escape(counts[1])}</td><td>{escape(moved)}</td></tr>"
        )
    if len(rows) == 1:
        return '<p class="muted">no weakness or proposal cards in either run</p>'
    return "".join(rows) + "</table>"


def render_html(d: RunDiff) -> str:
    """The whole diff as one escaped, script-free HTML page, A and B side by side."""
    out = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; style-src 'unsafe-inline'\">",
        f"<title>lunasol diff — {escape(d.a_run_id)} vs {escape(d.b_run_id)}</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>lunasol diff: A = {escape(d.a)} ({escape(d.a_run_id)}), B = {escape(d.b)} ({escape(d.b_run_id)})</h1>",
        f"<p><b>{'identical outputs' if d.identical else 'outputs differ'}</b></p>",
    ]

    def section(name: str, rows: list[str]) -> None:
        out.append(f"<h2>{escape(name)}</h2>")
        out.append(_table(rows))

    def items(s: Section) -> list[str]:
        return [_item(it) for it in s.items]

    # What a reader decides on leads, as in the text; the evidence detail follows.
    out.append("<h2>decisions: weaknesses and proposals, matched by what they cite</h2>")
    out.append(_decisions(d.decisions))
    section("weaknesses", items(d.weaknesses))
    section("proposals", items(d.proposals))
    section("gate decisions", [_row(c) for c in d.gates])
    section("inputs (run.json)", [_row(c) for c in d.inputs])
    cells: list[str] = []
    for cell in d.cells:
        cells.append(f'<tr class="item"><td colspan="3">cell {escape(cell.cell_id)}</td></tr>')
        cells.extend(_row(c) for c in cell.coverage)
        cells.extend(_item(it) for it in cell.items)
    section("patterns per cell", cells)
    section("pattern groups", items(d.groups))
    section("run state", [_row(c) for c in d.state])
    section("model calls", [_row(c) for c in d.calls])
    out.append("</body></html>\n")
    return "\n".join(out)
