"""IR export: tables, ids, digests, ordering, segments, trimming, outcomes, reruns, Parquet, run.json."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import duckdb
import pytest
from typer.testing import CliRunner

from pipeline.adapters.native import canonical_args
from pipeline.bundle import freeze
from pipeline.bundle.synth import tree_snapshot, write_bundle
from pipeline.cli.app import app
from pipeline.core.canonical import canonical_json, digest, sha256_bytes, sha256_text
from pipeline.core.context import RunContext, RunOptions
from pipeline.ir.export import export, stage
from pipeline.ir.schema import IR_SCHEMA_VERSION, TEXT_LIMIT, event_id

runner = CliRunner()


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    root = tmp_path / "bundle"
    write_bundle(root, cells=3, events_per_cell=30, excluded=1, seed=3)
    return root


def _rows(db: Path, sql: str) -> list[dict[str, Any]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        cur = con.execute(sql)
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]
    finally:
        con.close()


def _raw_lines(bundle: Path) -> list[tuple[str, int, dict[str, Any]]]:
    out = []
    for p in sorted(bundle.glob("cells/*/**/*.jsonl")):
        rel = p.relative_to(bundle).as_posix()
        for n, line in enumerate(p.read_text().split("\n"), 1):
            if line.strip():
                out.append((rel, n, json.loads(line)))
    return out


def test_export_tables_and_coverage(bundle: Path, runs_dir: Path) -> None:
    before = tree_snapshot(bundle)
    report = export(bundle, runs_dir / "r")
    assert tree_snapshot(bundle) == before
    db = runs_dir / "r" / "ir.duckdb"
    raw = _raw_lines(bundle)
    assert report.events == len(raw)
    assert report.summary() == f"3 cells in, 1 excluded, {len(raw):,} events"
    cells = _rows(db, "SELECT * FROM cells ORDER BY cell_id")
    assert [c["eligibility"] for c in cells] == ["valid_behavior"] * 3 + ["excluded"]
    assert cells[3]["exclusion_reason"]
    coverage = {r["cell_id"]: r for r in _rows(db, "SELECT * FROM coverage")}
    assert coverage["C004"]["status"] == "excluded" and coverage["C004"]["events"] == 0
    assert coverage["C004"]["reason"] == cells[3]["exclusion_reason"]
    per_cell = {c: sum(1 for rel, _, _ in raw if rel.startswith(f"cells/{c}/")) for c in ("C001", "C002", "C003")}
    assert {c: coverage[c]["events"] for c in per_cell} == per_cell
    assert _rows(db, "SELECT count(*) AS n FROM events WHERE cell_id = 'C004'")[0]["n"] == 0
    meta = {r["key"]: r["value"] for r in _rows(db, "SELECT * FROM meta")}
    assert meta["ir_schema_version"] == str(IR_SCHEMA_VERSION)
    assert meta["bundle_digest"] == sha256_bytes((bundle / "manifest.json").read_bytes())


def test_events_point_at_their_raw_lines(bundle: Path, runs_dir: Path) -> None:
    export(bundle, runs_dir / "r")
    events = _rows(runs_dir / "r" / "ir.duckdb", "SELECT * FROM events ORDER BY cell_id, seq")
    manifest = {f["path"]: f["sha256"] for f in json.loads((bundle / "manifest.json").read_text())["files"]}
    raw = {(rel, n): rec for rel, n, rec in _raw_lines(bundle)}
    assert len(events) == len(raw)
    for e in events:
        rec = raw[(e["source_path"], e["line_start"])]
        assert e["line_end"] == e["line_start"]
        assert e["source_sha256"] == manifest[e["source_path"]]
        assert e["event_id"] == event_id(e["cell_id"], e["seq"])
        assert e["ts"] == rec["ts"]
        if rec.get("type") == "tool_call":
            assert e["kind"] == "tool_call"
            assert e["args_digest"] == digest(rec["args"])
            assert e["tool_name"] == rec["tool"] and e["call_id"] == rec["call_id"]
            assert e["target"] == rec["args"]["path"]
        elif rec.get("type") == "tool_result":
            assert e["result_digest"] == sha256_text(rec["output"])
            assert e["text"] == rec["output"]
        elif rec.get("event") == "state":
            assert e["kind"] == "state_change" and e["state_digest"] == rec["state_digest"]


def test_order_segments_and_state_carry(bundle: Path, runs_dir: Path) -> None:
    export(bundle, runs_dir / "r")
    db = runs_dir / "r" / "ir.duckdb"
    events = _rows(db, "SELECT * FROM events ORDER BY cell_id, seq")
    segments = {s["segment_id"]: s for s in _rows(db, "SELECT * FROM segments")}
    by_cell: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        by_cell.setdefault(e["cell_id"], []).append(e)
    for evs in by_cell.values():
        assert [e["seq"] for e in evs] == list(range(len(evs)))
        keys = [(e["ts"], e["source_path"], e["line_start"]) for e in evs]
        assert keys == sorted(keys)
        state = None
        for i, e in enumerate(evs):
            if e["kind"] == "state_change":
                state = e["state_digest"]
            assert e["state_digest"] == state
            seg = segments[e["segment_id"]]
            assert (seg["stage"], seg["session_id"], seg["actor"]) == (e["stage"], e["session_id"], e["actor"])
            assert seg["first_event_seq"] <= e["seq"] <= seg["last_event_seq"]
            if i and evs[i - 1]["segment_id"] != e["segment_id"]:  # maximal runs: neighbours differ
                prev = segments[evs[i - 1]["segment_id"]]
                assert (prev["stage"], prev["session_id"], prev["actor"]) != (
                    seg["stage"],
                    seg["session_id"],
                    seg["actor"],
                )
    total = sum(s["event_count"] for s in segments.values())
    assert total == len(events)


def test_rerun_is_identical(bundle: Path, runs_dir: Path) -> None:
    export(bundle, runs_dir / "a")
    export(bundle, runs_dir / "b")
    export(bundle, runs_dir / "a")  # over an existing run
    for table in ("meta", "cells", "segments", "events", "outcomes", "coverage"):
        a = _rows(runs_dir / "a" / "ir.duckdb", f"SELECT * FROM {table} ORDER BY ALL")
        b = _rows(runs_dir / "b" / "ir.duckdb", f"SELECT * FROM {table} ORDER BY ALL")
        assert a == b, table
        assert a or table == "outcomes"
    assert (runs_dir / "a" / "run.json").read_text().replace('"a"', '"b"') == (runs_dir / "b" / "run.json").read_text()


def test_long_text_trimmed_with_marker(tmp_path: Path, runs_dir: Path) -> None:
    root = tmp_path / "b"
    write_bundle(root, cells=1, events_per_cell=8, excluded=0, output_chars=TEXT_LIMIT * 3)
    export(root, runs_dir / "r")
    rows = _rows(
        runs_dir / "r" / "ir.duckdb", "SELECT text, text_truncated, text_chars FROM events WHERE kind = 'tool_result'"
    )
    assert rows
    for r in rows:
        assert r["text_truncated"] is True
        assert r["text_chars"] == TEXT_LIMIT * 3
        assert "lunasol trimmed" in r["text"]
        assert len(r["text"]) < r["text_chars"]


def test_outcomes_sidecar(bundle: Path, runs_dir: Path) -> None:
    export(bundle, runs_dir / "r")
    rows = {r["cell_id"]: r for r in _rows(runs_dir / "r" / "ir.duckdb", "SELECT * FROM outcomes")}
    sidecar = [json.loads(x) for x in (bundle / "sidecar" / "outcomes.jsonl").read_text().splitlines()]
    assert set(rows) == {s["cell_id"] for s in sidecar}
    for s in sidecar:
        r = rows[s["cell_id"]]
        assert r["label"] == s["label"] and r["quality"] == s["quality"] and r["cost"] == s["cost"]
        assert json.loads(r["extra"]) == {"notes": "synthetic"}


def test_outcome_for_unknown_cell_is_bad_input(bundle: Path, runs_dir: Path) -> None:
    with (bundle / "sidecar" / "outcomes.jsonl").open("a") as fh:
        fh.write('{"cell_id": "C999", "label": "completed"}\n')
    freeze(bundle)
    result = runner.invoke(app, ["export", str(bundle), "--runs-dir", str(runs_dir)])
    assert result.exit_code == 2
    assert "C999" in result.output


def test_run_json_and_parquet(bundle: Path, runs_dir: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["export", str(bundle), "--runs-dir", str(runs_dir), "--parquet", str(tmp_path / "pq")])
    assert result.exit_code == 0, result.output
    assert "3 cells in, 1 excluded" in result.output
    assert "excluded C004: harness crashed" in result.output
    run_dir = runs_dir / "synthetic-run"  # default run id: the request's analysis_run_id
    run = json.loads((run_dir / "run.json").read_text())
    assert run["run_id"] == "synthetic-run"
    assert run["analysis_run_id"] == "synthetic-run"
    assert run["parent_harness"] == "H0"
    assert (run_dir / run["bundle"]).resolve() == bundle.resolve()
    assert run["bundle_digest"] == sha256_bytes((bundle / "manifest.json").read_bytes())
    assert run["export"]["events"] > 0
    con = duckdb.connect()
    for table in ("meta", "cells", "segments", "events", "outcomes", "coverage"):
        pq = tmp_path / "pq" / f"{table}.parquet"
        n_pq = con.execute(f"SELECT count(*) FROM read_parquet('{pq}')").fetchone()[0]  # type: ignore[index]
        n_db = _rows(run_dir / "ir.duckdb", f"SELECT count(*) AS n FROM {table}")[0]["n"]
        assert n_pq == n_db
    # run.json keeps what other stages wrote; export only updates its own part
    run["later_stage"] = {"x": 1}
    (run_dir / "run.json").write_text(json.dumps(run))
    runner.invoke(app, ["export", str(bundle), "--runs-dir", str(runs_dir)])
    assert json.loads((run_dir / "run.json").read_text())["later_stage"] == {"x": 1}


def test_runner_stage(bundle: Path, runs_dir: Path) -> None:
    ctx = RunContext(options=RunOptions(bundle=bundle, runs_dir=runs_dir), run_dir=runs_dir / "s")
    summary = stage(ctx)
    assert summary.startswith("3 cells in, 1 excluded, ") and summary.endswith(" events")
    assert ctx.ir_path.is_file()


def test_canonical_args_matches_canonical_json() -> None:
    rng = random.Random(5)
    values: list[Any] = [
        {"a": 1e16, "b": 1e-05, "c": 0.1, "d": -0.0, "e": 123456789.125, "f": 1e-7, "g": 2.5e300},
        {"é": 'ü\u2028\x1f\x7f"\\/', "z": [None, True, False], "a": {"y": 1, "b": [1.0, 100.0]}},
        {"text": "1e5 and 0.00001 as text", "n": 10**18},
        {"nan": float("nan"), "inf": float("inf"), "none": None},
        {},
    ]
    for _ in range(300):
        values.append(
            {
                f"k{rng.randrange(50)}": rng.choice([rng.random() * 10 ** rng.randrange(-8, 20), "s", 7])
                for _ in range(4)
            }
        )
    for v in values:
        assert canonical_args(v) == canonical_json(v)
