"""show-ref: exact frozen lines, hash checked; parse errors, escapes, mismatches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.bundle import freeze
from pipeline.bundle.synth import write_bundle
from pipeline.cli.app import app
from pipeline.core.errors import BadInput, BundleError
from pipeline.ir.export import export
from pipeline.ir.query import query
from pipeline.ir.refs import Ref, parse_ref, ref_of, resolve_ref, show_ref

runner = CliRunner()
SESSION = "cells/C001/sessions/01-proposal-candidate.jsonl"


@pytest.fixture
def run_dir(tmp_path: Path, runs_dir: Path) -> Path:
    bundle = tmp_path / "bundle"
    write_bundle(bundle, cells=2, events_per_cell=16, excluded=0)
    # a line with non-ASCII text, to prove bytes come back exactly
    with (bundle / SESSION).open("a", encoding="utf-8") as fh:
        fh.write(
            '{"content":"révision — 検証 ✓","role":"candidate","session":"x",'
            '"ts":"2026-08-10T00:00:00Z","type":"message"}\n'
        )
    freeze(bundle)
    export(bundle, runs_dir / "r")
    return runs_dir / "r"


def test_parse_ref() -> None:
    assert parse_ref("cells/C001/controller.jsonl#L3-L5") == Ref("cells/C001/controller.jsonl", 3, 5)
    assert parse_ref("a.jsonl#L7") == Ref("a.jsonl", 7, 7)
    assert parse_ref("raw/x.json#L3-L40/history/17") == Ref("raw/x.json", 3, 40, "/history/17")
    assert str(parse_ref("a.jsonl#L7")) == "a.jsonl#L7-L7"
    assert ref_of("a.jsonl", 1, 2, "/x") == "a.jsonl#L1-L2/x"
    for bad in ("a.jsonl", "a.jsonl#3-4", "a.jsonl#L5-L4", "a.jsonl#L0-L1", "#L1-L1"):
        with pytest.raises(BadInput):
            parse_ref(bad)
    with pytest.raises(BadInput, match="escapes"):
        parse_ref("../etc/passwd#L1-L1")
    with pytest.raises(BadInput, match="absolute"):
        parse_ref("/etc/passwd#L1-L1")


def test_every_event_ref_shows_its_frozen_bytes(run_dir: Path) -> None:
    bundle = (run_dir / json.loads((run_dir / "run.json").read_text())["bundle"]).resolve()
    rows = query(run_dir, "SELECT source_path, line_start, line_end FROM events ORDER BY cell_id, seq").rows
    assert rows
    for path, a, b in rows:
        raw = (bundle / path).read_bytes().split(b"\n")
        assert show_ref(run_dir, ref_of(path, a, b)).encode("utf-8") == b"\n".join(raw[a - 1 : b])


def test_show_ref_cli_exact_lines(run_dir: Path) -> None:
    bundle = (run_dir / json.loads((run_dir / "run.json").read_text())["bundle"]).resolve()
    lines = (bundle / SESSION).read_text(encoding="utf-8").splitlines()
    n = len(lines)
    result = runner.invoke(app, ["show-ref", f"{SESSION}#L{n - 1}-L{n}", "--run", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert result.stdout == "\n".join(lines[n - 2 :]) + "\n"
    assert "検証" in result.stdout


def test_json_pointer_element(run_dir: Path) -> None:
    view = resolve_ref(run_dir, f"{SESSION}#L2-L2/args")
    assert json.loads(view.element or "") == json.loads(view.lines)["args"]
    result = runner.invoke(app, ["show-ref", f"{SESSION}#L2/args/path", "--run", str(run_dir), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["element"] == json.loads(view.lines)["args"]["path"]
    result = runner.invoke(app, ["show-ref", f"{SESSION}#L2/no/such", "--run", str(run_dir)])
    assert result.exit_code == 2
    assert "does not resolve" in result.output


def test_hash_mismatch_is_an_error(run_dir: Path) -> None:
    bundle = (run_dir / json.loads((run_dir / "run.json").read_text())["bundle"]).resolve()
    raw = bytearray((bundle / SESSION).read_bytes())
    raw[3] = ord("Z") if raw[3] != ord("Z") else ord("W")
    (bundle / SESSION).write_bytes(bytes(raw))
    with pytest.raises(BundleError, match="changed since the bundle was frozen"):
        show_ref(run_dir, f"{SESSION}#L1-L1")
    result = runner.invoke(app, ["show-ref", f"{SESSION}#L1-L1", "--run", str(run_dir)])
    assert result.exit_code == 2
    assert len(result.output.strip().splitlines()) == 1
    assert "changed since the bundle was frozen" in result.output


def test_refrozen_bundle_is_an_error(run_dir: Path) -> None:
    bundle = (run_dir / json.loads((run_dir / "run.json").read_text())["bundle"]).resolve()
    (bundle / "cells" / "C001" / "new.txt").write_text("new")
    freeze(bundle)
    with pytest.raises(BundleError, match="re-frozen"):
        show_ref(run_dir, f"{SESSION}#L1-L1")


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("../outside.jsonl#L1-L1", "escapes"),
        ("/etc/passwd#L1-L1", "absolute"),
        ("cells/C001/none.jsonl#L1-L1", "not in the bundle's manifest.json"),
        (f"{SESSION}#L1-L9999", "past the end"),
        ("nonsense", "not a ref"),
    ],
)
def test_bad_refs_exit_2(run_dir: Path, ref: str, message: str) -> None:
    result = runner.invoke(app, ["show-ref", ref, "--run", str(run_dir)])
    assert result.exit_code == 2
    assert message in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_not_a_run_dir(tmp_path: Path) -> None:
    result = runner.invoke(app, ["show-ref", f"{SESSION}#L1-L1", "--run", str(tmp_path)])
    assert result.exit_code == 2


def test_corrupt_run_json_is_one_line(run_dir: Path) -> None:
    (run_dir / "run.json").write_text("{not json")
    result = runner.invoke(app, ["show-ref", f"{SESSION}#L1-L1", "--run", str(run_dir)])
    assert result.exit_code == 2
    assert "run.json is not valid JSON" in result.output
    assert len(result.output.strip().splitlines()) == 1
