"""Every bad bundle of issue #2: one line, exit 2, nothing written inside the bundle, no run left behind."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.bundle import freeze
from pipeline.bundle.synth import tree_snapshot, write_bundle
from pipeline.bundle.verified import VERIFIED_FILE
from pipeline.cli.app import app
from pipeline.core.errors import BadInput
from pipeline.ir.export import export

runner = CliRunner()
SESSION = "cells/C001/sessions/01-proposal-candidate.jsonl"


def _edit_request(bundle: Path, fn: Callable[[dict[str, object]], None]) -> None:
    path = bundle / "analysis-request.json"
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data))
    freeze(bundle)


def missing_manifest(b: Path) -> None:
    (b / "manifest.json").unlink()


def missing_request(b: Path) -> None:
    (b / "analysis-request.json").unlink()
    freeze(b)


def changed_hash(b: Path) -> None:
    raw = bytearray((b / SESSION).read_bytes())
    raw[5] = ord("Q") if raw[5] != ord("Q") else ord("R")
    (b / SESSION).write_bytes(bytes(raw))


def _manifest_add(b: Path, path: str) -> None:
    data = json.loads((b / "manifest.json").read_text())
    data["files"].append({"path": path, "sha256": "sha256:" + "0" * 64, "size": 3})
    (b / "manifest.json").write_text(json.dumps(data))


def escape_dotdot(b: Path) -> None:
    _manifest_add(b, "../outside.txt")


def escape_absolute(b: Path) -> None:
    _manifest_add(b, "/etc/passwd")


def escape_symlink(b: Path) -> None:
    outside = b.parent / "outside.jsonl"
    outside.write_text('{"ts": "x"}\n')
    os.symlink(outside, b / "cells" / "C001" / "sessions" / "99-review-reviewer.jsonl")


def invalid_json_line(b: Path) -> None:
    with (b / SESSION).open("a") as fh:
        fh.write('{"ts": "2026-08-09T00:00:00Z", "type": \n')
    freeze(b)


def invalid_utf8(b: Path) -> None:
    with (b / SESSION).open("ab") as fh:
        fh.write(b'{"ts": "2026-08-09T00:00:00Z", "type": "message", "content": "\xff\xfe"}\n')
    freeze(b)


def duplicate_cells(b: Path) -> None:
    _edit_request(b, lambda d: d["cells"].append(dict(d["cells"][0])))  # type: ignore[attr-defined,index]


def empty_bundle(b: Path) -> None:
    def drop(d: dict[str, object]) -> None:
        d["cells"] = [c for c in d["cells"] if c["eligibility"] == "excluded"]  # type: ignore[attr-defined]

    _edit_request(b, drop)


def cell_absent(b: Path) -> None:
    for p in sorted((b / "cells" / "C002").rglob("*"), reverse=True):
        p.unlink() if p.is_file() else p.rmdir()
    (b / "cells" / "C002").rmdir()
    freeze(b)


def excluded_without_reason(b: Path) -> None:
    _edit_request(b, lambda d: d.update(exclusions=[]))


def unknown_task(b: Path) -> None:
    _edit_request(b, lambda d: d["cells"][0].update(task_id="nope"))  # type: ignore[index]


CASES: list[tuple[Callable[[Path], None], str]] = [
    (missing_manifest, "missing manifest.json"),
    (missing_request, "missing analysis-request.json"),
    (changed_hash, f"changed: {SESSION}"),
    (escape_dotdot, "escapes the bundle"),
    (escape_absolute, "is absolute"),
    (escape_symlink, "symlink that points outside the bundle"),
    (invalid_json_line, f"invalid JSON in {SESSION} line "),
    (invalid_utf8, f"invalid UTF-8 in {SESSION}"),
    (duplicate_cells, "duplicate cell ids: C001"),
    (empty_bundle, "empty bundle"),
    (cell_absent, "cell C002 is listed in analysis-request.json but cells/C002 is absent"),
    (excluded_without_reason, "has no reason"),
    (unknown_task, "unknown task id 'nope'"),
]


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    root = tmp_path / "bundle"
    write_bundle(root, cells=3, events_per_cell=12, excluded=1)
    return root


@pytest.mark.parametrize(("mutate", "message"), CASES, ids=[c[0].__name__ for c in CASES])
def test_bad_bundle_cli(bundle: Path, runs_dir: Path, mutate: Callable[[Path], None], message: str) -> None:
    mutate(bundle)
    before = tree_snapshot(bundle)
    result = runner.invoke(app, ["export", str(bundle), "--run-id", "r", "--runs-dir", str(runs_dir)])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith("lunasol: ")
    assert message in lines[0]
    assert "Traceback" not in result.output
    assert tree_snapshot(bundle) == before  # nothing written inside the bundle
    assert list(runs_dir.iterdir()) == []  # no run directory left behind, complete-looking or not


@pytest.mark.parametrize(("mutate", "message"), CASES, ids=[c[0].__name__ for c in CASES])
def test_bad_bundle_library(bundle: Path, runs_dir: Path, mutate: Callable[[Path], None], message: str) -> None:
    mutate(bundle)
    with pytest.raises(BadInput) as info:
        export(bundle, runs_dir / "r")
    assert message in info.value.one_line()
    assert not (runs_dir / "r").exists()


def test_invalid_json_names_the_exact_line(bundle: Path, runs_dir: Path) -> None:
    lines = (bundle / SESSION).read_text().splitlines(keepends=True)
    lines.insert(2, "{not json}\n")
    (bundle / SESSION).write_text("".join(lines))
    freeze(bundle)
    with pytest.raises(BadInput, match=f"invalid JSON in {SESSION} line 3:"):
        export(bundle, runs_dir / "r")


def test_failed_rerun_keeps_the_previous_ir(bundle: Path, runs_dir: Path) -> None:
    export(bundle, runs_dir / "r")
    ir = (runs_dir / "r" / "ir.duckdb").read_bytes()
    invalid_json_line(bundle)
    with pytest.raises(BadInput):
        export(bundle, runs_dir / "r")
    assert (runs_dir / "r" / "ir.duckdb").read_bytes() == ir
    names = sorted(p.name for p in (runs_dir / "r").iterdir() if p.name != VERIFIED_FILE)  # the stat cache may be
    assert names == ["ir.duckdb", "run.json"]  # no temp files


def test_run_dir_inside_bundle_refused(bundle: Path) -> None:
    before = tree_snapshot(bundle)
    result = runner.invoke(app, ["export", str(bundle), "--runs-dir", str(bundle / "runs")])
    assert result.exit_code == 2
    assert "inside the bundle" in result.output
    assert tree_snapshot(bundle) == before


def test_unknown_format_is_bad_input(bundle: Path, runs_dir: Path) -> None:
    _edit_request(bundle, lambda d: d.update(format="no-such-format"))
    result = runner.invoke(app, ["export", str(bundle), "--runs-dir", str(runs_dir)])
    assert result.exit_code == 2
    assert "no-such-format" in result.output


def test_failure_after_streamed_batches_leaves_nothing(
    bundle: Path, runs_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pipeline.ir.rows as ev

    monkeypatch.setattr(ev, "BATCH_ROWS", 5)  # several batches reach DuckDB before the bad cell
    last = "cells/C003/sessions/04-review-reviewer.jsonl"
    with (bundle / last).open("a") as fh:
        fh.write("[1, 2\n")
    freeze(bundle)
    with pytest.raises(BadInput, match=f"invalid JSON in {last} line"):
        export(bundle, runs_dir / "r")
    assert not (runs_dir / "r").exists()


@pytest.mark.parametrize(
    "line",
    [
        '{"ts": "2026-08-09T00:00:00Z", "type": "message", "content": "\\ud800"}',  # lone surrogate
        '"just a string"',
    ],
)
def test_odd_lines_are_one_line_errors(bundle: Path, runs_dir: Path, line: str) -> None:
    with (bundle / SESSION).open("a") as fh:
        fh.write(line + "\n")
    freeze(bundle)
    result = runner.invoke(app, ["export", str(bundle), "--runs-dir", str(runs_dir)])
    assert result.exit_code == 2, result.output
    assert SESSION in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_odd_but_valid_values_export(bundle: Path, runs_dir: Path) -> None:
    odd = [
        '{"ts": "2026-08-09T00:00:00Z", "type": "tool_call", "call_id": "n", "tool": "t", "args": {"x": NaN}}',
        '{"ts": 17, "type": "tool_call", "call_id": 5, "tool": ["x"], "args": {"path": 3, "n": 1e-7}, "session": 9}',
        '{"ts": "2026-08-09T00:00:01Z", "type": "tool_result", "call_id": 5, "output": {"a": 1}, "exit_code": "x"}',
        '{"ts": "2026-08-09T00:00:02Z", "type": "surprise", "step": true}',
    ]
    with (bundle / SESSION).open("a") as fh:
        fh.write("\n".join(odd) + "\n")
    with (bundle / "cells" / "C001" / "controller.jsonl").open("a") as fh:
        fh.write('{"ts": "2026-08-09T00:00:03Z", "event": "state", "state_digest": "d", "confirmed": 3}\n')
    freeze(bundle)
    report = export(bundle, runs_dir / "r")
    assert report.events > 0
