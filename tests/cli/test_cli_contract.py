"""The CLI contract, checked over every verb the app registers (found at run time, not listed here).

- every verb (and sub-verb such as ``bundle freeze``) answers ``--help`` with exit 0 and appears in
  README's command table; every reporting verb takes ``--json``;
- bad input is one line on stderr with the contract's exit code (2 bad input, 3 blocked with a block
  receipt written, 4 needs_rebase), never a traceback, and leaves no partial artifact behind;
- an exception no check anticipated is still one line (exit 70) unless ``LUNASOL_DEBUG=1``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from pipeline.cli.app import app
from pipeline.core.errors import EXIT_BAD_INPUT, EXIT_BLOCKED, EXIT_INTERNAL, EXIT_NEEDS_REBASE, BadInput
from tests.conftest import DEMO_BUNDLE, DEMO_RECORDINGS, ROOT

# The verbs that report (status, calls, config, show, report, runs, diff..., plus eval): each must take --json.
REPORTING = ("bundle verify", "status", "calls", "validate", "diff", "runs", "query", "eval")


def _walk(cmd: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    out = [(path, cmd)] if path else []
    for name, sub in sorted(getattr(cmd, "commands", {}).items()):
        out += _walk(sub, (*path, name))
    return out


COMMANDS = _walk(typer.main.get_command(app))
VERBS = [" ".join(p) for p, c in COMMANDS if not getattr(c, "commands", None)]


def _readme_table() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Commands", 1)[1].split("\n## ", 1)[0]
    return "\n".join(line for line in section.splitlines() if line.startswith("| `lunasol "))


def test_discovery_finds_the_known_verbs() -> None:
    # guards the walk itself: if it found nothing, every test below would pass vacuously
    for verb in ("bundle freeze", "bundle verify", "bundle import", "run", "status", "confirm", "select", "eval"):
        assert verb in VERBS
    assert len(VERBS) >= 17


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=lambda p: " ".join(p))
def test_every_verb_has_help(path: tuple[str, ...]) -> None:
    res = CliRunner().invoke(app, [*path, "--help"])
    assert res.exit_code == 0, res.output
    assert "Usage:" in res.output and "Traceback" not in res.output


@pytest.mark.parametrize("verb", VERBS)
def test_every_verb_is_in_the_readme_table(verb: str) -> None:
    table = _readme_table()
    assert re.search(rf"`lunasol {re.escape(verb)}[ `]", table), f"`lunasol {verb}` missing from README's table"


@pytest.mark.parametrize("verb", REPORTING)
def test_reporting_verbs_take_json(verb: str) -> None:
    assert verb in VERBS, f"reporting verb {verb!r} is not registered"
    cmd = dict((" ".join(p), c) for p, c in COMMANDS)[verb]
    flags = {o for param in cmd.params for o in getattr(param, "opts", [])}
    assert "--json" in flags


def test_version() -> None:
    res = CliRunner().invoke(app, ["--version"])
    assert res.exit_code == 0 and re.fullmatch(r"lunasol \d+\.\d+\.\d+\S*\n", res.output)


# -- a demo run to be wrong about --------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo(demo_gate1: Path) -> Path:
    """The session's demo run at gate 1 (read only); tests that change a run work on a copy."""
    return demo_gate1


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    (tmp_path / "empty").mkdir()
    (tmp_path / "afile.txt").write_text("hello\n")
    (tmp_path / "garbage.yaml").write_text("a: [\n")
    return tmp_path


def _fmt(args: list[str], **where: Path) -> list[str]:
    return [a.format(**{k: str(v) for k, v in where.items()}) for a in args]


def _one_line_error(res: Any, code: int, phrase: str) -> None:
    assert res.exit_code == code, (res.exit_code, res.stdout, res.stderr)
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in res.stdout + res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("lunasol: "), res.stderr
    assert phrase in lines[0], lines[0]


SHORTLIST = "sha256:" + "0" * 64
RUN = ["run", "{bundle}", "--runs-dir", "{tmp}/runs"]  # every run case: the demo bundle, a scratch runs dir
BAD = [
    # (id, args, exit code, phrase)
    ("freeze-missing", ["bundle", "freeze", "{tmp}/nope"], 2, "bundle not found"),
    ("freeze-file", ["bundle", "freeze", "{tmp}/afile.txt"], 2, "bundle not found"),
    ("freeze-empty-dir", ["bundle", "freeze", "{tmp}/empty"], 2, "nothing to freeze"),
    ("verify-unfrozen", ["bundle", "verify", "{tmp}/empty"], 2, "missing manifest.json"),
    ("import-unknown-format", ["bundle", "import", "nosuch", "{tmp}/afile.txt", "{tmp}/b"], 2, "unknown format"),
    ("import-missing-src", ["bundle", "import", "auto", "{tmp}/nope", "{tmp}/b"], 2, "source not found"),
    ("export-empty-bundle", ["export", "{tmp}/empty", "--runs-dir", "{tmp}/runs"], 2, "analysis-request.json"),
    ("run-file", ["run", "{tmp}/afile.txt", "--runs-dir", "{tmp}/runs"], 2, "bundle not found"),
    ("run-replay-and-record", [*RUN, "--replay", "x", "--record", "y"], 2, "exclude each other"),
    ("run-concurrency-0", [*RUN, "--concurrency", "0"], 2, "invalid --concurrency"),
    ("run-budget-negative", [*RUN, "--budget-usd", "-1"], 2, "invalid --budget-usd"),
    ("run-replay-missing", [*RUN, "--replay", "{tmp}/nope"], 2, "replay store not found"),
    ("run-replay-empty-store", [*RUN, "--replay", "{tmp}/empty"], 2, "holds no recording"),
    ("run-no-model", RUN, 2, "no model given"),
    ("run-api-base-not-a-url", [*RUN, "--model", "m", "--api-base", "x"], 2, "invalid --api-base"),
    ("run-record-into-a-file", [*RUN, "--model", "m", "--record", "{tmp}/afile.txt"], 2, "record store"),
    ("run-replay-other-model", [*RUN, "--replay", "{recordings}", "--model", "openai/other"], 2, "was recorded with"),
    (
        "run-runs-dir-is-a-file",
        ["run", "{bundle}", "--runs-dir", "{tmp}/afile.txt", "--replay", "{recordings}"],
        2,
        "--runs-dir",
    ),
    (
        "export-parquet-is-a-file",
        ["export", "{bundle}", "--runs-dir", "{tmp}/runs", "--parquet", "{tmp}/afile.txt"],
        2,
        "--parquet",
    ),
    ("status-file", ["status", "{tmp}/afile.txt"], 2, "not a lunasol run directory"),
    ("calls-empty-dir", ["calls", "{tmp}/empty"], 2, "not a lunasol run directory"),
    ("show-ref-malformed", ["show-ref", "garbage", "--run", "{run}"], 2, "not a ref"),
    ("show-ref-escapes", ["show-ref", "../../etc/passwd#L1-L1", "--run", "{run}"], 2, "escapes the bundle"),
    (
        "show-ref-past-end",
        ["show-ref", "cells/C004/sessions/08-review-reviewer.jsonl#L9999-L9999", "--run", "{run}"],
        2,
        "past the end",
    ),
    ("query-bad-sql", ["query", "{run}", "SELECT * FROM nosuch"], 2, "SQL error"),
    ("query-write", ["query", "{run}", "DROP TABLE events"], 2, "read-only"),
    ("query-two-statements", ["query", "{run}", "SELECT 1; SELECT 2"], 2, "one statement per query"),
    ("query-empty", ["query", "{run}", "  "], 2, "empty query"),
    (
        "confirm-unknown-weakness",
        ["confirm", "{run}", "--decision", "W-09=confirm", "--by", "qa"],
        2,
        "no such weakness",
    ),
    ("confirm-malformed-decision", ["confirm", "{run}", "--decision", "W-01", "--by", "qa"], 2, "W-01=VALUE"),
    (
        "confirm-bad-value",
        ["confirm", "{run}", "--decision", "W-01=maybe", "--decision", "W-02=confirm", "--by", "qa"],
        2,
        "must be one of",
    ),
    ("confirm-no-decision", ["confirm", "{run}"], 2, "silence is never approval"),
    (
        "confirm-malformed-digest",
        [
            "confirm",
            "{run}",
            "--decision",
            "W-01=confirm",
            "--decision",
            "W-02=confirm",
            "--by",
            "qa",
            "--digest",
            "garbage",
        ],
        2,
        "--digest must look like",
    ),
    (
        "confirm-stale-digest",
        [
            "confirm",
            "{run}",
            "--decision",
            "W-01=confirm",
            "--decision",
            "W-02=confirm",
            "--by",
            "qa",
            "--digest",
            SHORTLIST,
        ],
        EXIT_NEEDS_REBASE,
        "needs_rebase",
    ),
    ("select-two-choices", ["select", "{run}", "--proposal", "P-01", "--none", "--by", "qa"], 2, "exactly one of"),
    ("select-no-by", ["select", "{run}", "--none"], 2, "--by NAME"),
    ("validate-garbage-yaml", ["validate", "{tmp}/garbage.yaml"], 2, "not readable YAML"),
    ("validate-dir", ["validate", "{tmp}/empty"], 2, "not found"),
    ("diff-with-non-run", ["diff", "{run}", "{tmp}/empty"], 2, "not a lunasol run directory"),
    ("diff-json-and-markdown", ["diff", "{run}", "{run}", "--json", "--markdown"], 2, "one of --json and --markdown"),
    ("report-into-missing-dir", ["report", "{run}", "-o", "{tmp}/nope/r.html"], 2, "output directory does not exist"),
    ("report-onto-a-dir", ["report", "{run}", "-o", "{tmp}/empty"], 2, "is a directory"),
    ("runs-dir-is-a-file", ["runs", "--runs-dir", "{tmp}/afile.txt"], 2, "not found"),
    ("eval-without-labels", ["eval", "{run}", "--labels", "who-and-when"], 2, "no usable who-and-when labels"),
    ("eval-unknown-labels", ["eval", "{run}", "--labels", "nosuch"], 2, "unknown label format"),
]


@pytest.mark.parametrize(("args", "code", "phrase"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_is_one_line(
    demo: Path, scratch: Path, args: list[str], code: int, phrase: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LUNASOL_MODEL", raising=False)
    before = sorted(p.relative_to(demo).as_posix() for p in demo.rglob("*"))
    res = CliRunner().invoke(app, _fmt(args, tmp=scratch, run=demo, bundle=DEMO_BUNDLE, recordings=DEMO_RECORDINGS))
    _one_line_error(res, code, phrase)
    # nothing partial: no run dir, no new directory, no manifest of nothing, the demo run untouched
    assert not (scratch / "runs").exists()
    assert not (scratch / "nope").exists() and not (scratch / "b").exists()
    assert list((scratch / "empty").iterdir()) == []
    assert sorted(p.relative_to(demo).as_posix() for p in demo.rglob("*")) == before


def test_usage_errors_exit_2_readably() -> None:
    for args in (["nosuchverb"], ["status"], ["status", "x", "--bogus"], ["run", "b", "--concurrency", "abc"]):
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2, args
        assert "Traceback" not in res.output and ("Usage:" in res.stderr or "Usage:" in res.output)


def test_rerun_without_a_model_changes_nothing(demo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # it used to invalidate luna, sol and gate 1 and then fail at the luna stage
    monkeypatch.delenv("LUNASOL_MODEL", raising=False)
    run_dir = tmp_path / "runs" / demo.name
    shutil.copytree(demo, run_dir)
    ledger = (run_dir / "ledger.json").read_bytes()
    res = CliRunner().invoke(app, ["run", str(DEMO_BUNDLE), "--runs-dir", str(tmp_path / "runs")])
    _one_line_error(res, EXIT_BAD_INPUT, "this run was made with --replay")
    assert (run_dir / "ledger.json").read_bytes() == ledger


def test_blocked_gate_writes_a_receipt_and_success_resolves_it(demo: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / demo.name
    shutil.copytree(demo, run_dir)
    res = CliRunner().invoke(app, ["select", str(run_dir), "--proposal", "P-01", "--by", "qa"])
    _one_line_error(res, EXIT_BLOCKED, "gate 2 has nothing to decide on")
    # the unblocking step comes from the run's state (gate 1 is still open), not from the refused verb
    assert "unblock: lunasol confirm" in res.stderr and "receipt:" in res.stderr
    receipt = json.loads((run_dir / "block-receipt.json").read_text())
    assert receipt["stage"] == "select" and receipt["requested_unblock"].startswith("lunasol confirm")
    status = json.loads(CliRunner().invoke(app, ["status", str(run_dir), "--json"]).stdout)
    assert "block" in json.dumps(status).lower()
    digest = json.loads((run_dir / "handoff.json").read_text())["shortlist_digest"]
    res = CliRunner().invoke(
        app,
        [
            "confirm",
            str(run_dir),
            "--decision",
            "W-01=confirm",
            "--decision",
            "W-02=reject",
            "--by",
            "qa",
            "--digest",
            digest,
        ],
    )
    assert res.exit_code == 0, res.output
    assert not (run_dir / "block-receipt.json").exists()  # the run went past it
    assert len(list((run_dir / "block-receipts").glob("*.json"))) == 1  # kept, resolved


def test_unexpected_exception_is_one_line_unless_debug(monkeypatch: pytest.MonkeyPatch, demo: Path) -> None:
    import pipeline.run.status

    def boom(_run_dir: Path) -> dict[str, Any]:
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(pipeline.run.status, "status", boom)
    monkeypatch.delenv("LUNASOL_DEBUG", raising=False)
    res = CliRunner().invoke(app, ["status", str(demo)])
    _one_line_error(res, EXIT_INTERNAL, "internal error: ZeroDivisionError")
    assert "LUNASOL_DEBUG=1" in res.stderr
    monkeypatch.setenv("LUNASOL_DEBUG", "1")
    res = CliRunner().invoke(app, ["status", str(demo)])
    assert isinstance(res.exception, ZeroDivisionError)


def test_validation_error_reaching_the_boundary_is_bad_input(monkeypatch: pytest.MonkeyPatch, demo: Path) -> None:
    from pydantic import BaseModel

    import pipeline.run.status

    class Strict(BaseModel):
        n: int

    def bad(_run_dir: Path) -> dict[str, Any]:
        Strict.model_validate({"n": "many"})
        return {}

    monkeypatch.setattr(pipeline.run.status, "status", bad)
    res = CliRunner().invoke(app, ["status", str(demo)])
    _one_line_error(res, EXIT_BAD_INPUT, "invalid Strict: n:")


# -- the same checks through the library ----------------------------------------------------------


def test_library_rejects_the_same_inputs(demo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.core.context import RunOptions
    from pipeline.core.settings import ModelSettings
    from pipeline.ir.query import query
    from pipeline.models.store import check_store
    from pipeline.report import write_report
    from pipeline.run.runner import run

    monkeypatch.delenv("LUNASOL_MODEL", raising=False)
    with pytest.raises(BadInput, match="invalid --concurrency"):
        ModelSettings.from_env(concurrency=0)
    monkeypatch.setenv("LUNASOL_BUDGET_USD", "-2")
    with pytest.raises(BadInput, match="invalid LUNASOL_BUDGET_USD"):
        ModelSettings.from_env()
    monkeypatch.delenv("LUNASOL_BUDGET_USD")
    opts = RunOptions(
        bundle=DEMO_BUNDLE,
        run_id="x",
        runs_dir=tmp_path / "runs",
        resume=False,
        dry_run=False,
        models=ModelSettings.from_env(),
    )
    with pytest.raises(BadInput, match="was recorded with openai/fixture-model, not openai/other"):
        check_store(ModelSettings.from_env(mode="replay", store=DEMO_RECORDINGS, model="openai/other"))
    with pytest.raises(BadInput, match="replay store not found"):
        check_store(ModelSettings.from_env(mode="replay", store=tmp_path / "nope"))
    check_store(ModelSettings.from_env(mode="replay", store=DEMO_RECORDINGS))  # as recorded: fine
    with pytest.raises(BadInput, match="no model given"):
        run(opts, log=lambda _m: None)
    assert not (tmp_path / "runs").exists()
    with pytest.raises(BadInput, match="empty query"):
        query(demo, "")
    with pytest.raises(BadInput, match="does not exist"):
        write_report(demo, out=tmp_path / "nope" / "r.html")
    assert not (tmp_path / "nope").exists()


def test_real_process_prints_one_line(tmp_path: Path) -> None:
    # through the console entry point (not the test runner): stderr is exactly one line, exit 2
    code = "from pipeline.cli.app import main; main()"
    args = ["run", str(DEMO_BUNDLE), "--runs-dir", str(tmp_path / "runs"), "--concurrency", "0"]
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == EXIT_BAD_INPUT
    assert out.stderr.splitlines() == [
        "lunasol: invalid --concurrency: Input should be greater than or equal to 1 (got 0)"
    ]
    assert not (tmp_path / "runs").exists()


def test_the_console_entry_point_tunes_the_collector_and_freezes_it_before_exit(tmp_path: Path) -> None:
    # the process's collector settings, read after main() returns as the interpreter would exit
    code = (
        "import gc, json\n"
        "from pipeline.cli.app import GC_THRESHOLDS, main\n"
        "before = gc.get_threshold()\n"
        "try:\n    main()\nexcept SystemExit as e:\n    rc = e.code\n"
        "print(json.dumps([before, gc.get_threshold(), list(GC_THRESHOLDS), gc.get_freeze_count(), rc]))"
    )
    args = ["run", str(DEMO_BUNDLE), "--runs-dir", str(tmp_path / "runs"), "--concurrency", "0"]
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60)
    before, after, wanted, frozen, rc = json.loads(out.stdout.splitlines()[-1])
    assert before != wanted and after == wanted
    assert frozen > 0 and rc == EXIT_BAD_INPUT  # frozen even when the command fails


def test_a_run_missing_an_artifact_does_not_pass_for_finished(demo: Path, tmp_path: Path) -> None:
    from pipeline.run.status import missing_outputs

    run_dir = tmp_path / demo.name
    shutil.copytree(demo, run_dir)
    assert missing_outputs(run_dir) == []
    (run_dir / "weakness-shortlist.json").unlink()
    assert missing_outputs(run_dir) == ["weakness-shortlist.json (sol)"]
    res = CliRunner().invoke(app, ["status", str(run_dir), "--json"])
    s = json.loads(res.stdout)
    assert s["missing_outputs"] == ["weakness-shortlist.json (sol)"]
    assert s["next_command"].startswith("lunasol run ") and "--resume" not in s["next_command"]
    assert "MISSING" in CliRunner().invoke(app, ["status", str(run_dir)]).stdout
    rows = json.loads(CliRunner().invoke(app, ["runs", "--runs-dir", str(tmp_path), "--json"]).stdout)
    assert [r["error"] for r in rows] == ["missing weakness-shortlist.json (sol)"]


def test_interrupt_says_so(monkeypatch: pytest.MonkeyPatch, demo: Path) -> None:
    # typer alone turns Ctrl-C into a silent exit 130
    import pipeline.run.status

    def interrupted(_run_dir: Path) -> dict[str, Any]:
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline.run.status, "status", interrupted)
    res = CliRunner().invoke(app, ["status", str(demo)])
    assert res.exit_code == 130
    assert res.stderr.startswith("lunasol: interrupted") and len(res.stderr.splitlines()) == 1


def test_closed_pipe_is_quiet(monkeypatch: pytest.MonkeyPatch, demo: Path) -> None:
    # `lunasol query ... | head`: not "lunasol: BrokenPipeError" and exit 2, but typer's quiet exit 1
    import pipeline.run.status

    def closed(_run_dir: Path) -> dict[str, Any]:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(pipeline.run.status, "status", closed)
    res = CliRunner().invoke(app, ["status", str(demo)])
    assert res.exit_code == 1 and "BrokenPipeError" not in res.stderr
