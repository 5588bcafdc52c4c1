"""Shared by the adapter and eval tests: subsets of the shared data, import+export, ref checks."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import duckdb
import pytest

from pipeline.adapters import import_bundle
from pipeline.adapters.importer import ImportResult
from pipeline.adapters.spans import resolve_element
from pipeline.bundle.manifest import read_manifest
from pipeline.bundle.request import load_request
from pipeline.core.canonical import sha256_bytes
from pipeline.ir.export import export
from tests.conftest import SHARED_DATA

# Samples written for the tests (formats the shared data has no public copy of); an absolute folder
# in SUBSETS is taken as it is (SHARED_DATA / "/abs" == "/abs").
FOREIGN_FIXTURES = Path(__file__).parent.parent / "fixtures" / "foreign"

# A few files per format keep the suite fast; bench/bench_adapters.py measures the full datasets.
SUBSETS: dict[str, tuple[str, list[str]]] = {
    "mini-swe-agent": (
        str(FOREIGN_FIXTURES / "mini-swe-agent"),
        ["timeparse-1.traj.json", "emptyconfig-2.traj.json", "messages-only.json"],
    ),
    "who-and-when": (
        "who-and-when",
        [
            "Algorithm-Generated/1.json",
            "Algorithm-Generated/12.json",
            "Algorithm-Generated/45.json",
            "Hand-Crafted/34.json",
            "Hand-Crafted/2.json",
        ],
    ),
    "mast": ("mast-mad-human", ["MAD_human_labelled_dev.json", "mast_taxonomy_crosswalk.json"]),
    "swe-agent": (
        "swe-agent-trajectories",
        [
            "tests/test_data/trajectories/gpt4__swe-agent-test-repo__default_from_url__t-0.00__p-0.95__c-3.00__install-1/6e44b9__sweagenttestrepo-1c2844.traj",
            "tests/test_data/trajectories/gpt4__swe-agent__test-repo__default_from_url__t-0.00__p-0.95__c-3.00__install-1/swe-agent__test-repo-i1.traj",
            "trajectories/demonstrations/function_calling_simple.traj",
        ],
    ),
    "openhands": (
        "openhands-trajectories",
        [
            "tests/runtime/trajs/basic.json",
            "tests/runtime/trajs/basic_gui_mode.json",
            "tests/unit/resolver/mock_output/output.jsonl",
            "evaluation/benchmarks/multi_swe_bench/examples/output.jsonl",
            "evaluation/benchmarks/swe_bench/examples/example_model_output.json",
        ],
    ),
    "inspect": (
        "inspect-ai-logs",
        [
            "tests/log/test_eval_log/log_tool_call_error.json",
            "tests/log/test_eval_log/log_read_sample.eval",
            "tests/log/test_eval_log/log_streaming.eval",
            "tests/analysis/test_logs/2025-05-12T20-28-13-04-00_no-samples.json",
            "tests/analysis/test_logs/2025-05-12T20-27-36-04-00_browser.json",
        ],
    ),
    "claude-code": (
        "claude-code-sessions",
        [
            *(
                f"inspect_scout/tests/sources/claude_code_source/fixtures/{n}"
                for n in (
                    "agent_session.jsonl",
                    "agent-atest01.jsonl",
                    "compaction_session.jsonl",
                    "clear_split_session.jsonl",
                    "tool_call_conversation.jsonl",
                )
            ),
            "codetracer/data/traj/kimi_k2.5/regex-log__XYfBZFy/agent/claude-code.txt",
            "codetracer/data/traj/kimi_k2.5/regex-log__XYfBZFy/result.json",
            "codetracer/data/traj/kimi_k2.5/regex-log__XYfBZFy/verifier/reward.txt",
            "codetracer/data/traj/kimi_k2.5/polyglot-rust-c__s3NDv6x/agent/claude-code.txt",
            "codetracer/data/traj/kimi_k2.5/polyglot-rust-c__s3NDv6x/result.json",
        ],
    ),
    "atif": (
        "atif-trajectories",
        [
            f"tests/sources/atif_source/fixtures/{n}"
            for n in (
                "openhands_hello-world.trajectory.json",
                "openhands_hello-world.trajectory.no_function_calling.json",
                "terminus_2_hello-world-context-summarization-linear-history.trajectory.json",
                "terminus_2_hello-world-context-summarization-linear-history.trajectory.cont-1.json",
            )
        ],
    ),
    "tau": ("agentrx-examples", ["trajectories/tau-retail/instruction_adherence_failure.json"]),
    "codex": (
        str(FOREIGN_FIXTURES / "codex"),
        [
            "ai-sessions/rollout-older-format.jsonl",
            "ai-sessions/rollout-newer-format.jsonl",
            "agent-history/codex_with_escalation.jsonl",
        ],
    ),
    "gemini-cli": (
        str(FOREIGN_FIXTURES / "gemini-cli"),
        ["ai-sessions/session-sample.json", "agent-history/gemini_with_tool_error.jsonl", "agent-history/logs.json"],
    ),
    # Formats whose samples are committed with their provenance (tests/fixtures/foreign/<format>/README.md)
    "otel-genai": (
        str(FOREIGN_FIXTURES / "otel-genai"),
        [
            "openinference-agents.otlp.json",
            "contrib-openai-agents-v2.spans.jsonl",
            "openinference-openai-console.out.json",
        ],
    ),
    "copilot-cli": (
        str(FOREIGN_FIXTURES / "copilot-cli"),
        [
            "session-state/15c6b921-b7e9-4879-b52f-dd57657a4394/events.jsonl",
            "session-state/e9a36447-7d9e-4cfe-bd50-70eb066c93e5/events.jsonl",
        ],
    ),
    "opencode": (
        str(FOREIGN_FIXTURES / "opencode"),
        [
            str(p.relative_to(FOREIGN_FIXTURES / "opencode"))
            for p in sorted((FOREIGN_FIXTURES / "opencode" / "opencode-1.1.34").rglob("*.json"))
            if p.parent.name != "project"  # OpenCode's project metadata is no session's file
        ],
    ),
    "aider": (
        str(FOREIGN_FIXTURES / "aider"),
        [
            "aider-repo-fixture-excerpt-v0.48/.aider.chat.history.md",
            "zen-mcp-server-v0.86/.aider.chat.history.md",
        ],
    ),
}


def need_shared_data() -> None:
    """Skip (with the reason) when the shared data folder is not beside the repository."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data folder not found at {SHARED_DATA}")


# Who&When files whose eval figures are checked by hand in tests/test_eval.py.
HAND_CHECKED = (
    "who-and-when",
    [
        "Algorithm-Generated/1.json",
        "Algorithm-Generated/12.json",
        "Algorithm-Generated/45.json",
        "Hand-Crafted/34.json",
    ],
)


def make_subset(fmt: str, dest: Path, subset: tuple[str, list[str]] | None = None) -> Path:
    """Copy the format's subset (keeping relative paths) into ``dest`` and return it."""
    folder, files = subset or SUBSETS[fmt]
    for rel in files:
        src = SHARED_DATA / folder / rel
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest / rel)
    return dest


_DONE: dict[tuple[str, Path], tuple[Path, Path, ImportResult]] = {}


def imported(fmt: str, base: Path, subset: tuple[str, list[str]] | None = None) -> tuple[Path, Path, ImportResult]:
    """Import and export one format's subset once per base dir: (bundle, run dir, result)."""
    if (fmt, base) in _DONE:
        return _DONE[(fmt, base)]
    src = make_subset(fmt, base / "src", subset)
    bundle = base / "bundle"
    result = import_bundle(fmt, src, bundle)
    run = base / "runs" / "r1"
    export(bundle, run)
    _DONE[(fmt, base)] = (bundle, run, result)
    return bundle, run, result


def events_of(run: Path) -> list[dict[str, Any]]:
    """Every IR event as a dict, in (cell, seq) order."""
    con = duckdb.connect(str(run / "ir.duckdb"), read_only=True)
    try:
        cur = con.execute("SELECT * FROM events ORDER BY cell_id, seq")
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, row, strict=True)) for row in cur.fetchall()]
    finally:
        con.close()


def check_refs(bundle: Path, events: list[dict[str, Any]]) -> tuple[int, list[str]]:
    """Re-read every ref's bytes: hash, line range, pointer span. Returns (resolved, failures)."""
    manifest = read_manifest(bundle)
    raws: dict[str, bytes] = {}
    ok = 0
    bad: list[str] = []
    for e in events:
        path = e["source_path"]
        if path not in raws:
            raws[path] = (bundle / path).read_bytes()
        raw = raws[path]
        ref = f"{path}#L{e['line_start']}-L{e['line_end']}{e['json_pointer'] or ''}"
        if sha256_bytes(raw) != manifest.get(path).sha256 or e["source_sha256"] != manifest.get(path).sha256:
            bad.append(f"{ref}: hash differs")
            continue
        try:
            resolve_element(raw, e["line_start"], e["line_end"], e["json_pointer"])
        except (ValueError, KeyError, IndexError) as exc:
            bad.append(f"{ref}: {exc}")
            continue
        ok += 1
    return ok, bad


def source_blocks(bundle: Path) -> dict[str, Any]:
    """The request's per-cell source blocks."""
    source = load_request(bundle).source or {}
    blocks: dict[str, Any] = source["cells"]
    return blocks
