"""lunasol report: a directory (an escaped index page, its data shards) whose every cited id shows its raw lines.

The runs are built synthetically (see tests/test_diff.py: a generated bundle with one hostile log
line, exported to a real IR, plus small hand-written artifacts).
"""

from __future__ import annotations

import collections
import contextlib
import json
import re
import shutil
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from pipeline.cli.app import app
from pipeline.report import render_report, write_report
from pipeline.report.build import read_page_data
from pipeline.report.evidence import CONTEXT_LINES
from pipeline.report.shards import DATA_DIR, read_shard
from tests.diff.test_diff import CONTROLLER_REF, HOSTILE, build_run, hostile_event  # the synthetic run builder

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_run(tmp_path_factory.mktemp("report"))


def bundle_lines(run_dir: Path, ref: str) -> list[str]:
    """The raw lines of a ref, read straight from the bundle's bytes (independently of the report)."""
    m = re.fullmatch(r"(?P<path>[^#]+)#L(?P<a>\d+)-L(?P<b>\d+)", ref)
    assert m, ref
    bundle = (run_dir / json.loads((run_dir / "run.json").read_text())["bundle"]).resolve()
    raw = (bundle / m["path"]).read_bytes().decode("utf-8").split("\n")
    return raw[int(m["a"]) - 1 : int(m["b"])]


def manifest_sha(run_dir: Path, rel: str) -> str:
    bundle = (run_dir / json.loads((run_dir / "run.json").read_text())["bundle"]).resolve()
    files = json.loads((bundle / "manifest.json").read_text())["files"]
    return next(f["sha256"] for f in files if f["path"] == rel)


class _Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[tuple[str, str, str]] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        for name, value in attrs:
            if name in ("src", "href", "action", "srcset", "poster", "data") and value is not None:
                self.urls.append((tag, name, value))


def test_report_is_self_contained_and_escaped(run_dir: Path, tmp_path: Path) -> None:
    path, stats = write_report(run_dir, out=tmp_path / "r")
    html = path.read_text(encoding="utf-8")
    parser = _Collect()
    parser.feed(html)
    # No network or file assets in the page: only in-page anchors and data: URLs; its data/ shards are
    # added by its own script, and the CSP lets scripts come from the page's folder only.
    assert all(v.startswith("#") or v.startswith("data:") for _, _, v in parser.urls), parser.urls
    assert parser.tags.count("script") == 2 and "link" in parser.tags  # the code, the data block; data: favicon
    assert html.count('<script type="application/json" id="lunasol-data">') == 1
    assert "default-src 'none'" in html and "script-src 'unsafe-inline' 'self'" in html
    shards = sorted(p.name for p in (path.parent / DATA_DIR).iterdir())
    assert shards and all(n.endswith(".js") for n in shards)
    for name in shards:  # each file is one lunasolPut call of base64 (read_shard checks the whole text)
        assert read_shard(path.parent, name[:-3]) is not None
    # The hostile log line is text, not markup: in the statement it is escaped, in the data block it is
    # JSON inside a compressed chunk (and a '<' can never close the data block).
    assert "<script>window.__pwned" not in html and "<img src=x" not in html
    assert "<b>bold?</b>" not in html and "&lt;b&gt;bold?&lt;/b&gt;" in html
    block = re.search(r'id="lunasol-data">(.*?)</script>', html, re.S).group(1)
    assert "<" not in block
    data = read_page_data(path.parent)
    lines = [t for ch in data["chunks"].values() for f in ch.get("lines", {}).values() for t in f.values()]
    assert any(json.loads(t).get("content") == HOSTILE for t in lines if t.startswith("{"))
    assert stats["refs"] == 7 and stats["hash_mismatches"] == 0 and stats["unresolved"] == 0


def test_report_sections_and_embedded_lines_match_the_bundle(run_dir: Path, tmp_path: Path) -> None:
    path, _ = write_report(run_dir, out=tmp_path / "r")
    html = path.read_text(encoding="utf-8")
    for section in ("summary", "weaknesses", "proposals", "prevalence", "cells", "groups", "gates", "calls", "raw"):
        assert f'<section id="{section}">' in html
    # Summary first, then the weakness cards; human labels, not field names.
    assert (
        html.index('<section id="summary">')
        < html.index('<section id="weaknesses">')
        < html.index('<section id="cells">')
    )
    assert "gate 1: confirm" in html and "gate 1: reject" in html
    assert "First divergence" in html and "Attributed to the harness?" in html
    assert ">first_divergence<" not in html and "harness_attribution" not in html
    # Each embedded key: its own lines are exactly the bundle's lines of its ref, with context around.
    data = read_page_data(path)
    assert len(data["index"]) == 7
    for anchor, (key, chunk, status) in data["index"].items():
        entry = data["chunks"][chunk]["refs"][anchor]
        assert entry["key"] == key and status == "verified"
        lines = data["chunks"][chunk]["lines"][entry["lines"]]
        own = [lines[str(n)] for n in range(entry["start"], entry["end"] + 1)]
        assert own == bundle_lines(run_dir, entry["ref"])
        lo, hi = max(1, entry["start"] - CONTEXT_LINES), entry["end"] + CONTEXT_LINES
        everything = bundle_lines(run_dir, f"{entry['path']}#L1-L10000")
        everything = everything[:-1] if everything and everything[-1] == "" else everything  # the final newline
        for n in range(lo, min(hi, len(everything)) + 1):
            assert lines[str(n)] == everything[n - 1]  # context lines are the frozen ones too
    # Every cell has a timeline in its chunk; cited events are marked.
    c1 = data["chunks"]["C001"]
    assert c1["events"] and c1["events"][0][0].startswith("C001-e")
    assert set(c1["cited"]) <= {r[0] for r in c1["events"]} and c1["cited"]


def test_report_reads_the_manifest_once(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Batched passes over refs: the manifest is read once, and each raw file once per pass, whatever the
    # ref count: one pass for the keys the index page cites, then one per shard of cells (one here).
    import pipeline.bundle.manifest as manifest_mod
    import pipeline.ir.refs as refs_mod
    from pipeline.report import build

    reads: list[str] = []
    frozen: list[str] = []
    real_manifest, real_frozen = refs_mod.read_manifest, refs_mod.read_frozen
    monkeypatch.setattr(refs_mod, "read_manifest", lambda b: reads.append(str(b)) or real_manifest(b))
    monkeypatch.setattr(refs_mod, "read_frozen", lambda b, r, m: frozen.append(r) or real_frozen(b, r, m))
    assert manifest_mod is not None
    _, stats = render_report(run_dir)
    assert stats["refs"] == 7
    assert len(reads) == 1
    assert max(collections.Counter(frozen).values()) <= 2
    monkeypatch.setattr(build, "TL_CELLS", 1)  # a shard per cell: still once per pass that cites the file
    frozen.clear()
    again = render_report(run_dir)[1]
    assert [again[k] for k in ("refs", "hash_mismatches", "unresolved")] == [7, 0, 0]
    assert max(collections.Counter(frozen).values()) <= 1 + len({r.split("/")[1] for r in frozen})


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_report_is_deterministic_and_written_atomically(run_dir: Path, tmp_path: Path) -> None:
    (run_dir / "report.html").write_text("an earlier version's single page")
    path, stats = write_report(run_dir)
    assert path == run_dir / "report" / "index.html"
    assert not (run_dir / "report.html").exists()  # the stale single page is not left beside the new report
    first = _tree(path.parent)
    assert write_report(run_dir)[0] == path and _tree(path.parent) == first  # replaced whole, same bytes
    assert stats["bytes"] == len(first["index.html"]) and stats["files"] == len(first) - 1  # and its marker
    assert stats["total_bytes"] == sum(len(v) for k, v in first.items() if not k.startswith("."))
    assert not [p for p in run_dir.iterdir() if p.name.endswith((".tmp", ".old"))]
    res = CliRunner().invoke(app, ["report", str(run_dir), "-o", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    assert _tree(tmp_path / "r") == first
    assert "7 refs embedded, 0 hash mismatches" in res.output
    # only a report is ever replaced: a file, or a directory that is not a report, is one line, exit 2
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("mine")
    (tmp_path / "file").write_text("mine")
    for target in ("notes", "file"):
        res = CliRunner().invoke(app, ["report", str(run_dir), "-o", str(tmp_path / target)])
        assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
    assert (tmp_path / "notes" / "keep.txt").read_text() == "mine" and (tmp_path / "file").read_text() == "mine"


def test_the_search_index_made_a_few_cells_at_a_time_is_the_index_made_at_once(
    demo_gate1: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # (word, cell) pairs are made a range of cells at a time (bounded memory at 100,000 cells): ranges
    # of 5 cells over the demo's 24 must give byte for byte the index made in one range
    from pipeline.report import search

    whole = _tree(write_report(demo_gate1, tmp_path / "whole")[0].parent)
    monkeypatch.setattr(search, "PAIR_CELLS", 5)
    ranged = _tree(write_report(demo_gate1, tmp_path / "ranged")[0].parent)
    shards = {k for k in whole if k.startswith(f"{DATA_DIR}/s")}
    assert len(shards) > 10 and ranged == whole


def test_a_failed_build_leaves_the_old_report(run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.report import build

    path, _ = write_report(run_dir, out=tmp_path / "r")
    before = _tree(path.parent)

    def broken(*_a: Any, **_k: Any) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(build.ShardWriter, "put", broken)
    with pytest.raises(RuntimeError):
        write_report(run_dir, out=tmp_path / "r")
    assert _tree(path.parent) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]  # no temporary directory left


def test_partial_run_renders(run_dir: Path) -> None:
    partial = run_dir.parent / "partial-report"
    skip = shutil.ignore_patterns("*.json*", "*.yaml", "gates", "report.html", "report")
    shutil.copytree(run_dir, partial, ignore=skip)
    shutil.copy(run_dir / "run.json", partial / "run.json")
    html, stats = render_report(partial)
    assert "No patterns.jsonl" in html and "No weakness shortlist" in html and "No proposals yet" in html
    assert stats["refs"] == 0


def test_blocked_run_shows_the_receipt_and_the_unblock_command(run_dir: Path) -> None:
    blocked = run_dir.parent / "blocked-report"
    shutil.copytree(run_dir, blocked, ignore=shutil.ignore_patterns("weakness-shortlist.json", "proposals.yaml"))
    receipt = {"schema_version": 1, "run_id": "blocked-report", "stage": "sol", "blocked_at": "2026-01-01T00:00:00Z",
               "constraint_class": "missing_data", "blocking_constraint": "no recording for <sol>", "error": "Blocked",
               "why_all_paths_dead": "replay only", "requested_unblock": "lunasol run B --record DIR && echo '<x>'",
               "tried_actions": []}  # fmt: skip
    (blocked / "block-receipt.json").write_text(json.dumps(receipt))
    html, _ = render_report(blocked)
    assert "Blocked at sol" in html and "missing_data" in html
    assert "lunasol run B --record DIR &amp;&amp; echo &#39;&lt;x&gt;&#39;" in html
    assert "No weakness shortlist" in html


def test_changed_bundle_bytes_are_not_embedded(tmp_path: Path) -> None:
    run = build_run(tmp_path)
    target = tmp_path / "bundle" / "cells/C001/controller.jsonl"
    target.write_bytes(target.read_bytes().replace(b"stage", b"STAGE", 1))
    path, stats = write_report(run, out=tmp_path / "r")
    html = path.read_text(encoding="utf-8")
    assert stats["hash_mismatches"] >= 1
    data = read_page_data(path)
    _, chunk, status = next(v for v in data["index"].values() if v[0] == "cells/C001/controller.jsonl#L1-L2")
    assert status == "hash_mismatch"
    assert "cells/C001/controller.jsonl" not in data["chunks"][chunk]["lines"]
    assert 'data-key="cells/C001/controller.jsonl#L1-L2" data-status="hash_mismatch"' in html


def test_report_bad_run_is_exit_2(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["report", str(tmp_path / "nope")])
    assert res.exit_code == 2 and "run directory not found" in res.output


@pytest.mark.browser
def test_report_in_headless_chromium(run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not CHROMIUM.exists():
        pytest.fail("Debian chromium is required: apt-get install -y chromium (.ci/run does it)")
    from playwright.sync_api import expect, sync_playwright

    from pipeline.report import build

    monkeypatch.setattr(build, "SEARCH_BATCH", 1)  # the search reads one shard at a time: every batch boundary
    monkeypatch.setattr(build, "TL_CELLS", 1)  # a timeline shard per cell, two cells per shard of rows:
    monkeypatch.setattr(build, "ROW_CELLS", 2)  # every click below crosses shards
    page_path, _ = write_report(run_dir, out=tmp_path / "report")
    hostile = hostile_event(run_dir)
    errors: list[str] = []
    dialogs: list[str] = []
    requests: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(page_path.as_uri())
            page.wait_for_load_state("load")
            assert page.title() == f"lunasol report — {run_dir.name}"
            page.wait_for_selector("#cells-table tbody tr")  # the first page of rows, from data/c0.js
            # Click a ref: its lines and their context are shown beside the text, not over it.
            for key in (hostile, CONTROLLER_REF):
                page.locator(f'#weaknesses a.ref:text-is("{key}")').first.click()
                page.wait_for_selector("#viewer:not([hidden]) .lines")
                viewer = page.locator("#viewer-body")
                ref = viewer.locator("code.ref-text").inner_text()
                cited = viewer.locator(".line.hit .txt").all_inner_texts()
                assert cited == bundle_lines(run_dir, ref), key
                numbers = [int(n) for n in viewer.locator(".line .ln").all_inner_texts()]
                start, end = (int(x) for x in re.findall(r"#L(\d+)-L(\d+)", ref)[0])
                assert numbers[0] == max(1, start - CONTEXT_LINES) and numbers[-1] >= end  # context before
                assert viewer.locator(".badge").first.inner_text() == "verified"
                assert viewer.locator("code.sha").inner_text() == manifest_sha(run_dir, ref.split("#")[0])
                if key == hostile:  # the hostile line is shown as text, exactly as logged
                    assert json.loads(cited[0])["content"] == HOSTILE
            main_box = page.locator("main").bounding_box()
            side_box = page.locator("#viewer").bounding_box()
            assert main_box and side_box and main_box["x"] + main_box["width"] <= side_box["x"] + 1  # side by side
            # A filter changes the visible count.
            count = page.locator("#cells-count")
            total = page.locator("#cells-table tbody tr").count()
            assert count.inner_text() == f"{total} of {total} cells"
            page.select_option("#f-outcome", "failed")
            # not merely changed: "reading N cells…" comes first, the filtered rows and their count after
            expect(count).to_have_text(re.compile(rf"^(?!{total} of)\d+ of {total} cells$"))
            shown = page.locator("#cells-table tbody tr:visible").count()
            assert 0 < shown < total and count.inner_text() == f"{shown} of {total} cells"
            outcomes = page.locator("#cells-table tbody tr").evaluate_all("rs => rs.map(r => r.dataset.outcome)")
            assert outcomes == ["failed"] * shown
            page.select_option("#f-outcome", "")
            expect(count).to_have_text(f"{total} of {total} cells")
            # Search finds an event by its text; its result opens the cell's timeline at that event.
            page.fill("#search", "zz-no-such-text")  # superseded by the next query before or after it ends
            page.fill("#search", "__pwned = 1")
            page.locator("#search-status", has_text="1 event match in ").wait_for()  # the last query's answer
            hit = page.locator("#search-results a.cell").first
            event_id = hit.inner_text()
            assert event_id == hostile
            hit.click()
            page.wait_for_selector(f'#viewer .tl .ev.focus[data-event="{event_id}"]')
            assert page.locator("#viewer .cellview h3").inner_text().startswith("Cell ")
            # An in-page link to a pattern group opens its (collapsed) card and builds its occurrences.
            page.keyboard.press("Escape")
            page.locator('#weaknesses a.internal:text-is("G-01")').first.click()
            page.wait_for_selector("#group-G-01[open] table.occ")
            page.screenshot(path=str(tmp_path / "report.png"), full_page=False)
            assert page.evaluate("typeof window.__pwned") == "undefined"
            assert page.locator("#viewer").is_hidden()
        finally:
            browser.close()
    assert errors == [] and dialogs == []
    assert all(u.startswith(("file:", "data:")) for u in requests), requests
    assert (tmp_path / "report.png").stat().st_size > 10_000


def _stream_matches_the_whole_batch_pass(ir_path: Path) -> None:
    from pipeline.report import data

    ir = data.IR(ir_path)
    try:
        assert ir.con is not None
        every = ir.con.execute(
            "SELECT cell_id, event_id, source_path, line_start, line_end FROM events ORDER BY cell_id, seq"
        ).fetchall()
        streamed = list(data.timelines(ir))
        cells = [c for c, _ in streamed]
        assert cells == sorted(set(cells)) and len(cells) > 1  # each cell once, in order
        assert [(c, r[0]) for c, rows in streamed for r in rows] == [(c, e) for c, e, *_ in every]
        path_cell: dict[str, str] = {}
        first: dict[tuple[str, int, int], str] = {}
        for cell, event, path, a, b in every:
            path_cell.setdefault(path, cell)
            first.setdefault((path, a, b), event)
        spans = set(first) | {(p, a, a) for p, a, _ in first}  # exact spans, and spans no event has
        assert data.places(ir, spans) == (path_cell, {s: first[s] for s in spans if s in first})
    finally:
        ir.close()


def test_timelines_stream_cell_by_cell_and_places_are_the_first_in_cell_order(demo_gate1: Path, tmp_path: Path) -> None:
    # The page's chunks are built one cell at a time (10,000 cells' rows at once were ~2 GiB); what
    # they hold must be what the whole-batch pass gave: every cell's rows in order, each file's
    # first cell and each span's first event in (cell, seq) order.
    _stream_matches_the_whole_batch_pass(demo_gate1 / "ir.duckdb")
    # Inspect .eval zips: every event of a log on line 1 (one span, many events), two logs in one cell each
    from pipeline.adapters import import_bundle
    from pipeline.ir.export import export
    from tests.adapters.adapter_helpers import SHARED_DATA, need_shared_data

    need_shared_data()
    src = tmp_path / "logs"
    src.mkdir()
    for name in ("log_message_deduplication.eval", "log_read_sample.eval"):
        shutil.copyfile(SHARED_DATA / "inspect-ai-logs/tests/log/test_eval_log" / name, src / name)
    import_bundle("inspect", src, tmp_path / "b")
    _stream_matches_the_whole_batch_pass(export(tmp_path / "b", tmp_path / "runs" / "r").run_dir / "ir.duckdb")


def test_linkify_finds_the_runs_own_ids_as_whole_words_and_never_inside_a_ref() -> None:
    from pipeline.report.build import _linkifier

    internal = {
        "W-01": ("anchor", "weakness-W-01"),
        "C001": ("cell", "C001"),
        "C001-P01": ("pattern", "C001"),
        "run.v2": ("cell", "run.v2"),  # a cell id that is not a plain word stays findable
    }
    link = _linkifier({}, internal)
    html = str(link("W-01 in C001 (C001-P01); xW-01 W-01x <b> run.v2, cells/C001/a.jsonl#L3-L3 C001-e0001"))
    assert html.count('href="#weakness-W-01"') == 1  # W-01 only where it is a whole word
    assert html.count('data-cell="C001"') == 2  # C001 and its pattern; not inside the ref or the event id
    assert 'data-pattern="C001-P01"' in html and 'data-cell="run.v2"' in html
    assert "&lt;b&gt;" in html and "cells/C001/a.jsonl#L3-L3" in html and "C001-e0001" in html


def test_a_bad_line_holding_the_id_shown_is_one_clear_error(tmp_path: Path) -> None:
    from pipeline.core.errors import BadInput
    from pipeline.report.items import _matching_rows

    path = tmp_path / "patterns.jsonl"
    path.write_text('{"pattern_id": "C001-P01", "cell_id": "C001"}\n{"cell_id": "C002", oops\n{"cell_id": "C002"}\n')
    assert _matching_rows(path, "cell_id", "C001") == [{"pattern_id": "C001-P01", "cell_id": "C001"}]
    with pytest.raises(BadInput, match=r"patterns.jsonl:2: not valid JSON"):
        _matching_rows(path, "cell_id", "C002")
    assert _matching_rows(tmp_path / "absent.jsonl", "cell_id", "C001") == []


def test_a_groups_long_lists_are_cut_and_its_occurrences_keep_every_cell(
    demo_gate1: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # At 10,000 cells the groups' "Other fields" (every cell, task and run of each group) were 268K DOM nodes.
    from pipeline.report import build

    groups = json.loads((demo_gate1 / "pattern-groups.json").read_text(encoding="utf-8"))["groups"]
    big = max(groups, key=lambda g: len(g["support"]["cells"]))
    n = len(big["support"]["cells"])
    assert n > 2
    monkeypatch.setattr(build, "GROUP_LIST_CAP", 2)
    monkeypatch.setattr(build, "OCC_ROWS", 3)  # a group's occurrences over several shards, read back whole
    page, _ = write_report(demo_gate1, out=tmp_path / "r")
    html = page.read_text(encoding="utf-8")
    start = html.index(f'id="group-{big["group_id"]}"')
    card = html[start : html.index("</details>\n</details>", start)]
    assert f"… and {n - 2} more (the occurrence table" in card
    assert sum(1 for c in big["support"]["cells"] if f'data-cell="{c}"' in card or f">{c}<" in card) == 2
    occurrences = read_page_data(page)["chunks"]["_groups"][big["group_id"]]
    assert {o["cell_id"] for o in occurrences} == set(big["support"]["cells"])  # every cell stays reachable
    assert [o["occurrence_id"] for o in occurrences] == [o["occurrence_id"] for o in big["occurrences"]]
    monkeypatch.setattr(build, "GROUP_LIST_CAP", 10_000)
    full, _ = render_report(demo_gate1)
    assert "more (the occurrence table" not in full


@contextlib.contextmanager
def _page_of_one_row(run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The run's report open in headless Chromium, its tables paged one row at a time."""
    if not CHROMIUM.exists():
        pytest.fail("Debian chromium is required: apt-get install -y chromium (.ci/run does it)")
    from playwright.sync_api import sync_playwright

    from pipeline.report import build

    monkeypatch.setattr(build, "CELL_ROWS", 1)
    monkeypatch.setattr(build, "TL_CELLS", 2)  # shards of every kind hold a few: pages cross them
    monkeypatch.setattr(build, "ROW_CELLS", 2)
    monkeypatch.setattr(build, "OCC_ROWS", 2)
    monkeypatch.setattr(build, "HIT_CAP", 10_000)  # the search counts every hit (the oracle below counts them all)
    page_path, _ = write_report(run, out=tmp_path / "report")
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(page_path.as_uri())
            page.wait_for_selector("#cells-table tbody tr")
            yield page
            assert errors == []
        finally:
            browser.close()


def test_the_cells_table_shows_a_page_of_rows_and_filters_and_search_cover_all(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from playwright.sync_api import expect

    # At 10,000 cells every row laid out made each open of the side viewer take seconds.
    hostile = hostile_event(run_dir)
    with _page_of_one_row(run_dir, tmp_path, monkeypatch) as page:
        total = read_page_data(tmp_path / "report")["cells"]
        assert total >= 3
        count = page.locator("#cells-count")
        rows = page.locator("#cells-table tbody tr:visible")
        # rows are drawn when their shards are read (a promise): wait for them, never count at once
        expect(rows).to_have_count(1)
        expect(count).to_have_text(f"1 shown of {total} matching, of {total} cells")
        page.click("#cells-more-button")
        expect(rows).to_have_count(2)
        # the search reads every cell, the hidden ones too
        page.fill("#search", "__pwned = 1")
        page.locator("#search-status", has_text=f"1 event match in {total} cells").wait_for()
        assert page.locator("#search-results a.cell").first.inner_text() == hostile
        page.select_option("#f-outcome", "failed")  # a filter starts again from the first page of its rows
        # the count reads "reading N cells…" until the filtered rows are drawn with it, in one step
        drawn = re.compile(rf"^1 (shown of \d+ matching, of|of) {total} cells$")
        expect(count).to_have_text(drawn)
        expect(rows).to_have_count(1)
        for _ in range(total):
            if page.locator("#cells-more").is_hidden():
                break
            page.click("#cells-more-button")  # a click on a stale button only asks for one more page
        expect(count).to_have_text(re.compile(rf"^\d+ of {total} cells$"))  # every matching row shown
        assert rows.count() < total
        assert all(rows.nth(i).get_attribute("data-outcome") == "failed" for i in range(rows.count()))
        assert count.inner_text() == f"{rows.count()} of {total} cells"


def test_a_groups_occurrence_table_shows_a_page_of_rows_and_every_one_on_asking(
    demo_gate1: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # At 10,000 cells opening the largest group built 9,585 rows (5.8 s), and every later click laid them out again.
    from playwright.sync_api import expect

    with _page_of_one_row(demo_gate1, tmp_path, monkeypatch) as page:
        occurrences = read_page_data(tmp_path / "report")["chunks"]["_groups"]
        gid = max(occurrences, key=lambda g: len(occurrences[g]))
        n = len(occurrences[gid])
        assert n >= 2
        page.locator(f"#group-{gid} > summary").click()
        rows = page.locator(f"#group-{gid} table.occ tbody tr")
        expect(rows).to_have_count(1)
        button = page.locator(f"#group-{gid} div.occ button")
        expect(button).to_have_text(f"show 1 more of {n - 1}")
        # every click at once, before any page's shard is read: each still adds the next rows, once
        button.evaluate(f"b => {{ for (let i = 0; i < {n - 1}; i++) b.click(); }}")
        expect(rows).to_have_count(n)
        expect(button).to_be_hidden()
        assert [rows.nth(i).locator("td").first.inner_text() for i in range(n)] == [
            o["occurrence_id"] for o in occurrences[gid]
        ]


def _matches(chunks: dict[str, Any], query: str) -> int:
    """What the page's search counts for ``query``, computed here from the inflated chunks (its oracle)."""
    q, n = query.strip().lower(), 0
    for name, ch in chunks.items():
        if name.startswith("_"):
            continue  # the page's own chunks (groups), not a cell's
        for r in ch.get("events", []):
            hay = " ".join("" if x is None else str(x) for x in (r[0], r[2], r[3], r[4], r[5], r[6], r[7])).lower()
            lines = ch["lines"].get(r[8]) or {}
            raw = "".join(" " + lines[str(i)] for i in range(r[9], r[10] + 1) if str(i) in lines) if r[8] else ""
            n += q in hay or q in raw.lower()
    return n


def test_the_search_skips_no_cell_that_holds_the_query(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A query of plain ASCII without space or quote is looked for in each chunk's text before its
    # JSON is parsed (a 10,000-cell search spent most of its time parsing cells that cannot match).
    from playwright.sync_api import expect

    with _page_of_one_row(run_dir, tmp_path, monkeypatch) as page:
        chunks = read_page_data(tmp_path / "report")["chunks"]
        cells = read_page_data(tmp_path / "report")["cells"]
        queries = ["__pwned", "__pwned = 1", "E0", "e0", "-e00", "xyzzy-none", '="', "a b", "WINDOW.__pw"]
        counts = {}
        for q in queries:
            page.fill("#search", "")
            expect(page.locator("#search-status")).to_have_text("")  # the last query's answer is gone
            page.fill("#search", q)
            status = page.locator("#search-status", has_text=" match in ")
            status.wait_for()
            counts[q] = int(status.inner_text().split()[0])
            assert f"in {cells} cells" in status.inner_text()
        assert counts == {q: _matches(chunks, q) for q in queries}
        assert counts["__pwned"] == counts["__pwned = 1"] == 1 and counts["E0"] == counts["e0"] > 1
        assert not counts["xyzzy-none"]
        # The index finds text where each query word begins a word: "wned" is inside "pwned", not at its start.
        page.fill("#search", "")
        expect(page.locator("#search-status")).to_have_text("")
        page.fill("#search", "wned")
        page.locator("#search-status", has_text=" match in ").wait_for()
        assert _matches(chunks, "wned") == 1 and page.locator("#search-status").inner_text().startswith("0 events")


def test_the_build_streams_what_grows_with_the_batch(demo_gate1: Path, tmp_path: Path) -> None:
    # patterns.jsonl and pattern-groups.json are read a shard of cells / a group at a time: what the
    # report reads back must be exactly what the whole documents hold.
    from pipeline.artifacts.rundir import RunDir
    from pipeline.report import stream

    run = RunDir(demo_gate1)
    whole = run.read(frozenset({"patterns", "groups"}))
    index = stream.PatternIndex(run.patterns)
    cells = sorted({str(p["cell_id"]) for p in whole.patterns or []})
    assert len(cells) > 2 and index.total == len(whole.patterns or [])
    got = index.rows(cells[::2])
    for cell in cells[::2]:
        assert got[cell] == [p for p in whole.patterns or [] if p["cell_id"] == cell]
    assert list(stream.groups(run)) == whole.groups
    # an older pattern-groups.json is read whole and upgraded, as RunDir.read does
    old = tmp_path / "old-run"
    shutil.copytree(demo_gate1, old, ignore=shutil.ignore_patterns("report", "ir.duckdb*"))
    doc = json.loads((old / "pattern-groups.json").read_text(encoding="utf-8"))
    doc["schema_version"] = 99
    (old / "pattern-groups.json").write_text(json.dumps(doc), encoding="utf-8")
    from pipeline.core.errors import BadInput

    with pytest.raises(BadInput, match="newer than this lunasol reads"):
        list(stream.groups(RunDir(old)))
    (old / "pattern-groups.json").write_text('{"groups": [', encoding="utf-8")
    with pytest.raises(BadInput, match="not valid JSON"):
        list(stream.groups(RunDir(old)))
