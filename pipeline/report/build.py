"""Gather one run's artifacts and render them into a report directory to read before deciding.

``index.html`` is what a reader opens: the decisions (weakness cards, proposals, gates, follow-up)
rendered server-side, readable without clicking anything, and aggregates whose size does not grow
with the batch. Everything that grows with it lives in ``data/`` shards (:mod:`pipeline.report.shards`)
that the page loads by ``<script>`` tag when a cell, a ref, a group or a search needs them: per-cell
timelines with the raw lines of every cited event id or ref (read from the frozen bundle, hash
checked, redacted, with context lines), the cells table's rows, groups' occurrences, and a search
index built here (:mod:`pipeline.report.search`). So the page opens at once at 100,000 cells.
A Content-Security-Policy forbids every network fetch (scripts only from the page and its folder).
All text goes through jinja2 autoescaping: log text is untrusted. The output is deterministic (no
timestamps, fixed compression level), so a rerun gives the same bytes; the directory is written
atomically (built beside its place, then renamed).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
import pyarrow as pa
from markupsafe import Markup, escape

from pipeline.artifacts.run_info import Pilot
from pipeline.artifacts.rundir import ARTIFACTS, REPORT_FILE, REPORT_INDEX, Row, RunArtifacts, RunDir
from pipeline.core.canonical import atomic_write_text
from pipeline.core.errors import BadInput
from pipeline.core.refs import REF_IN_TEXT
from pipeline.diff.compare import call_totals, validation_by_id, validation_summary
from pipeline.diff.match import EVENT_ID_RE, cited_ids
from pipeline.models.calllog import summarise
from pipeline.report import data, stream
from pipeline.report.asks import asks_section
from pipeline.report.chart import prevalence_svg
from pipeline.report.evidence import Evidence, EvidenceReader, Snippet, anchor_for
from pipeline.report.labels import PATTERN_ORDER, PROPOSAL_ORDER, WEAKNESS_ORDER, label, ordered
from pipeline.report.search import PREFIX, WORD_CHARS, SearchIndex
from pipeline.report.shards import MARKER, ShardWriter, read_shard, shard_names
from pipeline.run.index import run_state
from pipeline.state import handoff

TEMPLATE = "report.html.j2"
SHARED_CHUNK = "_"  # lines of files that belong to no cell
GROUPS_CHUNK = "_groups"  # the pattern groups' occurrences
GROUP_LIST_CAP = 50
SEARCH_BATCH = 4  # timeline shards the page's scan reads at a time (and then lets go)
HIT_CAP = 100  # events a search lists (it stops reading cells once it has them)
CELL_ROWS = 500  # rows of the cells table, and of a group's occurrence table, shown at first and per "show more"
TL_CELLS = 32  # cells per timeline shard (a demo-shaped cell is ~14 KB of shard: ~0.45 MB a shard)
ROW_CELLS = 2000  # cells per shard of the cells table's rows
OCC_ROWS = 2000  # occurrences per shard of a group's occurrence table
LIST_CAP = 500  # rows of the page's own lists that grow with the batch (Luna failures, evidence problems)
CHART_FAMILIES = 40  # task families in the prevalence chart (the largest)
TASK_OPTIONS = 500  # task families listed in the filter's menu; more: a text box
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


def _internal_anchors(
    arts: RunArtifacts, cell_ids: list[str], pattern_cells: dict[str, str], group_ids: list[str]
) -> dict[str, tuple[str, str]]:
    """The run's own ids -> (kind, target): groups, weaknesses, proposals in the page; cells, patterns in the viewer."""
    out: dict[str, tuple[str, str]] = {c: ("cell", c) for c in cell_ids}
    for pid, cell in pattern_cells.items():
        out[pid] = ("pattern", cell)
    for gid in group_ids:
        out[gid] = ("anchor", f"group-{gid}")
    for rows, key, prefix in (
        (arts.weaknesses, "weakness_id", "weakness"),
        (arts.proposals, "proposal_id", "proposal"),
    ):
        for row in rows or []:
            if isinstance(row.get(key), str) and row[key]:
                out[row[key]] = ("anchor", f"{prefix}-{row[key]}")
    return out


_WORD = re.compile(r"(?<![\w-])[\w-]+(?![\w-])")  # a run id as a whole word (W-01, G003, C0042-P01)


def _linkifier(
    snippets: dict[str, Snippet], internal: dict[str, tuple[str, str]], shards: dict[str, str] | None = None
) -> Any:
    # Refs and event ids (raw lines) first; the run's own ids are then whole words between them,
    # looked up. One alternation of every id (70,000 pattern and cell ids at 10,000 cells) made each
    # text a scan of all of them; only ids that are not plain words stay in the pattern.
    # ``shards``: a ref's anchor or a cell id -> the data shard a click on it loads
    shard_of = shards or {}
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
        if target in shard_of:
            extra += f' data-shard="{escape(shard_of[target])}"'
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
                shard = shard_of.get(snip.anchor, "")
                link = (
                    f'<a class="{cls}" href="#{snip.anchor}" data-ref="{snip.anchor}" '
                    f'data-shard="{escape(shard)}">{escape(word)}</a>'
                )
            else:
                # a ref or event id with no snippet stays text, and no id inside it is linked
                link = own(word) or str(escape(word))
            out += [words(text[pos : m.start()]), link]
            pos = m.end()
        out.append(words(text[pos:]))
        return Markup("".join(out))

    return linkify


def _environment(
    snippets: dict[str, Snippet], internal: dict[str, tuple[str, str]], shards: dict[str, str] | None = None
) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(resources.files("pipeline.report") / "templates")),
        autoescape=True,  # every file here is HTML; log text is untrusted
        # Artifacts are read defensively (older or partial producers): a card without a field shows
        # nothing there instead of failing the whole report. The context's own keys are fixed and tested.
        undefined=jinja2.ChainableUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["linkify"] = _linkifier(snippets, internal, shards)
    env.filters["label"] = label
    env.globals["ordered"] = ordered
    return env


def _script_json(obj: Any) -> Markup:
    """JSON safe inside a <script> data block (no '<' can close it)."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    return Markup(text.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def read_page_data(report: Path) -> dict[str, Any]:
    """A report directory's data as one document (for tests and benchmarks).

    The page's data block, every shard, and, rebuilt from the shards, ``chunks`` (cell -> its chunk,
    ``_`` the shared one, ``_groups`` group -> occurrences) and ``index`` (anchor -> [key, chunk,
    status]) as the single page had them.
    """
    root = report.parent if report.is_file() else report
    html = (root / REPORT_INDEX).read_text(encoding="utf-8")
    m = _DATA_BLOCK.search(html)
    if m is None:
        raise BadInput("not a lunasol report: no data block")
    doc: dict[str, Any] = json.loads(m.group(1))
    doc["shards"] = shards = {name: read_shard(root, name) for name in shard_names(root)}
    chunks: dict[str, Any] = {}
    groups: dict[str, list[Any]] = {}
    for name, value in shards.items():
        if name.startswith("t"):
            chunks.update(value)
        elif name.startswith("g"):
            groups.setdefault(value["group"], []).extend(value["rows"])
    chunks[GROUPS_CHUNK] = groups
    doc["chunks"] = chunks
    doc["index"] = {a: [r["key"], c, r["status"]] for c, ch in chunks.items() for a, r in ch.get("refs", {}).items()}
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


def tl_shard(ordinal: int) -> str:
    """The timeline shard of the cell at ``ordinal`` in the report's cell order."""
    return f"t{ordinal // TL_CELLS}"


def _cell_row(r: Row) -> list[Any]:
    """One row of the cells table as the page draws it (a cells shard holds ``ROW_CELLS`` of them)."""
    note = r.get("exclusion_reason") or (r.get("reason") if r.get("status") not in (None, "ok") else "") or ""
    weak = [[w, role] for w, role in sorted(r["weaknesses"].items())]
    return [
        r["cell_id"], r.get("task_id"), r.get("run_id"), r.get("outcome"), r.get("label"), r.get("events"),
        r.get("probe_hits"), r.get("patterns"), r.get("types"), weak, note, r.get("luna_failed"),
    ]  # fmt: skip


@dataclass
class _Figures:
    """What the page says about the evidence: statuses counted, the first problems kept."""

    statuses: dict[str, int] = field(default_factory=dict)
    problems: list[Snippet] = field(default_factory=list)
    n_problems: int = 0
    events: int = 0

    def count(self, snippets: Iterator[Snippet]) -> None:
        for snip in snippets:
            self.statuses[snip.status] = self.statuses.get(snip.status, 0) + 1
            if snip.status != "verified":
                self.n_problems += 1
                if len(self.problems) < LIST_CAP:
                    self.problems.append(snip)


def _home(snip: Snippet, path_cell: dict[str, str], ordinal: dict[str, int]) -> str:
    """The cell whose chunk holds a key: its event's cell, else its file's first cell, else the shared chunk."""
    cell = snip.event.get("cell_id") or path_cell.get(snip.path or "") or SHARED_CHUNK
    return cell if cell in ordinal else SHARED_CHUNK


def _put_snippet(chunk: dict[str, Any], snip: Snippet, evidence: Evidence) -> None:
    chunk["refs"][snip.anchor] = snip.to_json()
    key = snip.lines_key
    if key is not None and key in evidence.lines:
        chunk["lines"].setdefault(key, {str(n): t for n, t in sorted(evidence.lines[key].items())})


class _OccurrenceKeys:
    """Event ids and refs the groups' occurrences cite, per cell, kept in DuckDB (spilled) until their shard."""

    def __init__(self, con: Any) -> None:
        self.con = con
        self.con.execute("CREATE TABLE occ_keys (cell VARCHAR, key VARCHAR)")
        self._rows: list[tuple[str, str]] = []

    def add(self, cell: str, keys: set[str]) -> None:
        self._rows.extend((cell, k) for k in keys)
        if len(self._rows) >= 50_000:
            self.flush()

    def flush(self) -> None:
        if self._rows:
            batch = pa.table({"cell": [c for c, _ in self._rows], "key": [k for _, k in self._rows]})
            self.con.register("occ_batch", batch)
            self.con.execute("INSERT INTO occ_keys SELECT * FROM occ_batch")
            self.con.unregister("occ_batch")
            self._rows = []

    def sort(self) -> None:
        """Cell order, so each shard's lookup reads only its part (DuckDB skips the rest by min/max)."""
        self.flush()
        self.con.execute("CREATE TABLE occ_sorted AS SELECT DISTINCT cell, key FROM occ_keys ORDER BY cell, key")
        self.con.execute("DROP TABLE occ_keys")

    def of(self, first: str, last: str) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for cell, key in self.con.execute(
            "SELECT cell, key FROM occ_sorted WHERE cell BETWEEN ? AND ?", [first, last]
        ).fetchall():
            out.setdefault(cell, set()).add(key)
        return out


def _write_groups(
    run: RunDir, cell_shard: dict[str, str], occ_keys: _OccurrenceKeys, writer: ShardWriter
) -> tuple[list[Row] | None, dict[str, tuple[int, int, int]]]:
    """Each group's occurrences in shards of ``OCC_ROWS`` (``g<i>-<page>``), one group in memory at a time.

    Returns the groups without their occurrences (what the page renders; None when the run has no
    pattern groups), and per group id its (index, shards, occurrences). An occurrence's cited keys are
    embedded in its cell's timeline shard (noted in ``occ_keys`` for that shard's turn); its links
    name that shard.
    """
    if not run.groups.is_file():
        return None, {}

    def keyed(keys: list[Any], shard: str | None) -> list[list[Any]]:
        return [[str(k), anchor_for(str(k)), shard] if shard else [str(k)] for k in keys]

    out: list[Row] = []
    meta: dict[str, tuple[int, int, int]] = {}
    for gi, g in enumerate(stream.groups(run)):
        occ = [o for o in g.pop("occurrences", None) or [] if isinstance(o, dict)]
        gid = str(g.get("group_id"))
        pages = (len(occ) + OCC_ROWS - 1) // OCC_ROWS
        for p in range(pages):
            rows = []
            for o in occ[p * OCC_ROWS : (p + 1) * OCC_ROWS]:
                cell = str(o.get("cell_id"))
                shard = cell_shard.get(cell)
                if shard is not None:
                    occ_keys.add(cell, cited_ids(o))
                rows.append(
                    {
                        "occurrence_id": o.get("occurrence_id"),
                        "cell_id": o.get("cell_id"),
                        "shard": shard,
                        "task_id": o.get("task_id"),
                        "successful_cell": o.get("successful_cell"),
                        "pattern_ids": o.get("pattern_ids") or [],
                        "events": keyed(list(o.get("events") or []), shard),
                        "refs": keyed(list(o.get("refs") or []), shard),
                    }
                )
            writer.put(f"g{gi}-{p}", {"group": gid, "page": p, "rows": rows})
        out.append(g)
        meta[gid] = (gi, pages, len(occ))
    return out, meta


def _write_cells(
    ir: data.IR,
    reader: EvidenceReader,
    top: Evidence,
    patterns: stream.PatternIndex | None,
    occ_keys: _OccurrenceKeys,
    cells: list[Row],
    writer: ShardWriter,
    search: SearchIndex,
    figures: _Figures,
) -> dict[str, str]:
    """Write the cells' shards, ``TL_CELLS`` consecutive cells a shard, one shard in memory at a time.

    A timeline shard holds each cell's chunk: its events, patterns, cited keys with their raw lines
    (resolved for this shard only: its patterns' and occurrences' keys), and the index page's keys
    whose home is one of its cells (``_`` for the rest). The cells table's rows go in shards of
    ``ROW_CELLS``. Returns the index page's keys' anchors -> their shard.
    """
    ordinal = {str(r["cell_id"]): i for i, r in enumerate(cells)}
    top_spans = {(s.path, s.line_start or 0, s.line_end or 0) for s in top.snippets.values() if s.path and not s.event}
    top_cell, _ = data.places(ir, top_spans)
    where: dict[str, str] = {}
    top_home: dict[str, list[Snippet]] = {}
    for snip in top.snippets.values():
        home = _home(snip, top_cell, ordinal)
        where[snip.anchor] = "t" + SHARED_CHUNK if home == SHARED_CHUNK else tl_shard(ordinal[home])
        top_home.setdefault(home, []).append(snip)
    for start in range(0, len(cells), TL_CELLS):
        part = cells[start : start + TL_CELLS]
        ids = [str(r["cell_id"]) for r in part]
        rows_of = patterns.rows(ids) if patterns is not None else {}
        cites = occ_keys.of(ids[0], ids[-1])
        for cell, rows in rows_of.items():
            cites.setdefault(cell, set()).update(cited_ids(rows))
        keys = set().union(*cites.values()) - set(top.snippets) if cites else set()
        evidence = reader.resolve(keys, (ids[0], ids[-1]))
        figures.count(iter(evidence.snippets.values()))
        spans = {
            (s.path, s.line_start or 0, s.line_end or 0) for s in evidence.snippets.values() if s.path and not s.event
        }
        spans |= top_spans
        path_cell, ranges = data.places(ir, spans, (ids[0], ids[-1]))
        chunks: dict[str, dict[str, Any]] = {c: {"lines": {}, "refs": {}} for c in ids}
        cited: dict[str, set[str]] = {}
        # a key's home: its event's (or file's) cell when in this shard, else the first cell citing it
        citing: dict[str, str] = {}
        for cell in ids:
            for k in cites.get(cell, ()):
                citing.setdefault(k, cell)
        placed = [(s, evidence) for s in evidence.snippets.values()]
        placed += [(s, top) for c in ids for s in top_home.get(c, [])]
        for snip, source in placed:
            home = _home(snip, path_cell, ordinal)
            if home not in chunks:
                home = citing.get(snip.key, ids[0])
            _put_snippet(chunks[home], snip, source)
            ev = snip.key if snip.event else ranges.get((snip.path or "", snip.line_start or 0, snip.line_end or 0))
            if ev is not None and snip.status == "verified":
                cited.setdefault(home, set()).add(ev)
        shard: dict[str, Any] = {}
        for i, (r, (cell, events)) in enumerate(zip(part, data.timelines(ir, ids), strict=True), start=start):
            chunk = chunks[cell]
            chunk["events"] = events
            chunk["patterns"] = rows_of.get(cell, [])
            chunk["cited"] = sorted(cited.get(cell, set()))
            chunk["meta"] = [r.get("task_id"), r.get("run_id"), r.get("outcome")]
            chunk["o"] = i  # its ordinal: the search reads a shard's chunks by the ordinals the index gave
            for e in events:  # what the page's scan reads besides the event's fields: its own embedded raw lines
                lines = chunk["lines"].get(e[8]) if e[8] else None
                if lines:
                    raw = " ".join(lines[str(n)] for n in range(e[9] or 0, (e[10] or 0) + 1) if str(n) in lines)
                    if raw:
                        search.add_raw(i, raw)
            shard[cell] = chunk
            figures.events += len(events)
        writer.put(tl_shard(start), shard)
    for start in range(0, len(cells), ROW_CELLS):
        writer.put(f"c{start // ROW_CELLS}", [_cell_row(x) for x in cells[start : start + ROW_CELLS]])
    shared: dict[str, Any] = {"lines": {}, "refs": {}}
    for snip in top_home.get(SHARED_CHUNK, []):
        _put_snippet(shared, snip, top)
    writer.put("t" + SHARED_CHUNK, {SHARED_CHUNK: shared})
    return where


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


# The index page's sections, in order: (anchor, title in the nav, shown when). The one place a section
# is listed; its body is the template's <section id="ANCHOR">. "always" or a context key that must be truthy.
SECTIONS: tuple[tuple[str, str, str], ...] = (
    ("summary", "Summary", "always"),
    ("weaknesses", "Weaknesses", "always"),
    ("asks", "Asks", "asks"),
    ("proposals", "Proposals", "always"),
    ("followup", "Follow-up", "followup"),
    ("prevalence", "Prevalence", "always"),
    ("cells", "Cells & timelines", "always"),
    ("groups", "Pattern groups", "always"),
    ("gates", "Gate receipts", "always"),
    ("calls", "Model calls", "always"),
    ("raw", "Evidence", "always"),
)


def _families(eligible: list[Row]) -> tuple[list[str], list[str]]:
    """Every task family (sorted), and the ones the chart shows: the largest ``CHART_FAMILIES``."""
    counts: dict[str, int] = {}
    for r in eligible:
        counts[str(r.get("task_id"))] = counts.get(str(r.get("task_id")), 0) + 1
    top = sorted(counts, key=lambda t: (-counts[t], t))[:CHART_FAMILIES]
    return sorted(counts), sorted(top)


@dataclass
class Built:
    """The index page's context, and what the page's links need (the run's own ids, each key's shard)."""

    ctx: dict[str, Any]
    top: Evidence
    internal: dict[str, tuple[str, str]]
    shards: dict[str, str]
    figures: _Figures


def context(arts: RunArtifacts, writer: ShardWriter, spill: Path) -> Built:
    """Everything the index page shows, its shards written on the way, one shard of cells at a time.

    Held whole: the cells' rows (one small dict a cell), where each cell's patterns are, and the keys
    the index page cites (weakness cards, proposals, follow-up, groups' own fields) with their lines.
    Not held: patterns, occurrences, timelines, and the evidence of cells, written shard by shard.
    """
    run = RunDir(arts.path)
    followup = _followup(arts)
    patterns = stream.PatternIndex(run.patterns) if run.patterns.is_file() else None
    asks = asks_section(arts.path)  # the Asks section (pipeline/report/asks.py): its cited events resolve here too
    ir = data.IR(arts.ir_path)
    search = SearchIndex(arts.ir_path, spill)
    reader = EvidenceReader(arts.path)
    figures = _Figures()
    try:
        cells = data.cells(ir)
        cell_shard = {str(r["cell_id"]): tl_shard(i) for i, r in enumerate(cells)}
        occ_keys = _OccurrenceKeys(search.con)
        groups, group_shards = _write_groups(run, cell_shard, occ_keys, writer)
        occ_keys.sort()
        top_keys: set[str] = set()
        for part in (arts.shortlist, arts.proposals, arts.validation, arts.block, followup, groups):
            if part is not None:
                top_keys |= cited_ids(part)
        top = reader.resolve(top_keys | asks.cited)
        figures.count(iter(top.snippets.values()))
        snippets = top.snippets
        weaknesses = arts.weaknesses or []
        roles = _weakness_roles(weaknesses)
        outcome = {str(r["cell_id"]): str(r.get("outcome")) for r in cells}
        failed = ir.rows("SELECT cell_id, reason FROM luna_cells WHERE status = 'failed' ORDER BY cell_id")
        luna_status = {str(r["cell_id"]): r for r in failed}
        for r in cells:
            cid = str(r["cell_id"])
            r["patterns"] = patterns.count(cid) if patterns is not None else None
            r["types"] = sorted(patterns.cell_types(cid)) if patterns is not None else []
            r["weaknesses"] = roles.get(cid, {})
            if cid in luna_status:
                r["luna_failed"] = luna_status[cid].get("reason") or "no answer"
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
        where = _write_cells(ir, reader, top, patterns, occ_keys, cells, writer, search, figures)
        search_shards = search.build([str(r["cell_id"]) for r in cells], writer)
    finally:
        reader.close()
        search.close()
        ir.close()
    vals = validation_by_id(arts.validation)
    proposals = [
        {"card": p, "validation": vals.get(str(p.get("proposal_id"))), "summary": None} for p in arts.proposals or []
    ]
    for entry in proposals:
        entry["summary"] = validation_summary(entry["validation"])
    eligible = [r for r in cells if r.get("eligibility") == "valid_behavior"]
    luna_failures = _luna_failures(arts, failed[:LIST_CAP])
    outcomes_count: dict[str, int] = {}
    for r in eligible:
        outcomes_count[str(r.get("outcome"))] = outcomes_count.get(str(r.get("outcome")), 0) + 1
    tasks, chart_tasks = _families(eligible)
    shown_tasks = set(chart_tasks)
    types_by_cell = {str(r["cell_id"]): [{"type": t} for t in r["types"]] for r in eligible if r["types"]}
    page = {
        "run_id": arts.run_id,
        "show_ref": f"lunasol show-ref REF --run {arts.path}",
        "search_batch": SEARCH_BATCH,
        "hit_cap": HIT_CAP,
        "cell_rows": CELL_ROWS,
        "cells": len(cells),
        "tl_cells": TL_CELLS,
        "row_cells": ROW_CELLS,
        "occ_rows": OCC_ROWS,
        "search_index": bool(search_shards),
        "search_shards": search_shards,
        "word_chars": WORD_CHARS,
        "prefix": PREFIX,
    }
    ctx = {
        "run_id": arts.run_id,
        "run": arts.run,
        "state": run_state(arts),
        "handoff": arts.handoff,
        "block": arts.block,
        "n_cells": len(cells),
        "included": len(eligible),
        "excluded": len(cells) - len(eligible),
        "outcomes": dict(sorted(outcomes_count.items())),
        "tasks": tasks,
        "task_select": tasks if len(tasks) <= TASK_OPTIONS else None,
        "types": sorted(patterns.types) if patterns is not None else [],
        "events": sum(int(r.get("events") or 0) for r in cells) or figures.events,
        # secrets replaced in the IR's text (run.json records the count only when there were any)
        "redactions": int(((arts.run or {}).get("export") or {}).get("redactions") or 0),
        # made with --no-redact: the IR's text (timelines, quotes) holds the logs' secrets as written
        "unredacted": ((arts.run or {}).get("export") or {}).get("redacted") is False,
        # a pilot on a subset of the cells (run.json pilot): said in the header, every figure is over the subset
        "pilot": _pilot_label(arts),
        "n_patterns": patterns.total if patterns is not None else None,
        "luna_failures": luna_failures,
        "n_luna_failures": len(failed),
        "groups": groups,
        "group_shards": group_shards,
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
        "chart": prevalence_svg([r for r in eligible if str(r.get("task_id")) in shown_tasks], types_by_cell),
        "chart_families": len(chart_tasks),
        # A group's lists (its cells, tasks, runs) are shown up to this many items: its occurrence table,
        # built when the group is opened, holds every one (at 10,000 cells the lists were 268K DOM nodes).
        "group_list_cap": GROUP_LIST_CAP,
        "cell_rows": CELL_ROWS,
        "problems": figures.problems,
        "n_problems": figures.n_problems,
        "list_cap": LIST_CAP,
        "snippet_statuses": dict(sorted(figures.statuses.items())),
        "page_data": _script_json(page),
    }
    ctx["sections"] = [(a, t) for a, t, when in SECTIONS if when == "always" or ctx.get(when)]
    internal = _internal_anchors(
        arts,
        list(cell_shard),
        patterns.ids if patterns is not None else {},
        [str(g.get("group_id")) for g in groups or []],
    )
    return Built(ctx, top, internal, {**where, **cell_shard}, figures)


def _pilot_label(arts: RunArtifacts) -> str | None:
    raw = (arts.run or {}).get("pilot")
    return Pilot.model_validate(raw).label() if isinstance(raw, dict) else None


# ---------------------------------------------------------------- follow-up (lunasol followup)
def _followup(arts: RunArtifacts) -> dict[str, Any] | None:
    """The run's followup.json (a child run judged for its parent's proposal), validated, or None."""
    from pipeline.followup import read_followup  # startup cost: followup imports the runner and its model client

    doc = read_followup(arts.path)
    return None if doc is None else doc.model_dump(mode="json")


def build_report(run_dir: Path, root: Path) -> dict[str, int]:
    """Write the report directory's content into ``root`` (an empty directory); return its figures."""
    # patterns and groups grow with the batch: streamed (pipeline.report.stream), never read whole
    arts = RunDir(run_dir).read(ARTIFACTS - {"patterns", "groups"})
    writer = ShardWriter(root)
    built = context(arts, writer, root / ".spill")
    shutil.rmtree(root / ".spill", ignore_errors=True)
    env = _environment(built.top.snippets, built.internal, built.shards)
    html = env.get_template(TEMPLATE).render(**built.ctx)
    atomic_write_text(root / REPORT_INDEX, html)
    (root / MARKER).write_text("lunasol report directory: index.html and the data/ it loads\n", encoding="utf-8")
    page = len(html.encode("utf-8"))
    st = built.figures.statuses
    return {
        "bytes": page,
        "total_bytes": page + writer.bytes,
        "files": writer.files + 1,
        "refs": st.get("verified", 0),
        "hash_mismatches": st.get("hash_mismatch", 0),
        "unresolved": sum(n for k, n in st.items() if k not in ("verified", "hash_mismatch")),
    }


def render_report(run_dir: Path) -> tuple[str, dict[str, int]]:
    """The report's index page and its figures (its shards are built in a temporary directory and dropped)."""
    with tempfile.TemporaryDirectory(prefix="lunasol-report-") as tmp:
        stats = build_report(run_dir, Path(tmp))
        return (Path(tmp) / REPORT_INDEX).read_text(encoding="utf-8"), stats


def _check_out(out: Path) -> None:
    # Checked before rendering: a typo in the output path is bad input, not a new directory tree.
    if not out.parent.is_dir():
        raise BadInput(f"output directory does not exist: {out.parent}")
    if out.is_file():
        raise BadInput(f"output {out} is a file; a report is a directory (index.html and its data/): name a new one")
    if out.is_dir() and not (out / MARKER).is_file():
        raise BadInput(f"output {out} is a directory that holds no lunasol report; name a new one or an old report")


def write_report(run_dir: Path, out: Path | None = None) -> tuple[Path, dict[str, int]]:
    """Build the report directory (default ``RUN/report/``) atomically; return its ``index.html`` and figures.

    Built in a temporary sibling and renamed into place: a reader sees the old report or the new one,
    never a mix. Only a directory that is a lunasol report (or an empty one) is replaced.
    """
    if out is not None:
        _check_out(out)
    target = out if out is not None else RunDir(run_dir).report_dir
    if not run_dir.is_dir():
        raise BadInput(f"run directory not found: {run_dir}")
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        stats = build_report(run_dir, tmp)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; a report is read like the run's other files
        old = None
        if target.exists():
            old = target.parent / f".{target.name}.{os.getpid()}.old"
            os.replace(target, old)
        os.replace(tmp, target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out is None:  # the single page earlier versions wrote would now be a stale copy beside it
        RunDir(run_dir).path.joinpath(REPORT_FILE).unlink(missing_ok=True)
    return target / REPORT_INDEX, stats
