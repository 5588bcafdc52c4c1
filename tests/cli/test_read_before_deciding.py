"""Reading before deciding: `lunasol show`, whole statements in run/status, --digest required, no silent supersede.

Runs on the demo replayed from its committed recordings (hand-written fixture answers).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.cli.app import app
from pipeline.report.items import find_item
from pipeline.run.status import gate_report
from pipeline.state import handoff as hf
from tests.conftest import DEMO_RECORDINGS

runner = CliRunner()


@pytest.fixture
def gate1_run(demo_gate1: Path) -> Path:
    return demo_gate1


@pytest.fixture
def copy(demo_copy: Path) -> Path:
    return demo_copy


def _shortlist(run_dir: Path) -> dict:
    return json.loads((run_dir / "weakness-shortlist.json").read_text())


def test_show_prints_the_whole_weakness(gate1_run: Path) -> None:
    w = _shortlist(gate1_run)["weaknesses"][0]
    res = runner.invoke(app, ["show", str(gate1_run), w["weakness_id"]])
    assert res.exit_code == 0, res.output
    flat = " ".join(res.stdout.split())
    assert " ".join(w["statement"].split()) in flat  # the full statement, not a prefix
    for label in ("First divergence", "Attributed to the harness?", "Support", "Counter-evidence",
                  "Other explanations", "Falsifiable prediction"):  # fmt: skip
        assert label in res.stdout
    for text in [w["counterfactual_prediction"], *w["alternative_explanations"], w["harness_attribution"]["why"]]:
        assert " ".join(text.split()) in flat
    for item in w["counter_evidence"]["items"]:
        assert " ".join(item["note"].split()) in flat
    assert all(e in flat for e in w["support"]["event_refs"])
    as_json = json.loads(runner.invoke(app, ["show", str(gate1_run), w["weakness_id"], "--json"]).stdout)
    assert as_json["kind"] == "weakness" and as_json["item"] == w


def test_show_cells_groups_events_and_refs(gate1_run: Path) -> None:
    w = _shortlist(gate1_run)["weaknesses"][0]
    event = w["support"]["event_refs"][0]
    item = find_item(gate1_run, event)
    assert item.kind == "event" and item.evidence[0]["status"] == "verified"
    cited = [r for r in item.evidence[0]["lines"] if r["cited"]]
    assert len(cited) == 1 and len(item.evidence[0]["lines"]) > 1  # the event's line and its context
    res = runner.invoke(app, ["show", str(gate1_run), event])
    assert res.exit_code == 0 and f">{cited[0]['line']:>6}  {cited[0]['text']}" in res.stdout
    assert find_item(gate1_run, w["support"]["cells"][0]).kind == "cell"
    assert find_item(gate1_run, w["support"]["pattern_groups"][0]).kind == "group"
    with_ev = find_item(gate1_run, w["weakness_id"], evidence=True)
    assert {e["key"] for e in with_ev.evidence} >= set(w["support"]["event_refs"])
    bad = runner.invoke(app, ["show", str(gate1_run), "W-99"])
    assert bad.exit_code == 2 and "W-01" in bad.stderr


def test_show_reads_groups_and_patterns_only_for_ids_that_need_them(gate1_run: Path, artifact_reads: list[str]) -> None:
    # pattern-groups.json and patterns.jsonl grow with the batch (tens of MB at 10,000 cells)
    read = artifact_reads
    big = {"pattern-groups.json", "patterns.jsonl"}
    w = _shortlist(gate1_run)["weaknesses"][0]
    assert find_item(gate1_run, w["weakness_id"]).kind == "weakness"
    assert find_item(gate1_run, w["support"]["event_refs"][0]).kind == "event"
    assert not big & set(read)
    cell = find_item(gate1_run, w["support"]["cells"][0])  # its patterns: only the lines holding its id
    pattern = cell.item["patterns"][0]
    assert pattern["cell_id"] == cell.item_id and find_item(gate1_run, pattern["pattern_id"]).item == pattern
    whole = [json.loads(line) for line in (gate1_run / "patterns.jsonl").read_text().splitlines() if line.strip()]
    assert cell.item["patterns"] == [p for p in whole if p["cell_id"] == cell.item_id]
    assert not big & set(read)
    assert find_item(gate1_run, w["support"]["pattern_groups"][0]).kind == "group"
    assert read.count("pattern-groups.json") == 1 and "patterns.jsonl" not in read


def test_run_and_status_show_whole_statements_and_point_to_reading(gate1_run: Path) -> None:
    text = gate_report(gate1_run)
    flat = " ".join(text.split())
    for w in _shortlist(gate1_run)["weaknesses"]:
        assert " ".join(w["statement"].split()) in flat
    assert "…" not in text
    lines = text.splitlines()
    read = [i for i, ln in enumerate(lines) if ln.startswith("read first: lunasol show")]
    nxt = [i for i, ln in enumerate(lines) if ln.startswith("next: lunasol confirm")]
    assert read and nxt and read[0] < nxt[0]  # reading comes before deciding
    st = runner.invoke(app, ["status", str(gate1_run)])
    assert "read first: lunasol report" in st.stdout and "…" not in st.stdout


def _confirm(run_dir: Path, *extra: str) -> object:
    return runner.invoke(
        app, ["confirm", str(run_dir), "--decision", "W-01=confirm", "--decision", "W-02=confirm", "--by", "qa", *extra]
    )


def test_confirm_without_digest_is_refused(copy: Path) -> None:
    res = _confirm(copy)
    assert res.exit_code == 2
    assert "--digest is required" in res.stderr and f"lunasol status {copy}" in res.stderr
    assert hf.load(copy).userRootCauseConfirmation == "pending"
    assert not (copy / "gates").exists() and not (copy / "block-receipt.json").exists()


def test_replay_names_the_real_revisions_and_supersede_is_explicit(copy: Path) -> None:
    digest = str(hf.load(copy).shortlist_digest)
    first = _confirm(copy, "--digest", digest)
    assert first.exit_code == 0, first.output
    propose = runner.invoke(app, ["propose", str(copy), "--replay", str(DEMO_RECORDINGS)])
    assert propose.exit_code == 0, propose.output
    assert "P-01   W-01" in propose.stdout  # the proposals table
    assert propose.stdout.index("read first: lunasol show") < propose.stdout.index("next: lunasol select")
    pdigest = str(hf.load(copy).proposals_digest)
    sel = runner.invoke(app, ["select", str(copy), "--proposal", "P-01", "--by", "qa", "--digest", pdigest])
    assert sel.exit_code == 0, sel.output
    now = hf.load(copy).revision
    again = _confirm(copy, "--digest", digest)  # the same decision: a replay, which says where the run is now
    assert again.exit_code == 0
    assert "was recorded at revision 4→5" in again.stdout and f"now at revision {now}" in again.stdout
    decide = ["confirm", str(copy), "--decision", "W-01=confirm", "--decision", "W-02=reject", "--by", "qa"]
    other = runner.invoke(app, [*decide, "--digest", digest])
    # a decision stands: needs_rebase, naming it and the command that replaces it (with its id as --base)
    assert other.exit_code == 4 and "already decided: qa recorded confirmed" in other.stderr
    base = other.stderr.split("--base ")[1].split()[0]
    assert f"--base {base} --supersede" in other.stderr
    assert hf.load(copy).proposalSelection == "selected"
    forced = runner.invoke(app, [*decide, "--digest", digest, "--base", base, "--supersede"])
    assert forced.exit_code == 0, forced.output
    assert "supersedes gate 2" in forced.stderr
    h = hf.load(copy)
    assert h.userRootCauseConfirmation == "partially_confirmed" and h.proposalSelection == "not_started"
    ledger = json.loads((copy / "ledger.json").read_text())
    assert ledger["entries"]["gate2"]["state"] == "invalidated"


def test_show_ref_with_context(gate1_run: Path) -> None:
    ref = _shortlist(gate1_run)["weaknesses"][0]["support"]["event_refs"][0]
    event = find_item(gate1_run, ref).item
    raw = f"{event['source_path']}#L{event['line_start']}-L{event['line_end']}"
    plain = runner.invoke(app, ["show-ref", raw, "--run", str(gate1_run)])
    more = runner.invoke(app, ["show-ref", raw, "--run", str(gate1_run), "-C", "2", "--pretty"])
    assert plain.exit_code == 0 and more.exit_code == 0
    marked = [ln for ln in more.stdout.splitlines() if ln.startswith(">")]
    assert [ln[7:].removeprefix("  ") for ln in marked] == plain.stdout.rstrip("\n").split("\n")
    numbered = [ln for ln in more.stdout.splitlines() if ln[:1] in (" ", ">") and ln[1:7].strip().isdigit()]
    assert len(numbered) == len(marked) + 4  # two lines either side
    assert '\n  "' in more.stdout  # the cited JSON line pretty-printed


def test_report_puts_a_failed_cell_next_to_a_counter_evidence_cell(gate1_run: Path) -> None:
    from pipeline.report import render_report

    html, _ = render_report(gate1_run)
    w = _shortlist(gate1_run)["weaknesses"][0]
    card = html[html.index(f'id="weakness-{w["weakness_id"]}"') :]
    card = card[: card.index('<div class="card weakness"', 10) if '<div class="card weakness"' in card[10:] else None]
    compare = card[card.index('<div class="compare">') :]
    assert compare.count('<tr class="at">') == 2  # each side marks the event where it turns
    counter_cell = w["counter_evidence"]["items"][0]["cell"]
    assert f'data-cell="{counter_cell}"' in compare and compare.count("<tr") >= 10
