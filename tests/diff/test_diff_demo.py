"""Integration: two replays of the demo, one with a single recorded Luna answer edited.

The recordings under fixtures/recordings/h0-demo are hand-written fixture answers (see the
README there); here one of them is copied and edited, so the second run is a replay in which
exactly one cell's Luna answer changed. The diff must show exactly that cell.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from pipeline.cli.app import app
from pipeline.diff import diff_run_dirs, render_text
from tests.conftest import DEMO_BUNDLE, DEMO_RECORDINGS

pytestmark = pytest.mark.skipif(
    not (DEMO_BUNDLE / "manifest.json").is_file() or not DEMO_RECORDINGS.is_dir(),
    reason="demo bundle or recordings not in this checkout yet",
)


def _run(bundle: Path, recordings: Path, runs_dir: Path) -> tuple[int, Path, str]:
    # The default run id: it is part of what the recorded requests saw, so each run gets its own runs dir.
    res = CliRunner().invoke(app, ["run", str(bundle), "--replay", str(recordings), "--runs-dir", str(runs_dir)])
    (run_dir,) = [p for p in runs_dir.iterdir() if p.is_dir()]
    return res.exit_code, run_dir, res.output


def _answer_holder(response: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """Where the structured answer sits in a raw chat-completions body: (dict holding it, key)."""
    message = response["choices"][0]["message"]
    calls = message.get("tool_calls") or []
    if calls:
        return calls[0]["function"], "arguments"
    return message, "content"


def edit_first_luna_pattern(recordings: Path, edit: Callable[[dict[str, Any]], None]) -> str:
    """Apply ``edit`` to the first pattern of the first recorded Luna answer that has one; return its cell."""
    for path in sorted(recordings.rglob("*.json")):
        rec = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(rec, dict) or rec.get("role") != "luna" or not rec.get("cell_id"):
            continue
        holder, key = _answer_holder(rec["response"])
        answer = json.loads(holder[key])
        if not answer.get("patterns"):
            continue
        edit(answer["patterns"][0])
        holder[key] = json.dumps(answer, ensure_ascii=False)
        path.write_text(json.dumps(rec, ensure_ascii=False, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        return str(rec["cell_id"]).split(".")[0]  # a split cell's part names its cell first
    pytest.fail("no Luna recording with a pattern in the demo recordings")


def edit_one_luna_answer(recordings: Path) -> str:
    """Change the confidence of the first pattern of the first Luna answer that has one; return its cell."""

    def other_confidence(p: dict[str, Any]) -> None:
        p["confidence"] = {"high": "low", "medium": "high", "low": "medium"}[p["confidence"]]

    return edit_first_luna_pattern(recordings, other_confidence)


@pytest.fixture(scope="module")
def demo_runs(demo_gate1: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """The session's demo run, and a replay of the same bundle with one Luna answer's confidence edited."""
    root = tmp_path_factory.mktemp("demo-diff")
    edited = root / "recordings"
    shutil.copytree(DEMO_RECORDINGS, edited)
    cell = edit_one_luna_answer(edited)
    code_b, b, out_b = _run(DEMO_BUNDLE, edited, root / "b")
    # Sol's prompt does not carry a pattern's confidence, so Sol's recorded request still matches: exit 0.
    assert code_b == 0, out_b
    return demo_gate1, b, cell


def test_demo_run_diffed_with_itself_is_empty(demo_runs: tuple[Path, Path, str]) -> None:
    a = demo_runs[0]
    d = diff_run_dirs(a, a)
    assert d.identical and d.patterns.unchanged > 0 and d.weaknesses.unchanged > 0
    assert CliRunner().invoke(app, ["diff", str(a), str(a)]).exit_code == 0


def test_edited_luna_answer_shows_exactly_that_cell(demo_runs: tuple[Path, Path, str]) -> None:
    a, b, cell = demo_runs
    d = diff_run_dirs(a, b)
    assert not d.identical
    assert [c.cell_id for c in d.cells] == [cell], render_text(d)
    (item,) = d.cells[0].items
    assert item.status == "changed" and [c.path for c in item.changes] == ["confidence"]
    # Two separate replays differ in timestamps, latencies and paths: none of that is a difference.
    assert [c.path for c in d.inputs] == ["inputs.models.store"]
    # Sol did not see the changed field: everything downstream is the same
    assert not d.groups.differs and not d.weaknesses.differs and not d.state and not d.calls
    res = CliRunner().invoke(app, ["diff", str(a), str(b), "--markdown"])
    assert res.exit_code == 1 and f"cell {cell}" in res.output


APPENDED = "and afterwards it opened both files a third time without writing anything"


def append_to_one_observed(recordings: Path) -> str:
    """Append words to the ``observed`` text of the first pattern of the first Luna answer; return its cell."""
    return edit_first_luna_pattern(recordings, lambda p: p.update(observed=f"{p['observed']} {APPENDED}"))


def test_appended_text_shows_as_words_in_the_diff(demo_runs: tuple[Path, Path, str], tmp_path: Path) -> None:
    a = demo_runs[0]
    edited = tmp_path / "recordings"
    shutil.copytree(DEMO_RECORDINGS, edited)
    cell = append_to_one_observed(edited)
    code, b, out = _run(DEMO_BUNDLE, edited, tmp_path / "b")
    assert code in (0, 3), out
    text = CliRunner().invoke(app, ["diff", str(a), str(b)])
    assert text.exit_code == 1 and f"cell {cell}" in text.stdout
    assert "observed: " in text.stdout and "{+" + APPENDED + "+}" in text.stdout  # the appended words, whole
    md = CliRunner().invoke(app, ["diff", str(a), str(b), "--markdown", "--html", str(tmp_path / "d.html")])
    assert "**" + APPENDED + "**" in md.stdout
    assert "- - " not in md.stdout and "  - + " not in md.stdout and "  - ~ " not in md.stdout  # no doubled bullets
    page = (tmp_path / "d.html").read_text()
    assert f"<ins>{APPENDED}</ins>" in " ".join(page.split()).replace("<ins> ", "<ins>")
    assert "<script" not in page and "default-src 'none'" in page


def test_report_of_the_demo(demo_runs: tuple[Path, Path, str]) -> None:
    from pipeline.report import render_report

    html, stats = render_report(demo_runs[0])
    assert stats["refs"] > 100 and stats["hash_mismatches"] == 0 and stats["unresolved"] == 0
    assert 'id="weakness-W-01"' in html
