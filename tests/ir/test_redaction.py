"""Secrets planted in a bundle's logs never reach a prompt, a recording, the report or the IR's text.

The secrets below are fake but have the real formats. The bundle (and its refs) keep them:
``show-ref --unredacted`` prints them from the user's own bytes, everything else shows
``[REDACTED:<kind>]``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from typer.testing import CliRunner

from pipeline.bundle import freeze
from pipeline.bundle.synth import tree_snapshot
from pipeline.cli.app import app
from pipeline.core.canonical import read_json
from pipeline.core.context import RunOptions
from pipeline.core.settings import ModelSettings
from pipeline.ir.redact import KINDS, redact, redact_column
from pipeline.report.build import read_page_data
from pipeline.report.evidence import EvidenceReader
from pipeline.run.runner import run
from pipeline.testing.openai_server import FakeOpenAI
from tests.sol.sol_helpers import make_bundle
from tests.state.test_ledger import handler as ledger_handler

runner = CliRunner()

OPENAI = "sk-proj-Ab3dEf9hIj2lMn5pQr8tUv1xYz40123456789abcd"
AWS_ID = "AKIAQWERTYU1OPASDFGH"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLE12"
GITHUB = "ghp_R2d2C3poL8kE9yW1qZ7xV5bN3mA6sD4fG0hJ"
KEY_LINES = [
    "MIIEpAIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun",
    "VTLw7onLRnrq0IzW7yWR7QkrmBL7jTKEn5uqKhbwKfBstIs",
]
PRIVATE_KEY = "-----BEGIN RSA PRIVATE KEY-----\n" + "\n".join(KEY_LINES) + "\n-----END RSA PRIVATE KEY-----"
BEARER = "x9Yk2Lm4Np6Qr8St0Uv2Wx4Yz6Ab8Cd"
URL_PASSWORD = "hunter2Secret99"
SLACK = "xoxb-2048-1234567890-AbCdEfGhIjKlMnOp"
SECRETS = [OPENAI, AWS_ID, AWS_SECRET, GITHUB, *KEY_LINES, BEARER, URL_PASSWORD, SLACK]
PLANTED = "cells/C001/sessions/09-review-reviewer.jsonl"


def _plant(bundle: Path) -> None:
    ts = "2099-01-01T00:00:0{}Z"  # after every other event: the tiny bundle's event ids stay as they were
    long_message = "context " * 600 + f"and the token is {GITHUB} " + "more context " * 600  # cut in the middle
    rows: list[dict[str, Any]] = [
        {"ts": ts.format(0), "type": "message", "role": "reviewer", "content": f"use my key {OPENAI} for this"},
        {
            "ts": ts.format(1),
            "type": "tool_call",
            "call_id": "s1",
            "tool": "shell",
            "args": {
                "command": f"curl -H 'Authorization: Bearer {BEARER}' https://api.example.com",
                "env": {"AWS_ACCESS_KEY_ID": AWS_ID, "AWS_SECRET_ACCESS_KEY": AWS_SECRET, "SLACK": SLACK},
                "url": f"https://deploy:{URL_PASSWORD}@git.example.com/repo.git",
            },
        },
        {"ts": ts.format(2), "type": "tool_result", "call_id": "s1", "tool": "shell", "output": PRIVATE_KEY},
        {"ts": ts.format(3), "type": "message", "role": "reviewer", "content": long_message},
    ]
    (bundle / PLANTED).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    freeze(bundle)


def _leaks(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


@pytest.fixture(scope="module")
def planted_run(tmp_path_factory: pytest.TempPathFactory, _fake_llm_server: FakeOpenAI) -> Iterator[dict[str, Any]]:
    """One recorded run of the planted bundle, read by the tests below (none of them changes it)."""
    root = tmp_path_factory.mktemp("planted")
    runs_dir = root / "runs"
    server = _fake_llm_server
    server.reset()
    server.handler = ledger_handler
    bundle = make_bundle(root)
    _plant(bundle)
    store = root / "store"
    settings = ModelSettings(
        model="openai/test-model",
        api_base=server.base_url,
        timeout_s=5.0,
        max_reasks=2,
        instructor_mode="tools",
        mode="record",
        store=store,
    )
    log: list[str] = []
    before = tree_snapshot(bundle)
    run(RunOptions(bundle=bundle, run_id="r1", runs_dir=runs_dir, models=settings), log=log.append)
    yield {
        "bundle": bundle,
        "run_dir": runs_dir / "r1",
        "store": store,
        "log": log,
        "requests": list(server.requests),  # the server is the session's: later tests reset it
        "before": before,
    }
    server.reset()


def test_no_planted_secret_reaches_prompts_recordings_report_or_ir(planted_run: dict[str, Any]) -> None:
    d, requests = planted_run["run_dir"], planted_run["requests"]
    assert requests, "the run sent prompts"
    for request in requests:
        assert _leaks(json.dumps(request, ensure_ascii=False)) == []
    assert _leaks(json.dumps(requests)) == []  # the JSON-escaped form too
    prompts = "\n".join(json.dumps(r) for r in requests)
    assert "[REDACTED:openai-key]" in prompts  # the cell was shown to Luna, with the marker in place

    recordings = [p for p in planted_run["store"].rglob("*") if p.is_file()]
    assert recordings
    for path in recordings:
        assert _leaks(path.read_text(encoding="utf-8", errors="replace")) == [], path

    for path in d.rglob("*"):  # every artifact of the run (calls.jsonl, patterns, run.json, ...)
        if path.is_file() and path.suffix != ".duckdb":
            assert _leaks(path.read_text(encoding="utf-8", errors="replace")) == [], path

    result = runner.invoke(app, ["report", str(d)])
    assert result.exit_code == 0, result.output
    html = (d / "report" / "index.html").read_text(encoding="utf-8")
    assert _leaks(html) == []
    # the timelines, raw lines and search index the report's shards hold are deflated: read them inflated
    embedded = json.dumps(read_page_data(d / "report"), ensure_ascii=False)
    assert _leaks(embedded) == []
    assert "[REDACTED:private-key]" in embedded and "[REDACTED:openai-key]" in embedded
    # what the page embeds for a cited ref or event of the planted file: its raw lines, redacted
    cited = {f"{PLANTED}#L1-L4", "C001-e0001"}
    with EvidenceReader(d) as reader:  # closed: a later test in this process may check no IR is left attached
        evidence = reader.resolve(cited)
    shown = json.dumps(evidence.lines, ensure_ascii=False)
    assert all(evidence.snippets[k].status == "verified" for k in cited)
    assert _leaks(shown) == [] and "[REDACTED:openai-key]" in shown and "[REDACTED:private-key]" in shown

    con = duckdb.connect(str(d / "ir.duckdb"), read_only=True)
    try:
        columns = con.execute(
            "SELECT table_name, column_name FROM information_schema.columns WHERE data_type = 'VARCHAR'"
        ).fetchall()
        for table, column in columns:
            for (value,) in con.execute(f'SELECT "{column}" FROM "{table}" WHERE "{column}" IS NOT NULL').fetchall():
                assert _leaks(value) == [], (table, column)
        texts = [t for (t,) in con.execute("SELECT text FROM events WHERE source_path = ?", [PLANTED]).fetchall()]
        (count,) = con.execute("SELECT redactions FROM coverage WHERE cell_id = 'C001'").fetchone() or (0,)
        (others,) = con.execute("SELECT sum(redactions) FROM coverage WHERE cell_id <> 'C001'").fetchone() or (0,)
    finally:
        con.close()
    assert _leaks((d / "ir.duckdb").read_bytes().decode("utf-8", errors="replace")) == []
    joined = "\n".join(texts)
    for kind in ("openai-key", "bearer-token", "aws-access-key-id", "aws-secret-key", "slack-token",
                 "private-key", "url-password"):  # fmt: skip
        assert f"[REDACTED:{kind}]" in joined, kind
    # 8 in the text of the four events (the GitHub token's marker was then trimmed away with the middle
    # of its long message: redaction comes first), and the url as the target of the call and of its result
    assert count == 10
    assert others == 0
    assert read_json(d / "run.json")["export"]["redactions"] == 10
    assert any("10 secret(s) redacted in 1 cell(s)" in line for line in planted_run["log"])


def test_the_bundle_keeps_its_bytes_and_show_ref_redacts_unless_asked(planted_run: dict[str, Any]) -> None:
    bundle, d = planted_run["bundle"], planted_run["run_dir"]
    assert tree_snapshot(bundle) == planted_run["before"]
    assert OPENAI in (bundle / PLANTED).read_text(encoding="utf-8")
    ref = f"{PLANTED}#L1-L3"
    shown = runner.invoke(app, ["show-ref", ref, "--run", str(d)])
    assert shown.exit_code == 0, shown.output
    assert _leaks(shown.output) == []
    assert "[REDACTED:openai-key]" in shown.output and len(shown.output.strip().splitlines()) == 3
    as_json = runner.invoke(app, ["show-ref", ref, "--run", str(d), "--json"])
    assert _leaks(as_json.output) == []
    raw = runner.invoke(app, ["show-ref", ref, "--run", str(d), "--unredacted"])
    assert raw.exit_code == 0
    assert raw.output.rstrip("\n") == "\n".join((bundle / PLANTED).read_text(encoding="utf-8").splitlines()[:3])


# -- the detector itself ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        (f"OPENAI_API_KEY={OPENAI}", "openai-key"),
        ("sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789", "anthropic-key"),
        (f"aws_access_key_id = {AWS_ID}", "aws-access-key-id"),
        (f'{{"aws_secret_access_key": "{AWS_SECRET}"}}', "aws-secret-key"),
        (f"git push https://{GITHUB}@github.com/o/r", "github-token"),
        ("github_pat_11ABCDEFG0123456789_abcdefghijABCDEFGHIJ0123456789", "github-token"),
        ("glpat-AbCdEfGhIjKlMnOpQrSt", "gitlab-token"),
        (SLACK, "slack-token"),
        ("sk_live_AbCdEfGhIjKlMnOpQrStUvWx", "stripe-key"),
        ("key=AIzaSyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q", "google-api-key"),
        ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U", "jwt"),
        (f"Authorization: Bearer {BEARER}", "bearer-token"),
        ("Authorization: Basic dXNlcjpwYXNzd29yZDEyMzQ1Ng==", "bearer-token"),
        (f"postgres://admin:{URL_PASSWORD}@db:5432/app", "url-password"),
        ("password: Xk9mQ2vL8nR4tY7w", "secret-value"),
        ('"client_secret":"Zq8Wm3Nx7Lp2Kr5Tv9Yb"', "secret-value"),
        (PRIVATE_KEY, "private-key"),
        (json.dumps({"out": PRIVATE_KEY}), "private-key"),
    ],
)
def test_each_kind_is_found(text: str, kind: str) -> None:
    assert kind in KINDS
    out, n = redact(text)
    assert n >= 1 and f"[REDACTED:{kind}]" in out, out
    assert _leaks(out) == []


@pytest.mark.parametrize(
    "text",
    [
        "api_key=your-api-key-here",
        "max_tokens: 4096",
        "the token budget was 12000 tokens",
        "secret_name=my-config-map-name-prod",
        "passed 264 tests; key findings: none",
        "token=${GITHUB_TOKEN}",
        "task-envvar-prefix-abcdefghijklmnopqrstu",
        "state sha256:4e196a4f94d014b193992633e2fa079f2f6057782fc3a04ce6ed8f4d9c58a08c: current_stage=review",
        "password_file=/etc/app/secrets/password.txt",
        "Bearer of bad news",
        "https://github.com/pallets/click/blob/main/src/click/core.py",
    ],
)
def test_look_alikes_are_kept(text: str) -> None:
    assert redact(text) == (text, 0)


def test_line_breaks_of_a_secret_are_kept() -> None:
    out, n = redact(f"before\n{PRIVATE_KEY}\nafter")
    assert n == 1 and out.count("\n") == (f"before\n{PRIVATE_KEY}\nafter").count("\n")
    assert out.startswith("before\n[REDACTED:private-key]\n") and out.endswith("\nafter")


def test_the_column_form_equals_the_one_by_one_form() -> None:
    values: list[str | None] = [None, "plain", f"k {OPENAI}", "", f"Bearer {BEARER} and {AWS_ID}"]
    out, n = redact_column(values)
    assert out == [None if v is None else redact(v)[0] for v in values]
    assert n == sum(redact(v)[1] for v in values if v is not None) == 3
    assert redact_column(["nothing here", None]) == (None, 0)


def test_hostile_text_is_scanned_in_linear_time() -> None:
    start = time.perf_counter()
    for text in (
        "-----BEGIN RSA PRIVATE KEY-----" + "A" * 1_000_000,
        "sk-" * 300_000,
        "password=" * 100_000,
        "://a:" * 200_000,
        "Bearer " * 150_000,
    ):
        redact(text)
    assert time.perf_counter() - start < 10.0  # generous: linear patterns take well under a second each


def test_demo_text_has_no_redaction() -> None:
    from tests.conftest import DEMO_BUNDLE

    texts = [line for p in sorted(DEMO_BUNDLE.rglob("*.jsonl")) for line in p.read_text(encoding="utf-8").split("\n")]
    assert [t for t in texts if redact(t)[1]] == []


def test_a_reexport_never_copies_rows_made_under_other_redaction_rules(tmp_path: Path) -> None:
    """Per-cell reuse copies a previous IR's rows only when they were made under today's rules."""
    from pipeline.ir.export import export

    bundle = make_bundle(tmp_path)
    _plant(bundle)
    run_dir = tmp_path / "run"
    first = export(bundle, run_dir)
    assert first.redactions > 0
    again = export(bundle, run_dir)
    assert again.reused and again.redactions == first.redactions  # counts carried with the copied rows
    con = duckdb.connect(str(run_dir / "ir.duckdb"))
    con.execute("UPDATE meta SET value = 'made before these rules' WHERE key = 'rows_made_with'")
    con.close()
    third = export(bundle, run_dir)
    assert third.reused == [] and third.redactions == first.redactions  # every cell read (and redacted) again


# -- --no-redact: off only when asked, said loudly, recorded, and never mixed with redacted rows ---------


def _ir_texts(run_dir: Path) -> str:
    con = duckdb.connect(str(run_dir / "ir.duckdb"), read_only=True)
    try:
        rows = con.execute("SELECT coalesce(text, '') || ' ' || coalesce(target, '') FROM events").fetchall()
        return "\n".join(r[0] for r in rows)
    finally:
        con.close()


def _meta(run_dir: Path, key: str) -> str:
    con = duckdb.connect(str(run_dir / "ir.duckdb"), read_only=True)
    try:
        return str(con.execute("SELECT value FROM meta WHERE key = ?", [key]).fetchall()[0][0])
    finally:
        con.close()


def test_no_redact_keeps_secrets_and_redacted_and_unredacted_rows_never_mix(tmp_path: Path) -> None:
    from pipeline.ir.cache import rows_made_with
    from pipeline.ir.export import export

    bundle = make_bundle(tmp_path)
    _plant(bundle)
    run_dir = tmp_path / "run"
    cells = len(export(bundle, run_dir).events_per_cell)
    assert _leaks(_ir_texts(run_dir)) == [] and "redacted" not in read_json(run_dir / "run.json")["export"]

    off = export(bundle, run_dir, redact=False)  # same bytes, other rules: every cell read again, none copied
    assert off.reused == [] and off.redactions == 0 and not off.redacted
    assert "SECRET REDACTION OFF (--no-redact)" in off.summary()
    assert OPENAI in _ir_texts(run_dir) and BEARER in _ir_texts(run_dir)
    assert read_json(run_dir / "run.json")["export"]["redacted"] is False
    assert _meta(run_dir, "rows_made_with") == rows_made_with(redact=False) != rows_made_with()

    again = export(bundle, run_dir, redact=False)  # unredacted rows are reused by an unredacted export
    assert len(again.reused) == cells and OPENAI in _ir_texts(run_dir)

    back = export(bundle, run_dir)  # and never by a redacting one
    assert back.reused == [] and back.redactions == 10 and _leaks(_ir_texts(run_dir)) == []
    assert "redacted" not in read_json(run_dir / "run.json")["export"]
    assert _meta(run_dir, "rows_made_with") == rows_made_with()


def test_run_no_redact_warns_records_and_shows_it_and_a_plain_rerun_redacts_again(
    tmp_path: Path, runs_dir: Path, fake_llm: FakeOpenAI, model_settings: Any
) -> None:
    from pipeline.artifacts.run_info import run_command
    from pipeline.diff import diff_run_dirs

    fake_llm.handler = ledger_handler
    bundle = make_bundle(tmp_path)
    _plant(bundle)
    s = model_settings()
    args = ["run", str(bundle), "--runs-dir", str(runs_dir), "--model", s.model, "--api-base", s.api_base,
            "--mode", "tools"]  # fmt: skip
    res = runner.invoke(app, [*args, "--run-id", "plain"])
    assert res.exit_code == 0, res.output
    assert "--no-redact" not in res.stderr
    fake_llm.reset()
    fake_llm.handler = ledger_handler
    res = runner.invoke(app, [*args, "--run-id", "raw", "--no-redact"])
    assert res.exit_code == 0, res.output
    assert "WARNING: --no-redact: secret redaction is OFF" in res.stderr  # before any work, on stderr
    assert "SECRET REDACTION OFF" in res.stdout  # the export's own line
    raw = runs_dir / "raw"
    assert read_json(raw / "run.json")["export"]["redacted"] is False
    assert any(OPENAI in json.dumps(r) for r in fake_llm.requests)  # the user asked: the prompts hold it
    assert run_command(raw).endswith("--no-redact --resume")  # continuing keeps it off
    st = runner.invoke(app, ["status", str(raw)])
    assert "SECRET REDACTION OFF" in st.stdout
    assert json.loads(runner.invoke(app, ["status", str(raw), "--json"]).stdout)["redaction"] == "off"
    assert runner.invoke(app, ["report", str(raw)]).exit_code == 0
    assert 'id="unredacted"' in (raw / "report" / "index.html").read_text(encoding="utf-8")
    # a diff against the redacted run names it among the inputs
    assert "export.redacted" in [c.path for c in diff_run_dirs(runs_dir / "plain", raw).inputs]
    # a rerun without the flag re-exports redacted (the export's inputs changed): no secret left in the IR
    res = runner.invoke(app, [*args, "--run-id", "raw"])
    assert res.exit_code == 0, res.output
    assert "[export] reused" not in res.stdout and _leaks(_ir_texts(raw)) == []
    assert "redacted" not in read_json(raw / "run.json")["export"]
    assert "redaction" not in json.loads(runner.invoke(app, ["status", str(raw), "--json"]).stdout)


@pytest.mark.parametrize("redacting", [True, False])
def test_a_worker_task_redacts_as_the_export_asks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redacting: bool
) -> None:
    """The worker side of a parallel export gets the switch (through the pool's initargs) and honours it."""
    from pipeline.bundle.manifest import read_manifest
    from pipeline.bundle.request import load_request
    from pipeline.ir import pool
    from pipeline.ir.rows import bundle_display, record_reader

    bundle = make_bundle(tmp_path)
    _plant(bundle)
    cells = [c for c in load_request(bundle).eligible_cells if c.cell_id == "C001"]
    manifest = read_manifest(bundle)
    task = pool.make_task(bundle, cells, manifest, bundle_display(manifest, redacting), "native")
    monkeypatch.setattr(pool, "_WORKER", {"bundle": bundle, "read": record_reader("native"), "redact": redacting})
    status, batch, _counts, _segments, redactions = pool._run_task(task)
    assert status == "ok" and batch is not None
    texts = "\n".join(t for t in batch.column("text").to_pylist() if t)
    assert (OPENAI in texts) is not redacting
    assert redactions == [("C001", 10 if redacting else 0)]
