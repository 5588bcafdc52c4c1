"""Gather one run's artifacts and render them into a single self-contained HTML page to read before deciding.

The page needs nothing but itself: CSS and JS are inline, a Content-Security-Policy forbids
every network fetch. Cards are rendered server-side (readable without clicking anything); the
per-cell timelines and the raw lines of every cited event id or ref (read from the frozen bundle,
hash checked, with context lines) travel as compressed per-cell chunks that the page inflates only
when a cell, a ref or a search needs them — so a 1,000-cell run stays a page a browser opens at once.
All text goes through jinja2 autoescaping: log text is untrusted. The output is deterministic (no
timestamps, fixed compression level), so a rerun gives the same bytes.
"""

from __future__ import annotations

import base64
import json
import re
import zlib
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup, escape

from pipeline.artifacts.run_info import Pilot
from pipeline.artifacts.rundir import REPORT_FILE, Row, RunArtifacts, RunDir
from pipeline.core.canonical import atomic_write_text
from pipeline.core.errors import BadInput
from pipeline.core.refs import REF_IN_TEXT
from pipeline.diff.compare import call_totals, validation_by_id, validation_summary
from pipeline.diff.match import EVENT_ID_RE, cited_ids
from pipeline.models.calllog import summarise
from pipeline.report import data
from pipeline.report.asks import asks_section
from pipeline.report.chart import prevalence_svg
from pipeline.report.evidence import Evidence, EvidenceReader, Snippet
from pipeline.report.labels import PATTERN_ORDER, PROPOSAL_ORDER, WEAKNESS_ORDER, label, ordered
from pipeline.run.index import run_state
from pipeline.state import handoff

TEMPLATE = "report.html.j2"
SHARED_CHUNK = "_"  # lines of files that belong to no cell
GROUPS_CHUNK = "_groups"  # the pattern groups' occurrences
GROUP_LIST_CAP = 50
SEARCH_BATCH = 200  # cells the page's search inflates at a time (and then lets go)
CELL_ROWS = 500  # rows of the cells table, and of a group's occurrence table, shown at first and per "show more"
_TOKEN = re.compile(f"(?:{REF_IN_TEXT.pattern})|(?:{EVENT_ID_RE.pattern})")
_DATA_BLOCK = re.compile(r'<script type="application/json" id="lunasol-data">(.*?)</script>', re.S)


def _dict(value: Any) -> dict[str, Any]:
    """A mapping field read defensively: anything else is empty."""
    return value if isinstance(value, dict) else {}


def _standing(arts: RunArtifacts) -> set[str]:
    """Names of the receipts that stand (each gate's decision now; docs/gates.md)."""
    out = set()
    if not RunDir(arts.path).ledger.is_file():  # a run put together by hand: each gate's latest receipt
        receipts = _dict(_dict(arts.handoff).get("receipts"))
        return {Path(str(rel)).stem for rel in receipts.values()}
    for gate in ("gate1", "gate2"):
        try:
            rel = handoff.standing_receipt(arts.path, gate)
        except (BadInput, OSError):  # a damaged run: no receipt is shown as the decision now
            rel = None
        if rel:
            out.add(Path(rel).stem)
    return out


def _receipt_state(name: str, r: Row, arts: RunArtifacts, standing: set[str]) -> str:
    """Whether a receipt is the gate's decision now, superseded (by whom) or voided."""
    if name in standing:
        return "stands"
    for other in arts.gates.values():
        sup = _dict(other.get("supersedes"))
        if sup.get("operation_id") == r.get("operation_id") and other.get("gate") == r.get("gate"):
            return f"superseded by {other.get('by')} ({other.get('operation_id')})"
    return "voided (no longer the decision)"


def _gate_receipts(arts: RunArtifacts) -> list[dict[str, Any]]:
    """Every receipt as something to read: who, when, on what, which decisions, which state it set."""
    out = []
    standing = _standing(arts)
    for name, r in sorted(arts.gates.items()):
        gate = str(r.get("gate") or name)
        req = _dict(r.get("request"))
        decisions = _dict(req.get("decisions"))
        rows = []
        for wid, d in sorted(decisions.items()):
            if isinstance(d, dict):
                rows.append({"id": wid, "decision": d.get("decision"), "note": d.get("note")})
            else:
                rows.append({"id": wid, "decision": d, "note": None})
        if not rows and req:  # gate 2: one choice
            choice = req.get("choice") or req.get("selection")
            rows.append({"id": req.get("proposal_id") or "—", "decision": choice, "note": req.get("note")})
        subject = _dict(r.get("subject"))
        out.append(
            {
                "name": name,
                "title": "Gate 1 — root causes"
                if gate.startswith("gate1")
                else "Gate 2 — proposal selection"
                if gate.startswith("gate2")
                else gate,
                "by": r.get("by"),
                "at": r.get("decided_at"),
                "revisions": (r.get("base_revision"), r.get("new_revision")),
                "subject": subject,
                "decisions": rows,
                "result": sorted((label(k), v) for k, v in (r.get("result") or {}).items()),
                "operation_id": r.get("operation_id"),
                "state": _receipt_state(name, r, arts, standing),
                "raw": json.dumps(r, indent=2, sort_keys=True, ensure_ascii=False),
            }
        )
    return out


def _gate1_decisions(arts: RunArtifacts) -> dict[str, Any]:
    # The decision that stands; none when gate 1 was voided (a superseded or voided one is not shown as it)
    latest: tuple[float, Row] | None = None
    standing = _standing(arts)
    for name, receipt in sorted(arts.gates.items()):
        if name in standing and str(receipt.get("gate") or name).startswith("gate1"):
            rev = receipt.get("new_revision")
            key = float(rev) if isinstance(rev, int | float) else 0.0
            if latest is None or key >= latest[0]:
                latest = (key, receipt)
    if latest is None:
        return {}
    req = latest[1].get("request")
    decisions = req.get("decisions") if isinstance(req, dict) else latest[1].get("decisions")
    if not isinstance(decisions, dict):
        return {}
    return {k: (v.get("decision") if isinstance(v, dict) else v) for k, v in decisions.items()}


CALL_COLUMNS = (
    "calls",
    "attempts",
    "reasks",
    "transport_retries",
    "prompt_tokens",
    "completion_tokens",
    "cost_usd",
    "failures",
    "latency_ms",
)


def _calls_summary(arts: RunArtifacts) -> dict[str, Any] | None:
    """Per role and in total (pipeline.models.calllog.summarise when available), with the latency summed."""
    if arts.calls is None:
        return None
    try:
        summary: dict[str, Any] = summarise(arts.path)
    except ImportError:  # the model layer is optional for reading a run
        t = call_totals(arts.calls)
        summary = {"roles": t.by_role, "totals": t.model_dump(exclude={"by_role"})}
    totals = summary.setdefault("totals", {})
    roles = summary.setdefault("roles", {})
    if "latency_ms" not in totals:
        totals["latency_ms"] = round(sum(float(r.get("latency_ms") or 0.0) for r in roles.values()), 1)
    summary["columns"] = [c for c in CALL_COLUMNS if c in totals or any(c in r for r in roles.values())]
    return summary


def _internal_anchors(arts: RunArtifacts, cell_ids: list[str]) -> dict[str, tuple[str, str]]:
    """The run's own ids -> (kind, target): groups, weaknesses, proposals in the page; cells, patterns in the viewer."""
    out: dict[str, tuple[str, str]] = {c: ("cell", c) for c in cell_ids}
    for p in arts.patterns or []:
        if isinstance(p.get("pattern_id"), str) and p["pattern_id"]:
            out[p["pattern_id"]] = ("pattern", str(p.get("cell_id")))
    for rows, key, prefix in (
        (arts.groups, "group_id", "group"),
        (arts.weaknesses, "weakness_id", "weakness"),
        (arts.proposals, "proposal_id", "proposal"),
    ):
        for row in rows or []:
            if isinstance(row.get(key), str) and row[key]:
                out[row[key]] = ("anchor", f"{prefix}-{row[key]}")
    return out


_WORD = re.compile(r"(?<![\w-])[\w-]+(?![\w-])")  # a run id as a whole word (W-01, G003, C0042-P01)


def _linkifier(snippets: dict[str, Snippet], internal: dict[str, tuple[str, str]]) -> Any:
    # Refs and event ids (raw lines) first; the run's own ids are then whole words between them,
    # looked up. One alternation of every id (70,000 pattern and cell ids at 10,000 cells) made each
    # text a scan of all of them; only ids that are not plain words stay in the pattern.
    odd = [k for k in internal if not _WORD.fullmatch(k)]
    names = "|".join(re.escape(k) for k in sorted(odd, key=len, reverse=True))
    token = re.compile(_TOKEN.pattern + (rf"|(?<![\w-])(?:{names})(?![\w-])" if names else ""))

    def own(word: str) -> str | None:
        found = internal.get(word)
        if found is None:
            return None
        kind, target = found
        if kind == "anchor":
            return f'<a class="internal" href="#{escape(target)}">{escape(word)}</a>'
        extra = f' data-pattern="{escape(word)}"' if kind == "pattern" else ""
        return f'<a class="cell" href="#cells" data-cell="{escape(target)}"{extra}>{escape(word)}</a>'

    def words(text: str) -> str:
        out: list[str] = []
        pos = 0
        for m in _WORD.finditer(text):
            link = own(m.group(0))
            if link is not None:
                out += [str(escape(text[pos : m.start()])), link]
                pos = m.end()
        out.append(str(escape(text[pos:])))
        return "".join(out)

    def linkify(value: Any) -> Markup:
        """Escape text; turn every known event id / ref into a link to its raw lines, own ids into links."""
        text = str(value)
        out: list[str] = []
        pos = 0
        for m in token.finditer(text):
            word = m.group(0)
            snip = snippets.get(word)
            if snip is not None:
                cls = "ref" if snip.status == "verified" else "ref bad"
                link = f'<a class="{cls}" href="#{snip.anchor}" data-ref="{snip.anchor}">{escape(word)}</a>'
            else:
                # a ref or event id with no snippet stays text, and no id inside it is linked
                link = own(word) or str(escape(word))
            out += [words(text[pos : m.start()]), link]
            pos = m.end()
        out.append(words(text[pos:]))
        return Markup("".join(out))

    return linkify


def _environment(snippets: dict[str, Snippet], internal: dict[str, tuple[str, str]]) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(resources.files("pipeline.report") / "templates")),
        autoescape=True,  # every file here is HTML; log text is untrusted
        # Artifacts are read defensively (older or partial producers): a card without a field shows
        # nothing there instead of failing the whole report. The context's own keys are fixed and tested.
        undefined=jinja2.ChainableUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["linkify"] = _linkifier(snippets, internal)
    env.filters["label"] = label
    env.globals["ordered"] = ordered
    return env


def _pack(obj: Any) -> str:
    """Deflate + base64 (the page inflates it with the browser's DecompressionStream)."""
    raw = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode("utf-8")
    return base64.b64encode(zlib.compress(raw, 6)).decode("ascii")


def _script_json(obj: Any) -> Markup:
    """JSON safe inside a <script> data block (no '<' can close it)."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    return Markup(text.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def read_page_data(html: str) -> dict[str, Any]:
    """The page's data block with every chunk inflated (for tests and benchmarks)."""
    m = _DATA_BLOCK.search(html)
    if m is None:
        raise BadInput("not a lunasol report: no data block")
    doc: dict[str, Any] = json.loads(m.group(1))
    doc["chunks"] = {
        k: json.loads(zlib.decompress(base64.b64decode(v)).decode("utf-8")) for k, v in doc["chunks"].items()
    }
    return doc


def _weakness_roles(weaknesses: list[Row]) -> dict[str, dict[str, str]]:
    """Cell -> weakness id -> "support" / "counter"."""
    out: dict[str, dict[str, str]] = {}
    for w in weaknesses:
        wid = str(w.get("weakness_id"))
        support = _dict(w.get("support"))
        for c in support.get("cells") or []:
            out.setdefault(str(c), {})[wid] = "support"
        counter = _dict(w.get("counter_evidence"))
        for item in counter.get("items") or []:
            if isinstance(item, dict) and item.get("cell"):
                out.setdefault(str(item["cell"]), {}).setdefault(wid, "counter")
    return out


def _compare(ir: data.IR, w: Row, outcome: dict[str, str], snippets: dict[str, Snippet]) -> dict[str, Any] | None:
    """A failed supporting cell next to a counter-evidence cell, each around the event where it turns."""
    support = _dict(w.get("support"))
    fd = _dict(w.get("first_divergence"))
    cells = [str(c) for c in support.get("cells") or []]
    failed = next((c for c in cells if outcome.get(c) == "failed"), cells[0] if cells else None)
    counter = _dict(w.get("counter_evidence"))
    item = next((i for i in counter.get("items") or [] if isinstance(i, dict) and i.get("cell")), None)
    if failed is None or item is None:
        return None

    def anchor_event(cell: str, ids: list[Any]) -> str | None:
        for key in ids:
            s = snippets.get(str(key))
            if s is not None and s.event.get("cell_id") == cell:
                return str(key)
            if str(key).startswith(f"{cell}-e"):
                return str(key)
        return None

    left_at = anchor_event(failed, list(fd.get("event_refs") or []) + list(support.get("event_refs") or []))
    right_cell = str(item["cell"])
    right_at = anchor_event(right_cell, list(item.get("refs") or []))
    if left_at is None or right_at is None:
        return None
    cited = {str(x) for x in (fd.get("event_refs") or [])} | {str(x) for x in (support.get("event_refs") or [])}
    cited |= {str(x) for x in item.get("refs") or []}
    return {
        "left": {
            "cell": failed,
            "outcome": outcome.get(failed),
            "at": left_at,
            "rows": data.window(ir, failed, left_at),
        },
        "right": {
            "cell": right_cell,
            "outcome": outcome.get(right_cell),
            "at": right_at,
            "rows": data.window(ir, right_cell, right_at),
            "note": item.get("note"),
        },
        "cited": cited,
    }


def _chunks(
    ir: data.IR,
    evidence: Evidence,
    patterns_by_cell: dict[str, list[Row]],
) -> tuple[dict[str, str], dict[str, list[str]], int]:
    """Per-cell compressed chunks (timeline, patterns, cited keys, raw lines), the key index, the events shown.

    The index maps an anchor of every cited key to ``[key, chunk, status]``; the chunk holds the key's
    full entry under ``refs``. Each cell's chunk is packed as soon as its timeline is read: only one
    cell's rows are in memory at a time.
    """
    spans = {(s.path, s.line_start or 0, s.line_end or 0) for s in evidence.snippets.values() if s.path and not s.event}
    path_cell, ranges = data.places(ir, spans)
    content: dict[str, dict[str, Any]] = {}
    index: dict[str, list[str]] = {}
    cited: dict[str, set[str]] = {}

    def chunk_of(name: str) -> dict[str, Any]:
        return content.setdefault(name, {"lines": {}, "refs": {}})

    for snip in evidence.snippets.values():
        cell = snip.event.get("cell_id") or path_cell.get(snip.path or "") or SHARED_CHUNK
        index[snip.anchor] = [snip.key, cell, snip.status]  # small and uncompressed: links need only this
        chunk = chunk_of(cell)
        chunk["refs"][snip.anchor] = snip.to_json()
        ev = snip.key if snip.event else ranges.get((snip.path or "", snip.line_start or 0, snip.line_end or 0))
        if ev is not None and snip.status == "verified":
            cited.setdefault(cell, set()).add(ev)
        key = snip.lines_key
        if key is not None and key in evidence.lines:
            chunk["lines"].setdefault(key, {str(n): t for n, t in sorted(evidence.lines[key].items())})
    packed: dict[str, str] = {}
    events = 0
    for cell, rows in data.timelines(ir):
        chunk = content.pop(cell) if cell in content else {"lines": {}, "refs": {}}
        chunk["events"] = rows
        chunk["patterns"] = patterns_by_cell.get(cell, [])
        chunk["cited"] = sorted(cited.get(cell, set()))
        packed[cell] = _pack(chunk)
        events += len(rows)
    for cell, pats in patterns_by_cell.items():
        if cell not in packed:
            chunk_of(cell).setdefault("patterns", pats)
    packed.update({k: _pack(v) for k, v in content.items()})
    return dict(sorted(packed.items())), index, events


def _luna_failures(arts: RunArtifacts, failed: list[Row]) -> list[dict[str, Any]]:
    """Cells Luna failed on: the one-phrase reason, and every error of their calls (shown on a click).

    A failed cell is never "no pattern found": its patterns are missing. The errors come from
    ``calls.jsonl`` (every attempt of every part, as the model layer wrote them).
    """
    errors: dict[str, list[str]] = {}
    for row in arts.calls or []:
        if row.get("role") == "luna" and row.get("outcome") != "ok":
            call = str(row.get("cell_id") or "")
            for e in row.get("errors") or []:
                errors.setdefault(call.split("#", 1)[0], []).append(f"{call} ({row.get('outcome')}): {e}")
    return [
        {"cell_id": r["cell_id"], "reason": r.get("reason") or "no answer", "errors": errors.get(str(r["cell_id"]), [])}
        for r in failed
    ]


def context(arts: RunArtifacts) -> tuple[dict[str, Any], Evidence]:
    """Everything the template shows, and the evidence (snippets and lines) of every cited key."""
    cited: set[str] = set()
    followup = _followup(arts)
    for part in (arts.patterns, arts.groups, arts.shortlist, arts.proposals, arts.validation, arts.block, followup):
        if part is not None:
            cited |= cited_ids(part)
    asks = asks_section(arts.path)  # the Asks section (pipeline/report/asks.py): its cited events resolve here too
    evidence = EvidenceReader(arts.path).resolve(cited | asks.cited)
    snippets = evidence.snippets
    ir = data.IR(arts.ir_path)
    try:
        cells = data.cells(ir)
        by_cell: dict[str, list[Row]] = {}
        for p in arts.patterns or []:
            by_cell.setdefault(str(p.get("cell_id")), []).append(p)
        weaknesses = arts.weaknesses or []
        roles = _weakness_roles(weaknesses)
        outcome = {str(r["cell_id"]): str(r.get("outcome")) for r in cells}
        for r in cells:
            cid = str(r["cell_id"])
            r["patterns"] = len(by_cell.get(cid, [])) if arts.patterns is not None else None
            r["types"] = sorted({str(p.get("type")) for p in by_cell.get(cid, [])})
            r["weaknesses"] = roles.get(cid, {})
        decisions = _gate1_decisions(arts)
        cards = [
            {
                "w": w,
                "decision": decisions.get(str(w.get("weakness_id"))),
                "compare": _compare(ir, w, outcome, snippets),
                "other": [k for k in sorted(w) if k not in (*WEAKNESS_ORDER, "weakness_id", "confidence")],
            }
            for w in weaknesses
        ]
        chunks, index, n_events = _chunks(ir, evidence, by_cell)
        failed = ir.rows("SELECT cell_id, reason FROM luna_cells WHERE status = 'failed' ORDER BY cell_id")
        luna_status = {str(r["cell_id"]): r for r in failed}
        for r in cells:
            if str(r["cell_id"]) in luna_status:
                r["luna_failed"] = luna_status[str(r["cell_id"])].get("reason") or "no answer"
    finally:
        ir.close()
    # Occurrence tables are built in the page when a group is opened: at 1,000 cells they are most of the DOM.
    chunks[GROUPS_CHUNK] = _pack(
        {str(g.get("group_id")): g.get("occurrences") or [] for g in arts.groups or [] if isinstance(g, dict)}
    )
    vals = validation_by_id(arts.validation)
    proposals = [
        {"card": p, "validation": vals.get(str(p.get("proposal_id"))), "summary": None} for p in arts.proposals or []
    ]
    for entry in proposals:
        entry["summary"] = validation_summary(entry["validation"])
    statuses: dict[str, int] = {}
    for s in snippets.values():
        statuses[s.status] = statuses.get(s.status, 0) + 1
    eligible = [r for r in cells if r.get("eligibility") == "valid_behavior"]
    luna_failures = _luna_failures(arts, failed)
    outcomes_count: dict[str, int] = {}
    for r in eligible:
        outcomes_count[str(r.get("outcome"))] = outcomes_count.get(str(r.get("outcome")), 0) + 1
    page = {
        "run_id": arts.run_id,
        "index": index,
        "chunks": chunks,
        "show_ref": f"lunasol show-ref REF --run {arts.path}",
        "search_batch": SEARCH_BATCH,
        "cell_rows": CELL_ROWS,
    }
    ctx = {
        "run_id": arts.run_id,
        "run": arts.run,
        "state": run_state(arts),
        "handoff": arts.handoff,
        "block": arts.block,
        "coverage": cells,
        "included": len(eligible),
        "excluded": len(cells) - len(eligible),
        "outcomes": dict(sorted(outcomes_count.items())),
        "tasks": sorted({str(r.get("task_id")) for r in eligible}),
        "types": sorted({str(p.get("type")) for p in arts.patterns or []}),
        "events": sum(int(r.get("events") or 0) for r in cells) or n_events,
        # secrets replaced in the IR's text (run.json records the count only when there were any)
        "redactions": int(((arts.run or {}).get("export") or {}).get("redactions") or 0),
        # made with --no-redact: the IR's text (timelines, quotes) holds the logs' secrets as written
        "unredacted": ((arts.run or {}).get("export") or {}).get("redacted") is False,
        # a pilot on a subset of the cells (run.json pilot): said in the header, every figure is over the subset
        "pilot": _pilot_label(arts),
        "patterns": arts.patterns,
        "luna_failures": luna_failures,
        "groups": arts.groups,
        "weaknesses": arts.weaknesses,
        "cards": cards,
        "dropped": arts.dropped_weaknesses,
        "shortlist_digest": arts.shortlist.get("digest") if isinstance(arts.shortlist, dict) else None,
        "gate1": decisions,
        "proposals": proposals if arts.proposals is not None else None,
        "proposal_order": PROPOSAL_ORDER,
        "pattern_order": PATTERN_ORDER,
        "validation": arts.validation,
        # Per weakness: the proposer's outcome (accepted / rejected cards, an honest zero and its note).
        "proposer_outcomes": [w for w in (arts.validation.get("weaknesses") or []) if isinstance(w, dict)]
        if isinstance(arts.validation, dict) and isinstance(arts.validation.get("weaknesses"), list)
        else [],
        "receipts": _gate_receipts(arts),
        "followup": followup,
        "asks": asks.asks,
        "calls": _calls_summary(arts),
        "chart": prevalence_svg(eligible, by_cell),
        # A group's lists (its cells, tasks, runs) are shown up to this many items: its occurrence table,
        # built when the group is opened, holds every one (at 10,000 cells the lists were 268K DOM nodes).
        "group_list_cap": GROUP_LIST_CAP,
        "cell_rows": CELL_ROWS,
        "problems": [snippets[k] for k in sorted(snippets) if snippets[k].status != "verified"],
        "snippet_statuses": dict(sorted(statuses.items())),
        "page_data": _script_json(page),
    }
    return ctx, evidence


def _pilot_label(arts: RunArtifacts) -> str | None:
    raw = (arts.run or {}).get("pilot")
    return Pilot.model_validate(raw).label() if isinstance(raw, dict) else None


# ---------------------------------------------------------------- follow-up (lunasol followup)
def _followup(arts: RunArtifacts) -> dict[str, Any] | None:
    """The run's followup.json (a child run judged for its parent's proposal), validated, or None."""
    from pipeline.followup import read_followup  # startup cost: followup imports the runner and its model client

    doc = read_followup(arts.path)
    return None if doc is None else doc.model_dump(mode="json")


def render_report(run_dir: Path) -> tuple[str, dict[str, int]]:
    """The report's HTML and its figures (refs embedded, hash mismatches, unresolved ids)."""
    arts = RunDir(run_dir).read()
    ctx, evidence = context(arts)
    internal = _internal_anchors(arts, [str(r["cell_id"]) for r in ctx["coverage"]])
    html = _environment(evidence.snippets, internal).get_template(TEMPLATE).render(**ctx)
    snippets = evidence.snippets.values()
    stats = {
        "bytes": len(html.encode("utf-8")),
        "refs": sum(1 for s in snippets if s.status == "verified"),
        "hash_mismatches": sum(1 for s in snippets if s.status == "hash_mismatch"),
        "unresolved": sum(1 for s in snippets if s.status not in ("verified", "hash_mismatch")),
    }
    return html, stats


def write_report(run_dir: Path, out: Path | None = None) -> tuple[Path, dict[str, int]]:
    """Render and write atomically (default ``RUN/report.html``); return the path and figures."""
    if out is not None:
        # Checked before rendering: a typo in the output path is bad input, not a new directory tree.
        if out.is_dir():
            raise BadInput(f"output {out} is a directory; name the file, e.g. {out / REPORT_FILE}")
        if not out.parent.is_dir():
            raise BadInput(f"output directory does not exist: {out.parent}")
    html, stats = render_report(run_dir)
    path = out if out is not None else RunDir(run_dir).report
    atomic_write_text(path, html)
    return path, stats
