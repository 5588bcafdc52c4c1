"""The committed demo bundle is exactly what the seeded generator writes, and its planted story holds.

The bundle and fixtures/demo-story.json are synthetic fixtures (fixtures/make_demo_bundle.py). These tests
check the committed bytes against a fresh generation, the manifest against the files, and each planted
behaviour against the raw lines themselves, so a story entry that stops being true fails here.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from pipeline.bundle.request import AnalysisRequest

ROOT = Path(__file__).resolve().parents[2]
BUNDLE = ROOT / "fixtures" / "bundles" / "h0-demo"
STORY = ROOT / "fixtures" / "demo-story.json"
FAMILIES = [
    "click-envvar-prefix",
    "bat-sanitize",
    "ripgrep-glob-case",
    "requests-retry-backoff",
    "prometheus-utf8-negotiation",
    "pytest-addini-type-expressions",
    "httpx-timeout-config",
    "serde-rename-all",
]
REPORTS = {"validation.md", "review.md", "finalization.md"}


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_demo_bundle", ROOT / "fixtures" / "make_demo_bundle.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["make_demo_bundle"] = mod
    spec.loader.exec_module(mod)
    return mod


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One fresh generation shared by the module (bundle under bundle/, story next to it)."""
    out = tmp_path_factory.mktemp("demo")
    _generator().build(out / "bundle", out / "demo-story.json")
    return out


@pytest.fixture(scope="module")
def story() -> dict[str, Any]:
    return json.loads(STORY.read_text(encoding="utf-8"))


def _rows(cell: str) -> dict[str, list[dict[str, Any]]]:
    """Every log file of a cell (bundle-relative path -> parsed lines)."""
    d = BUNDLE / "cells" / cell
    files = [d / "controller.jsonl", *sorted((d / "sessions").glob("*.jsonl"))]
    return {
        f.relative_to(BUNDLE).as_posix(): [json.loads(x) for x in f.read_text(encoding="utf-8").splitlines()]
        for f in files
        if f.is_file()
    }


def _ordered(cell: str) -> list[tuple[str, int, dict[str, Any]]]:
    """All log lines of a cell in IR order: (ts, bundle-relative path, 1-based line)."""
    keyed = [(r["ts"], p, n, r) for p, rows in _rows(cell).items() for n, r in enumerate(rows, 1)]
    keyed.sort(key=lambda k: (k[0], k[1], k[2]))
    return [(p, n, r) for _, p, n, r in keyed]


def _line(ref: dict[str, Any]) -> dict[str, Any]:
    text = (BUNDLE / ref["path"]).read_text(encoding="utf-8").splitlines()
    return dict(json.loads(text[ref["line"] - 1]))


# ---- bytes ---------------------------------------------------------------------------------------------
def test_committed_bundle_is_what_the_generator_writes(fresh: Path) -> None:
    want, have = _tree(fresh / "bundle"), _tree(BUNDLE)
    assert sorted(want) == sorted(have), "file sets differ: run python fixtures/make_demo_bundle.py"
    differing = [p for p in want if want[p] != have[p]]
    assert not differing, f"regenerate the demo bundle; differing files: {differing[:5]}"
    assert (fresh / "demo-story.json").read_bytes() == STORY.read_bytes()


def test_check_reports_a_drifted_copy(fresh: Path, tmp_path: Path) -> None:
    gen = _generator()
    copy = tmp_path / "copy"
    shutil.copytree(BUNDLE, copy)
    (copy / "cells" / "C001" / "cell.json").write_text("{}\n", encoding="utf-8")
    (copy / "stray.txt").write_text("x", encoding="utf-8")
    (copy / "cells" / "C002" / "controller.jsonl").unlink()
    diffs = gen.compare(fresh / "bundle", copy, fresh / "demo-story.json", STORY)
    assert diffs == ["missing: cells/C002/controller.jsonl", "extra: stray.txt", "differs: cells/C001/cell.json"]
    assert gen.compare(fresh / "bundle", BUNDLE, fresh / "demo-story.json", STORY) == []


def test_manifest_matches_the_files() -> None:
    manifest = json.loads((BUNDLE / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["schema_version"] == 1
    paths = [f["path"] for f in manifest["files"]]
    assert paths == sorted(paths)
    on_disk = sorted(p for p in _tree(BUNDLE) if p != "manifest.json")
    assert paths == on_disk
    for f in manifest["files"]:
        data = (BUNDLE / f["path"]).read_bytes()
        assert f["size"] == len(data)
        assert f["sha256"] == "sha256:" + hashlib.sha256(data).hexdigest(), f["path"]


# ---- request, outcomes, denominator ---------------------------------------------------------------------
def test_request_has_24_eligible_cells_and_one_exclusion() -> None:
    req = AnalysisRequest.model_validate_json((BUNDLE / "analysis-request.json").read_bytes())
    assert (req.parent_harness, req.generation, req.analysis_run_id) == ("H0", 0, "h0-demo-20260809-a")
    eligible = [c for c in req.cells if c.eligibility == "valid_behavior"]
    assert [c.cell_id for c in eligible] == [f"C{i:03d}" for i in range(1, 25)]
    assert [c.run_id for c in eligible] == [f"h0-{t}-r{r}" for t in FAMILIES for r in (1, 2, 3)]
    assert [(e.cell_id, bool(e.reason)) for e in req.exclusions] == [("C025", True)]
    assert {c.cell_id for c in req.cells if c.eligibility == "excluded"} == {"C025"}
    assert [t.task_id for t in req.tasks] == FAMILIES
    for c in req.cells:
        cell = json.loads((BUNDLE / c.path / "cell.json").read_text(encoding="utf-8"))
        assert (cell["cell_id"], cell["task_id"], cell["run_id"]) == (c.cell_id, c.task_id, c.run_id)


def test_outcomes_only_in_the_sidecar() -> None:
    rows = [json.loads(x) for x in (BUNDLE / "sidecar" / "outcomes.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["cell_id"] for r in rows] == [f"C{i:03d}" for i in range(1, 25)]
    assert {r["cell_id"] for r in rows if r["label"] == "workflow_failed"} == {"C004", "C015", "C018"}
    assert {r["label"] for r in rows} == {"completed", "workflow_failed"}
    for r in rows:
        assert set(r) == {"cell_id", "label", "quality", "completion", "cost", "stability"}
    for path in sorted((BUNDLE / "cells").rglob("*")):
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        for word in ("workflow_failed", "completed"):
            assert word not in text, f"{path.relative_to(BUNDLE)} states an outcome label ({word})"
        if path.suffix == ".jsonl":
            for line in text.splitlines():
                assert not {"label", "outcome", "quality"} & set(json.loads(line)), path


def test_event_counts_in_range(story: dict[str, Any]) -> None:
    for i in range(1, 25):
        cell = f"C{i:03d}"
        n = len(_ordered(cell))
        assert 200 <= n <= 450, (cell, n)
        assert story["cells"][cell]["events"] == n
    assert story["cells"]["C025"]["events"] == 0


# ---- the story is true of the raw lines -------------------------------------------------------------------
def test_story_refs_resolve_to_the_event_id_rule(story: dict[str, Any]) -> None:
    for cell, entry in story["cells"].items():
        if entry["eligibility"] == "excluded":
            continue
        seq = {(p, n): i for i, (p, n, _) in enumerate(_ordered(cell))}
        for b in entry["behaviours"]:
            assert b["key_lines"], (cell, b["kind"])
            for k in b["key_lines"]:
                assert k["event_id"] == f"{cell}-e{seq[(k['path'], k['line'])]:04d}", (cell, k)
                if "event_id_end" in k:
                    assert k["event_id_end"] == f"{cell}-e{seq[(k['path'], k['line_end'])]:04d}"


def _kinds(story: dict[str, Any], kind: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for cell, entry in story["cells"].items():
        for b in entry["behaviours"]:
            if b["kind"] == kind:
                out.setdefault(cell, []).append(b)
    return out


def _task(story: dict[str, Any], cell: str) -> str:
    return str(story["cells"][cell]["task_id"])


def _source_digests_and_states(cell: str, after: tuple[str, int]) -> tuple[set[str], set[str]]:
    """Digests of source artifacts written and state digests seen after a given controller line."""
    ctl = f"cells/{cell}/controller.jsonl"
    rows = _rows(cell)[ctl]
    start = after[1] if after[0] == ctl else 0
    arts = {f"{r['artifact']}={r['digest']}" for r in rows[start:] if r["event"] == "artifact_written"}
    arts = {a for a in arts if a.split("=")[0] not in REPORTS}
    states = {r["state_digest"] for r in rows[start:] if r["event"] == "state"}
    return arts, states


def test_checker_dead_ends(story: dict[str, Any]) -> None:
    dead = _kinds(story, "checker_dead_end")
    assert sorted(dead) == ["C004", "C015", "C018"]
    assert len({_task(story, c) for c in dead}) == 3
    for cell, (b,) in dead.items():
        assert story["cells"][cell]["label"] == "workflow_failed"
        keys = {k["what"]: k for k in b["key_lines"]}
        sent = keys[next(w for w in keys if w.startswith("sent back"))]
        ctl = _rows(cell)[f"cells/{cell}/controller.jsonl"]
        state_before = [r["state_digest"] for r in ctl[: sent["line"]] if r["event"] == "state"][-1]
        # between the blocker and the end: no source artifact rewritten, and while the checker
        # stage is re-dispatched the state digest never moves
        later_arts, _ = _source_digests_and_states(cell, (sent["path"], sent["line"]))
        assert later_arts == set(), (cell, later_arts)
        assert _line(keys["state digest unchanged"])["state_digest"] == state_before
        denied = [k for w, k in keys.items() if "permission" in w]
        assert denied and all(_line(k)["tool"] == "request_permission" for k in denied)
        finished = _line(keys["workflow stops"])
        assert finished["event"] == "workflow_finished" and finished["status"] == "stopped"


def _call_and_result(ref: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    lines = (BUNDLE / ref["path"]).read_text(encoding="utf-8").splitlines()
    call, result = json.loads(lines[ref["line"] - 1]), json.loads(lines[ref["line"]])
    assert call["type"] == "tool_call" and result["call_id"] == call["call_id"]
    return call, result


def _repeats_unchanged(cell: str, k: dict[str, Any]) -> None:
    """The call at k repeats an earlier call with the same args, nothing was edited in between, same output."""
    call, result = _call_and_result(k)
    ordered = _ordered(cell)
    pos = next(i for i, (p, n, _) in enumerate(ordered) if (p, n) == (k["path"], k["line"]))
    prev = max(
        i for i, (_, _, r) in enumerate(ordered[:pos]) if r.get("type") == "tool_call" and r["args"] == call["args"]
    )
    between = [r for _, _, r in ordered[prev + 1 : pos] if r.get("type") == "tool_call"]
    edits = [r for r in between if r["tool"] == "apply_patch" or r["tool"] == "write_file"]
    assert all(r["tool"] == "write_file" and Path(r["args"]["path"]).name in REPORTS for r in edits), (cell, k)
    prev_result = next(r for _, _, r in ordered[prev + 1 :] if r.get("call_id") == ordered[prev][2]["call_id"])
    assert prev_result["output"] == result["output"], (cell, k["what"])


def test_repeats_are_identical_calls_on_unchanged_state(story: dict[str, Any]) -> None:
    rechecks = _kinds(story, "unchanged_recheck")
    assert sorted(rechecks) == ["C004", "C015", "C018"]
    checked = 0
    for kind in ("unchanged_recheck", "repeated_exploration", "zero_information_gain"):
        for cell, bs in _kinds(story, kind).items():
            for b in bs:
                tool_keys = [k for k in b["key_lines"] if k["line_end"] == k["line"] + 1]
                if kind != "unchanged_recheck":
                    tool_keys = tool_keys[1:]  # the first one is the original look-up
                for k in tool_keys:
                    _repeats_unchanged(cell, k)
                    checked += 1
    assert checked >= 20


def test_report_only_clearing(story: dict[str, Any]) -> None:
    clear = _kinds(story, "report_only_clearing")
    assert sorted(clear) == ["C004", "C018"]
    for b in (v[0] for v in clear.values()):
        keys = {k["what"]: k for k in b["key_lines"]}
        written = _call_and_result(next(k for w, k in keys.items() if "rewritten without B-1" in w))[0]
        assert "B-1" not in written["args"]["content"] and written["args"]["path"].endswith(
            ("review.md", "validation.md")
        )


def test_counter_examples(story: dict[str, Any]) -> None:
    (src,) = _kinds(story, "recheck_after_source_change")["C013"]
    keys = {k["what"]: k for k in src["key_lines"]}
    assert _line(keys["full suite fails"])["exit_code"] != 0
    assert _line(keys["same checks re-run after the change: pass"])["exit_code"] == 0
    ctl = _rows("C013")["cells/C013/controller.jsonl"]
    patches = [r["digest"] for r in ctl if r["event"] == "artifact_written" and r["artifact"] == "changes.patch"]
    assert len(set(patches)) == 2
    states = [r["state_digest"] for r in ctl if r["event"] == "state"]
    changed = _line(keys["state digest changes (implementation reopened)"])["state_digest"]
    assert changed not in states[: states.index(changed)]
    (op,) = _kinds(story, "recheck_after_operator_information")["C017"]
    keys = {k["what"]: k for k in op["key_lines"]}
    assert _line(keys["operator supplies new information"])["role"] == "operator"
    assert _line(keys["review accepted"])["event"] == "stage_accepted"
    for cell in ("C013", "C017"):
        assert story["cells"][cell]["label"] == "completed"


def test_omissions(story: dict[str, Any]) -> None:
    om = _kinds(story, "omission")
    assert len(om) >= 3 and len({_task(story, c) for c in om}) == len(om)
    for cell, (b,) in om.items():
        opened = _line(b["key_lines"][0])
        assert opened["event"] == "obligation_opened"
        ctl = _rows(cell)[f"cells/{cell}/controller.jsonl"]
        closed = {r["obligation_id"] for r in ctl if r["event"] == "obligation_closed"}
        assert opened["obligation_id"] not in closed
        assert any(r["event"] == "stage_accepted" and r["stage"] == "implementation" for r in ctl)


def test_repeats_zero_gain_and_duplicate_lines(story: dict[str, Any]) -> None:
    rep = _kinds(story, "repeated_exploration")
    assert len(rep) >= 3 and any(story["cells"][c]["label"] == "completed" for c in rep)
    zero = _kinds(story, "zero_information_gain")
    assert len(zero) >= 3
    dup = _kinds(story, "controller_duplicate_lines")
    assert dup
    for cell, (b,) in dup.items():
        (k,) = b["key_lines"]
        lines = (BUNDLE / k["path"]).read_text(encoding="utf-8").splitlines()[k["line"] - 1 : k["line_end"]]
        assert len(lines) >= 3 and len(set(lines)) == 1, cell
