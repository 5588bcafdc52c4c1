"""Gather one run's artifacts and render them into a single self-contained HTML page.

The page needs nothing but itself: CSS and JS are inline, a Content-Security-Policy forbids
every network fetch, and the raw lines of every cited event id or ref are embedded (read
from the frozen bundle, hash checked). All text goes through jinja2 autoescaping: log text
is untrusted. The output is deterministic (no timestamps), so a rerun gives the same bytes.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Any

from markupsafe import Markup, escape

from pipeline.core.canonical import atomic_write_text
from pipeline.core.errors import BadInput
from pipeline.diff.artifacts import Row, RunArtifacts, load_run
from pipeline.diff.compare import call_totals, validation_by_id, validation_summary
from pipeline.diff.match import EVENT_ID_RE, REF_RE, cited_ids
from pipeline.models.calllog import summarise
from pipeline.report.evidence import EvidenceReader, Snippet
from pipeline.run.index import run_state

TEMPLATE = "report.html.j2"
_TOKEN = re.compile(f"(?:{REF_RE.pattern})|(?:{EVENT_ID_RE.pattern})")


def _ir_rows(arts: RunArtifacts, sql: str) -> list[Row]:
    """Rows of a read-only query on the run's IR; [] when the IR or a table is absent."""
    if not arts.ir_path.is_file():
        return []
    import duckdb

    try:
        con = duckdb.connect(str(arts.ir_path), read_only=True)
    except duckdb.Error:
        return []
    try:
        cur = con.execute(sql)
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]
    except duckdb.Error:  # a table a partial run never wrote
        return []
    finally:
        con.close()


def _coverage(arts: RunArtifacts) -> list[Row]:
    rows = _ir_rows(
        arts,
        "SELECT c.cell_id, c.task_id, c.run_id, c.eligibility, c.exclusion_reason, "
        "cov.status, cov.reason, cov.events, o.label "
        "FROM cells c LEFT JOIN coverage cov USING (cell_id) LEFT JOIN outcomes o USING (cell_id) "
        "ORDER BY c.cell_id",
    )
    if not rows:
        rows = _ir_rows(arts, "SELECT cell_id, task_id, run_id, eligibility, exclusion_reason FROM cells ORDER BY 1")
    hits = {r["cell_id"]: r["n"] for r in _ir_rows(arts, "SELECT cell_id, count(*) AS n FROM probe_hits GROUP BY 1")}
    pats: dict[str, int] = {}
    for p in arts.patterns or []:
        pats[str(p.get("cell_id"))] = pats.get(str(p.get("cell_id")), 0) + 1
    for r in rows:
        r["patterns"] = pats.get(r["cell_id"], 0) if arts.patterns is not None else None
        r["probe_hits"] = hits.get(r["cell_id"], 0) if hits else None
    return rows


def _gate1_decisions(arts: RunArtifacts) -> dict[str, Any]:
    latest: tuple[float, Row] | None = None
    for name, receipt in sorted(arts.gates.items()):
        if str(receipt.get("gate") or name).startswith("gate1"):
            rev = receipt.get("new_revision")
            key = float(rev) if isinstance(rev, int | float) else 0.0
            if latest is None or key >= latest[0]:
                latest = (key, receipt)
    if latest is None:
        return {}
    req = latest[1].get("request")
    decisions = req.get("decisions") if isinstance(req, dict) else latest[1].get("decisions")
    return dict(decisions) if isinstance(decisions, dict) else {}


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


def _internal_anchors(arts: RunArtifacts) -> dict[str, str]:
    """Ids of this run's own items (patterns, groups, weaknesses, proposals) -> their anchors in the page."""
    out: dict[str, str] = {}
    for rows, key, prefix in (
        (arts.patterns, "pattern_id", "pattern"),
        (arts.groups, "group_id", "group"),
        (arts.weaknesses, "weakness_id", "weakness"),
        (arts.proposals, "proposal_id", "proposal"),
    ):
        for row in rows or []:
            if isinstance(row.get(key), str) and row[key]:
                out[row[key]] = f"{prefix}-{row[key]}"
    return out


def _linkifier(snippets: dict[str, Snippet], internal: dict[str, str]) -> Any:
    # One pass over the text: refs and event ids (raw lines), then the run's own ids (in-page anchors).
    names = "|".join(re.escape(k) for k in sorted(internal, key=len, reverse=True))
    token = re.compile(_TOKEN.pattern + (rf"|(?<![\w-])(?:{names})(?![\w-])" if names else ""))

    def linkify(value: Any) -> Markup:
        """Escape text; turn every known event id / ref into a link to its raw lines, own ids into anchors."""
        text = str(value)
        out: list[str] = []
        pos = 0
        for m in token.finditer(text):
            word = m.group(0)
            snip = snippets.get(word)
            if snip is not None:
                cls = "ref" if snip.status == "verified" else "ref bad"
                link = f'<a class="{cls}" href="#{snip.anchor}" data-ref="{snip.anchor}">{escape(word)}</a>'
            elif word in internal:
                link = f'<a class="internal" href="#{escape(internal[word])}">{escape(word)}</a>'
            else:
                continue
            out.append(str(escape(text[pos : m.start()])))
            out.append(link)
            pos = m.end()
        out.append(str(escape(text[pos:])))
        return Markup("".join(out))

    return linkify


def _environment(snippets: dict[str, Snippet], internal: dict[str, str]) -> Any:
    import jinja2

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
    return env


def context(arts: RunArtifacts) -> tuple[dict[str, Any], dict[str, Snippet]]:
    """Everything the template shows, and the resolved snippets of every cited key."""
    cited: set[str] = set()
    for part in (arts.patterns, arts.groups, arts.shortlist, arts.proposals, arts.validation, arts.block):
        if part is not None:
            cited |= cited_ids(part)
    snippets = EvidenceReader(arts.path).resolve(cited)
    by_cell: dict[str, list[Row]] = {}
    for p in arts.patterns or []:
        by_cell.setdefault(str(p.get("cell_id")), []).append(p)
    vals = validation_by_id(arts.validation)
    proposals = [
        {"card": p, "validation": vals.get(str(p.get("proposal_id"))), "summary": None} for p in arts.proposals or []
    ]
    for entry in proposals:
        entry["summary"] = validation_summary(entry["validation"])
    coverage = _coverage(arts)
    calls = _calls_summary(arts)
    statuses: dict[str, int] = {}
    for s in snippets.values():
        statuses[s.status] = statuses.get(s.status, 0) + 1
    ctx = {
        "run_id": arts.run_id,
        "run": arts.run,
        "state": run_state(arts),
        "handoff": arts.handoff,
        "block": arts.block,
        "coverage": coverage,
        "included": sum(1 for r in coverage if r.get("eligibility") == "valid_behavior"),
        "excluded": sum(1 for r in coverage if r.get("eligibility") != "valid_behavior"),
        "events": sum(int(r.get("events") or 0) for r in coverage),
        # secrets replaced in the IR's text (run.json records the count only when there were any)
        "redactions": int(((arts.run or {}).get("export") or {}).get("redactions") or 0),
        "patterns": arts.patterns,
        "patterns_by_cell": sorted(by_cell.items()),
        "groups": arts.groups,
        "weaknesses": arts.weaknesses,
        "dropped": arts.dropped_weaknesses,
        "shortlist_digest": arts.shortlist.get("digest") if isinstance(arts.shortlist, dict) else None,
        "gate1": _gate1_decisions(arts),
        "proposals": proposals if arts.proposals is not None else None,
        "validation": arts.validation,
        # Per weakness: the proposer's outcome (accepted / rejected cards, an honest zero and its note).
        "proposer_outcomes": [w for w in (arts.validation.get("weaknesses") or []) if isinstance(w, dict)]
        if isinstance(arts.validation, dict) and isinstance(arts.validation.get("weaknesses"), list)
        else [],
        "gates": sorted(arts.gates.items()),
        "calls": calls,
        "snippets": [snippets[k] for k in sorted(snippets)],
        "snippet_statuses": dict(sorted(statuses.items())),
    }
    return ctx, snippets


def render_report(run_dir: Path) -> tuple[str, dict[str, int]]:
    """The report's HTML and its figures (refs embedded, hash mismatches, unresolved ids)."""
    arts = load_run(run_dir)
    ctx, snippets = context(arts)
    html = _environment(snippets, _internal_anchors(arts)).get_template(TEMPLATE).render(**ctx)
    stats = {
        "bytes": len(html.encode("utf-8")),
        "refs": sum(1 for s in snippets.values() if s.status == "verified"),
        "hash_mismatches": sum(1 for s in snippets.values() if s.status == "hash_mismatch"),
        "unresolved": sum(1 for s in snippets.values() if s.status not in ("verified", "hash_mismatch")),
    }
    return html, stats


def write_report(run_dir: Path, out: Path | None = None) -> tuple[Path, dict[str, int]]:
    """Render and write atomically (default ``RUN/report.html``); return the path and figures."""
    if out is not None:
        # Checked before rendering: a typo in the output path is bad input, not a new directory tree.
        if out.is_dir():
            raise BadInput(f"output {out} is a directory; name the file, e.g. {out / 'report.html'}")
        if not out.parent.is_dir():
            raise BadInput(f"output directory does not exist: {out.parent}")
    html, stats = render_report(run_dir)
    path = out if out is not None else run_dir / "report.html"
    atomic_write_text(path, html)
    return path, stats
