"""Detection never misroutes: every format's samples through every adapter's score, a diagonal matrix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.adapters import adapters, judge
from pipeline.adapters.registry import MARGIN, SURE
from tests.adapters.adapter_helpers import FOREIGN_FIXTURES, SHARED_DATA, SUBSETS

# Samples that are not runs (outcome files, crosswalks) are nobody's to claim.
_NOT_RUNS = ("result.json", "reward.txt", "crosswalk", "example_model_output.json")  # the last: predictions only

# Formats whose samples live only under tests/fixtures/foreign/<format>/ (real public files).
FIXTURE_FORMATS = ("codex", "gemini-cli")


def _samples() -> list[tuple[str, Path, str]]:
    out: list[tuple[str, Path, str]] = []
    for fmt, (folder, files) in SUBSETS.items():
        for rel in files:
            if not any(n in rel for n in _NOT_RUNS):
                out.append((fmt, SHARED_DATA / folder / rel, rel))
    for fmt in FIXTURE_FORMATS:
        root = FOREIGN_FIXTURES / fmt
        for p in sorted(root.rglob("*")):
            if p.is_file() and p.suffix in (".jsonl", ".json") and fmt in adapters():
                out.append((fmt, p, p.relative_to(root).as_posix()))
    return [s for s in out if s[1].is_file()]


def test_confusion_matrix_is_diagonal() -> None:
    samples = _samples()
    if len({f for f, _, _ in samples}) < 5:
        pytest.skip(f"shared data folder not found at {SHARED_DATA}")
    matrix: dict[tuple[str, str | None], int] = {}
    wrong = []
    for fmt, path, rel in samples:
        v = judge(path, rel)
        matrix[(fmt, v.name)] = matrix.get((fmt, v.name), 0) + 1
        if v.name != fmt:
            wrong.append((fmt, rel, v.name, v.scores[:2]))
    assert wrong == []
    assert all(got == fmt for fmt, got in matrix)  # diagonal: every sample chose its own format
    covered = {fmt for fmt, _ in matrix}
    assert covered >= set(SUBSETS) | {f for f in FIXTURE_FORMATS if f in adapters()}


def test_a_codex_like_line_is_not_claude_code(tmp_path: Path) -> None:
    """The misrouting of issue 32: a first line with "session_id" and "type" is not Claude Code."""
    f = tmp_path / "rollout.jsonl"
    f.write_text('{"type":"session_meta","session_id":"x","payload":{"cwd":"/w"}}\n')
    scores = dict((n, s) for n, s, _ in judge(f, f.name).scores)
    assert scores["claude-code"] < SURE
    g = tmp_path / "cc.jsonl"
    g.write_text('{"type":"system","subtype":"init","session_id":"x","tools":["Bash"],"model":"m"}\n')
    assert judge(g, g.name).name == "claude-code"


def test_a_close_call_is_refused_with_both_reasons(tmp_path: Path) -> None:
    """When two formats score within the margin, nothing is chosen and both reasons are given."""
    from pipeline.adapters.registry import Verdict

    v = Verdict("x.json", [("a", 0.8, "field A"), ("b", 0.8 - MARGIN / 2, "field B"), ("c", 0.0, "")])
    assert v.name is None
    assert "a (because field A)" in v.why_not() and "b (because field B)" in v.why_not()
    assert Verdict("x.json", [("a", 0.8, "A"), ("b", 0.5, "B")]).name == "a"
    assert Verdict("x.json", [("a", SURE - 0.1, "A")]).name is None


def test_a_long_init_line_is_still_claude_code(tmp_path: Path) -> None:
    line = {"type": "system", "subtype": "init", "session_id": "x", "tools": [f"mcp__t{i}" for i in range(9000)]}
    f = tmp_path / "stream.jsonl"
    f.write_text(json.dumps(line, separators=(",", ":")) + "\n")
    assert judge(f, f.name).name == "claude-code"


def test_pyproject_registers_exactly_the_builtin_formats() -> None:
    """lunasol's own entry points and the fallback table BUILTIN name the same adapters."""
    import tomllib

    from pipeline.adapters.registry import BUILTIN

    root = Path(__file__).resolve().parents[2]
    eps = tomllib.loads((root / "pyproject.toml").read_text())["project"]["entry-points"]["lunasol.formats"]
    assert list(eps) == list(BUILTIN)
    for name, value in eps.items():
        module = BUILTIN[name].read.__module__
        assert value == f"{module}:ADAPTER" and BUILTIN[name].name == name
