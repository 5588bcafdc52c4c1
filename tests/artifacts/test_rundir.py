"""``RunDir``: one owner of a run directory's files; typed, migrated reads, one line for a broken file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.artifacts.run_info import RunInfo
from pipeline.artifacts.rundir import FILES, RUN, SHORTLIST, ArtifactFile, RunDir, read_jsonl
from pipeline.artifacts.versions import VERSIONS
from pipeline.core.canonical import canonical_json
from pipeline.core.errors import BadInput
from pipeline.sol.shortlist import Shortlist


def test_every_file_is_a_versioned_artifact() -> None:
    assert set(FILES) <= set(VERSIONS)
    assert all(a.name == name for name, a in FILES.items())


def test_demo_artifacts_load_typed(demo_gate1: Path) -> None:
    rd = RunDir(demo_gate1)
    info = rd.need(RUN, RunInfo)
    assert info.export is not None and info.export.cells_in == 24
    sl = rd.load(SHORTLIST, Shortlist)
    assert sl is not None and [w.weakness_id for w in sl.weaknesses] == ["W-01", "W-02"]
    assert rd.load(ArtifactFile("followup", "followup.json"), Shortlist) is None  # absent is None
    snap = rd.read()
    assert snap.weaknesses is not None and len(snap.weaknesses) == 2
    assert snap.patterns is not None and len(snap.patterns) == rd.count_rows(FILES["patterns"])


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"", "is empty"),
        (b'{"schema_version": 3, "weak', "not valid JSON"),
        (b"[1, 2]", "is not a JSON object"),
        (b'{"schema_version": 99}', "newer than this lunasol reads"),
        (b'{"schema_version": 3, "weaknesses": 7}', "not a valid weakness-shortlist"),
    ],
)
def test_a_broken_shortlist_is_one_line_naming_it(tmp_path: Path, content: bytes, says: str) -> None:
    (tmp_path / "run.json").write_text(json.dumps({"schema_version": 1}), encoding="utf-8")
    (tmp_path / "weakness-shortlist.json").write_bytes(content)
    with pytest.raises(BadInput) as exc:
        RunDir(tmp_path).load(SHORTLIST, Shortlist)
    line = exc.value.one_line()
    assert "\n" not in line and str(tmp_path / "weakness-shortlist.json") in line and says in line


def test_a_snapshot_refuses_the_wrong_shape(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text(json.dumps({"schema_version": 1}), encoding="utf-8")
    (tmp_path / "weakness-shortlist.json").write_text('{"schema_version": 3, "weaknesses": "W-01"}', encoding="utf-8")
    with pytest.raises(BadInput, match="'weaknesses' must be a list of objects"):
        RunDir(tmp_path).read()


def test_a_non_run_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="not a lunasol run directory"):
        RunDir(tmp_path).require()
    with pytest.raises(BadInput, match="run directory not found"):
        RunDir(tmp_path / "nope").read()


def _run_file_names() -> set[str]:
    from pipeline.artifacts import rundir

    extra = (rundir.IR_FILE, rundir.REPORT_FILE, rundir.VERIFIED_FILE, rundir.TIMELINES_FILE, rundir.BATCHES_FILE)
    locks = (rundir.BATCH_QUEUE_FILE, rundir.RUN_LOCK, rundir.HANDOFF_LOCK, rundir.LEDGER_LOCK)
    return {a.filename for a in FILES.values()} | set(extra) | set(locks)


def test_no_module_but_rundir_spells_a_run_file_name() -> None:
    """A path of a run's file is built through RunDir (prose in help and error lines may name a file)."""
    import ast

    root = Path(__file__).resolve().parents[2] / "pipeline"
    names = _run_file_names()
    allowed = {("core/context.py", "ir.duckdb")}  # the core sits below RunDir; checked below
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel == "artifacts/rundir.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                spelled = node.value.split("#", 1)[0]
                if spelled in names and (rel, spelled) not in allowed:
                    found.append(f"{rel}:{node.lineno}: {node.value!r}")
    assert found == []


def test_the_run_context_finds_the_ir_where_rundir_does(tmp_path: Path) -> None:
    from pipeline.core.context import RunContext, RunOptions

    assert RunContext(RunOptions(bundle=tmp_path), tmp_path).ir_path == RunDir(tmp_path).ir


def test_diff_names_a_handoff_of_the_wrong_shape(demo_gate1: Path, demo_copy: Path) -> None:
    from pipeline.diff import diff_run_dirs

    (demo_copy / "handoff.json").write_text('{"schema_version": 1, "phase": "nowhere"}', encoding="utf-8")
    with pytest.raises(BadInput) as exc:
        diff_run_dirs(demo_gate1, demo_copy)
    line = exc.value.one_line()
    assert str(demo_copy / "handoff.json") in line and "not a valid handoff" in line and "\n" not in line


def test_a_jsonl_row_whose_text_holds_a_line_separator_is_one_row(tmp_path: Path) -> None:
    # patterns.jsonl holds Luna's words, written as UTF-8 (ensure_ascii=False): U+2028, U+2029 and U+0085
    # stay raw inside the JSON string, and only "\n" ends a row
    rows = [{"cell_id": "C1", "why": "a\u2028b\u2029c\x85d"}, {"cell_id": "C2", "why": "e"}]
    path = tmp_path / "patterns.jsonl"
    path.write_text("".join(canonical_json(r) + "\n" for r in rows) + "\n", encoding="utf-8")
    assert read_jsonl(path) == rows
    path.write_text(canonical_json(rows[0]) + "\r\n", encoding="utf-8")  # a CRLF file: the same row
    assert read_jsonl(path) == rows[:1]
