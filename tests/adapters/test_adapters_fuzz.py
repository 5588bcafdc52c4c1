"""Odd lines and truncated files: every adapter imports what it can, reports the rest, never crashes.

Each case copies one real file of the format (shared data, or a committed fixture), damages it
(non-object JSON Lines lines, a cut-off last line, a file truncated at several points, a scalar
document), then imports it with the format's adapter and with ``auto``. The outcome must be one
of two: BadInput (nothing written), or a bundle whose export succeeds with every ref resolving.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.adapters import FORMATS, import_bundle
from pipeline.cli.app import app
from pipeline.core.errors import BadInput
from pipeline.ir.export import export
from tests.adapters.adapter_helpers import SHARED_DATA, SUBSETS, check_refs, events_of, need_shared_data

FIXTURES = Path(__file__).parent.parent / "fixtures" / "foreign"
ODD_LINES = ['"oops"', "42", "[1]", "null", '{"type": "assistant", "message": {"content": [', "not json at all"]


def _seed(fmt: str) -> tuple[Path, str]:
    """(source file, its relative path) of one small file of the format."""
    root = FIXTURES / fmt
    # A sample file, not the folder's README or recording recipe
    local = sorted(p for p in root.rglob("*") if p.is_file() and p.name != "README.md" and p.suffix != ".py")
    if local:
        return local[0], local[0].relative_to(root).as_posix()
    need_shared_data()
    folder, files = SUBSETS[fmt]
    return SHARED_DATA / folder / files[0], files[0]


def _jsonl_seed(fmt: str) -> tuple[Path, str]:
    folder, files = SUBSETS[fmt]
    rel = next(r for r in files if r.endswith(".jsonl"))
    return SHARED_DATA / folder / rel, rel


def _with_odd_lines(raw: bytes) -> bytes:
    lines = raw.decode("utf-8").rstrip("\n").split("\n")
    out: list[str] = []
    for i, line in enumerate(lines):
        out.append(line)
        if i < len(ODD_LINES):
            out.append(ODD_LINES[i])
    return ("\n".join(out) + "\n").encode()


def _truncations(raw: bytes) -> list[bytes]:
    return [raw[: int(len(raw) * f)] for f in (0.1, 0.5, 0.97)] + [b"", b"[1]", b'"oops"', b"42\n"]


def _outcome(fmt: str, src: Path, tmp: Path) -> str:
    """'refused' or 'imported' (after checking export and refs); anything else fails the test."""
    dest = tmp / "bundle"
    try:
        import_bundle(fmt, src, dest)
    except BadInput:
        assert not dest.exists(), "a refused import left a bundle behind"
        return "refused"
    rep = export(dest, tmp / "runs" / "r")
    events = events_of(rep.run_dir)
    ok, bad = check_refs(dest, events)
    assert bad == [] and ok == len(events)
    shutil.rmtree(tmp / "runs")
    shutil.rmtree(dest)
    return "imported"


def _place(tmp: Path, rel: str, data: bytes) -> Path:
    src = tmp / "src"
    shutil.rmtree(src, ignore_errors=True)
    (src / rel).parent.mkdir(parents=True, exist_ok=True)
    (src / rel).write_bytes(data)
    return src


@pytest.mark.parametrize("fmt", FORMATS)
def test_truncated_and_scalar_files_never_crash(fmt: str, tmp_path: Path) -> None:
    path, rel = _seed(fmt)
    raw = path.read_bytes()
    seen = set()
    for k, damaged in enumerate(_truncations(raw)):
        src = _place(tmp_path, rel, damaged)
        for how in (fmt, "auto"):
            seen.add(_outcome(how, src, tmp_path / f"t{k}-{how}"))
    assert "refused" in seen  # an empty or scalar file holds no run


@pytest.mark.parametrize("fmt", ["claude-code", "openhands"])
def test_odd_jsonl_lines_are_skipped_and_counted(fmt: str, tmp_path: Path) -> None:
    need_shared_data()
    path, rel = _jsonl_seed(fmt)
    clean = import_bundle(fmt, _place(tmp_path / "a", rel, path.read_bytes()), tmp_path / "clean")
    damaged = _with_odd_lines(path.read_bytes())
    src = _place(tmp_path / "b", rel, damaged)
    result = import_bundle(fmt, src, tmp_path / "bundle")
    assert result.cells == clean.cells
    assert len(result.warnings) == 1
    where, text = result.warnings[0]
    n_odd = min(len(ODD_LINES), len(path.read_bytes().decode().rstrip("\n").split("\n")))
    assert where == f"raw/{rel}" and text.startswith(f"{n_odd} line(s) are not")
    req = json.loads((tmp_path / "bundle" / "analysis-request.json").read_text())
    assert req["source"]["warnings"] == [{"path": where, "warning": text}]
    rep = export(tmp_path / "bundle", tmp_path / "runs" / "r")
    ref = export(tmp_path / "clean", tmp_path / "runs" / "c")
    assert rep.events == ref.events  # odd lines add nothing and hide nothing
    ok, bad = check_refs(tmp_path / "bundle", events_of(rep.run_dir))
    assert bad == [] and ok == rep.events


def test_cli_import_prints_the_warning_and_export_exits_0(tmp_path: Path) -> None:
    need_shared_data()
    path, rel = _jsonl_seed("claude-code")
    src = _place(tmp_path, rel, _with_odd_lines(path.read_bytes()))
    runner = CliRunner()
    res = runner.invoke(app, ["bundle", "import", "claude-code", str(src), str(tmp_path / "b")])
    assert res.exit_code == 0, res.output
    assert "warning: raw/" in res.output and "are not Claude Code records" in res.output
    res = runner.invoke(app, ["export", str(tmp_path / "b"), "--runs-dir", str(tmp_path / "runs")])
    assert res.exit_code == 0, res.output


def test_a_file_of_only_odd_lines_is_one_clear_refusal(tmp_path: Path) -> None:
    src = _place(tmp_path, "session.jsonl", ("\n".join(ODD_LINES) + "\n").encode())
    res = CliRunner().invoke(app, ["bundle", "import", "claude-code", str(src), str(tmp_path / "b")])
    assert res.exit_code == 2
    assert len(res.output.strip().splitlines()) == 1 and "no claude-code runs" in res.output
    assert not (tmp_path / "b").exists()


def test_truncated_eval_zip_never_crashes(tmp_path: Path) -> None:
    need_shared_data()
    folder, files = SUBSETS["inspect"]
    rel = next(r for r in files if r.endswith(".eval"))
    raw = (SHARED_DATA / folder / rel).read_bytes()
    for k, damaged in enumerate(_truncations(raw)):
        src = _place(tmp_path, rel, damaged)
        assert _outcome("inspect", src, tmp_path / f"t{k}") == "refused"
