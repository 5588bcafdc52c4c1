"""``lunasol mcp`` spoken to by the official SDK's own client over stdio, on the demo after gate 2.

The server is spawned as a user's MCP client would spawn it (``lunasol mcp PARENT CHILD``): the
parent is the H0 demo carried through both gates (P-02 selected), the child the H5 demo with its
follow-up. A second session serves a run exported with ``--no-redact`` from a bundle with planted
secrets: none of them comes back through any tool.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import duckdb
import pytest
import yaml
from mcp import Client, StdioServerParameters
from typer.testing import CliRunner

from pipeline.agent import tools
from pipeline.agent.bounds import LOG_FENCE, MAX_CONTEXT_LINES
from pipeline.bundle.manifest import freeze, read_manifest
from pipeline.cli.app import app
from pipeline.core.canonical import read_json
from pipeline.ir.export import export_bundle
from pipeline.models.prompts import fenced
from tests.conftest import DEMO_BUNDLE
from tests.followup.test_followup_demo import demo_pair  # noqa: F401  (the H0 -> H5 pair, module scope)

LUNASOL = Path(sys.executable).parent / "lunasol"
TOOLS = {
    "run_state",
    "get_proposal",
    "get_weakness",
    "get_pattern_group",
    "show_ref",
    "query",
    "weakness_cells",
    "get_followup",
}
OPENAI = "sk-proj-Ab3dEf9hIj2lMn5pQr8tUv1xYz40123456789abcd"
GITHUB = "ghp_R2d2C3poL8kE9yW1qZ7xV5bN3mA6sD4fG0hJ"
PLANTED_FILE = "cells/C004/sessions/08-review-reviewer.jsonl"

pytestmark = pytest.mark.skipif(not LUNASOL.is_file(), reason=f"no lunasol console script at {LUNASOL}")


@pytest.fixture(scope="module")
def served(demo_pair: dict[str, Path]) -> dict[str, Path]:  # noqa: F811
    """The pair with the child's follow-up written (replayed judge), as a user would have it."""
    res = CliRunner().invoke(
        app, ["followup", str(demo_pair["parent"]), "--proposal", "P-02", "--child", str(demo_pair["child"])]
    )
    assert res.exit_code == 0, res.output
    return demo_pair


def _params(*runs: Path, cwd: Path) -> StdioServerParameters:
    return StdioServerParameters(command=str(LUNASOL), args=["mcp", *map(str, runs)], cwd=str(cwd))


def _text(result: Any) -> str:
    return "\n".join(c.text for c in result.content)


async def test_an_sdk_client_reads_the_selected_card_follows_a_ref_and_queries(
    served: dict[str, Path], tmp_path: Path
) -> None:
    parent, child = served["parent"], served["child"]
    t0 = time.perf_counter()
    async with Client(_params(parent, child, cwd=tmp_path)) as client:
        startup = time.perf_counter() - t0
        listed = (await client.list_tools()).tools
        assert {t.name for t in listed} == TOOLS
        for t in listed:
            assert t.description and len(t.description) > 80, t.name  # something a model can act on
            assert t.input_schema["type"] == "object" and t.output_schema is not None
            assert t.annotations is not None and t.annotations.read_only_hint is True
            assert "notes" in t.output_schema["properties"]  # every answer says where it was cut

        state = await client.call_tool("run_state", {})
        assert not state.is_error
        s = state.structured_content
        assert s["run_id"] == parent.name and s["served_runs"] == [parent.name, child.name]
        assert (s["gate1"], s["gate2"], s["selected_proposal"]) == ("confirmed", "selected", "P-02")
        assert "not an authorisation" in s["selection_meaning"] and s["followup_verdict"] == "rejected"

        # the selected card, whole, with its source weakness and the conditions it will be judged on
        card = (await client.call_tool("get_proposal", {})).structured_content
        cards_on_disk = yaml.safe_load((parent / "proposals.yaml").read_text(encoding="utf-8"))["proposals"]
        on_disk = next(c for c in cards_on_disk if c["proposal_id"] == "P-02")
        assert card["proposal_id"] == "P-02" and card["selected"] is True
        assert card["rejection_conditions"] == on_disk["rejection_conditions"]
        sw = card["source_weakness"]
        assert sw["weakness_id"] == "W-01" and sw["gate1_decision"] == "confirm"
        assert sw["counterfactual_prediction"] and {i["cell"] for i in sw["counter_evidence"]["items"]} == {
            "C013",
            "C017",
        }

        # one of its refs, followed to the raw line: the bundle's own bytes, hash-checked
        event = sw["first_divergence"]["event_refs"][0]
        ref = await client.call_tool("show_ref", {"ref": event, "context": 1})
        r = ref.structured_content
        path, lines = r["ref"].split("#L")
        start = int(lines.split("-")[0])
        raw = (DEMO_BUNDLE / path).read_text(encoding="utf-8").split("\n")
        text = _text(ref)
        assert f">{start:>6}  {raw[start - 1]}" in text and f" {start - 1:>6}  {raw[start - 2]}" in text
        assert read_manifest(DEMO_BUNDLE).get(path).sha256 in text
        assert any(raw[start - 1] in body for body in fenced(text, LOG_FENCE))

        # a read-only query, checked against DuckDB itself
        q = await client.call_tool("query", {"sql": "SELECT count(*) AS n FROM events"})
        con = duckdb.connect(str(parent / "ir.duckdb"), read_only=True)
        try:
            n_events = con.execute("SELECT count(*) FROM events").fetchone()[0]  # type: ignore[index]
        finally:
            con.close()
        assert q.structured_content["rows"] == [[n_events]] and not q.structured_content["more"]

        # refused, one clear line each: writes, a second statement, a ref outside the bundle
        for sql in ("DELETE FROM events", "COPY events TO '/tmp/x.csv'", "SELECT 1; DROP TABLE events"):
            bad = await client.call_tool("query", {"sql": sql})
            assert bad.is_error and "\n" not in _text(bad), sql
            assert "read-only" in _text(bad) or "one statement" in _text(bad)
        outside = await client.call_tool("show_ref", {"ref": "../../../etc/passwd#L1-L1"})
        assert outside.is_error and "escapes the bundle" in _text(outside)
        unknown = await client.call_tool("get_weakness", {"weakness_id": "W-99"})
        assert unknown.is_error and "W-01" in _text(unknown)  # says what exists

        # bounds: every cut is said, with how to ask for more
        page = (
            await client.call_tool("query", {"sql": "SELECT event_id FROM events", "max_rows": 5})
        ).structured_content
        assert len(page["rows"]) == 5 and page["more"] and any("OFFSET 5" in n for n in page["notes"])
        wide = (await client.call_tool("show_ref", {"ref": event, "context": 50})).structured_content
        assert any(f"context cut at {MAX_CONTEXT_LINES}" in n for n in wide["notes"])
        big = (
            await client.call_tool("query", {"sql": "SELECT repeat('x', 100000) AS t", "max_rows": 1})
        ).structured_content
        assert len(big["rows"][0][0]) < 13_000 and any("substr" in n for n in big["notes"])

        # the rest of the tools
        w = (await client.call_tool("get_weakness", {"weakness_id": "W-01"})).structured_content
        assert w["weakness"]["statement"] == sw["statement"] and w["proposals"] == ["P-01", "P-02"]
        group_id = w["weakness"]["support"]["pattern_groups"][0]
        g = (await client.call_tool("get_pattern_group", {"group_id": group_id})).structured_content
        assert g["group_id"] == group_id and g["occurrences_total"] == len(g["occurrences"]) > 0
        cells = (await client.call_tool("weakness_cells", {"weakness_id": "W-01"})).structured_content
        assert {c["cell_id"] for c in cells["supporting"]} >= {"C004", "C015", "C018"}
        assert {c["cell_id"] for c in cells["contradicting"]} == {"C013", "C017"}
        named = len(cells["supporting"]) + len(cells["contradicting"]) + len(cells["neither"])
        assert named == cells["eligible_cells"] == 24
        fu = (await client.call_tool("get_followup", {})).structured_content
        assert fu["found"] and fu["verdict"] == "rejected" and fu["child_run"] == child.name
        assert [c["status"] for c in fu["conditions"]][3] == "triggered"
        child_state = (await client.call_tool("run_state", {"run": child.name})).structured_content
        assert child_state["run_id"] == child.name
        other = await client.call_tool("run_state", {"run": "nope"})
        assert other.is_error and parent.name in _text(other)

        # resources: each card and the summary
        uris = {str(x.uri) for x in (await client.list_resources()).resources}
        assert f"lunasol://runs/{parent.name}/cards/P-02" in uris and f"lunasol://runs/{parent.name}/summary" in uris
        summary = (await client.read_resource(f"lunasol://runs/{parent.name}/summary")).contents[0].text
        assert "**P-02** from W-01 (accepted, SELECTED)" in summary and "verdict: rejected" in summary
        any_card = await client.read_resource(f"lunasol://runs/{child.name}/cards/W-01")
        assert json.loads(any_card.contents[0].text)["weakness_id"] == "W-01"
    print(f"\nlunasol mcp: session ready in {startup:.2f} s")  # the closing note's start-up figure
    assert startup < 30


def test_the_server_loads_no_model_client() -> None:
    code = (
        "import sys, pipeline.agent.server, pipeline.cli.agent; "
        "print([m for m in ('litellm', 'instructor', 'openai', 'scipy') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.fixture(scope="module")
def planted_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo bundle with secrets planted in a log line, exported WITHOUT redaction (the IR keeps them)."""
    root = tmp_path_factory.mktemp("planted")
    bundle = root / "bundle"
    shutil.copytree(DEMO_BUNDLE, bundle)
    line = {
        "content": f"use my key {OPENAI} and push with {GITHUB}",
        "role": "reviewer",
        "session": "h0-bat-sanitize-r1/s08",
        "ts": "2026-08-08T10:28:11.000Z",
        "type": "message",
    }
    with (bundle / PLANTED_FILE).open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(line) + "\n")
    freeze(bundle)
    report = export_bundle(bundle, runs_dir=root / "runs", redact=False)
    run_dir = Path(report.ir_path).parent
    assert (run_dir / "run.json").is_file() and read_json(run_dir / "run.json")["export"]["redacted"] is False
    return run_dir


async def test_a_planted_secret_never_comes_back(planted_run: Path, tmp_path: Path) -> None:
    con = duckdb.connect(str(planted_run / "ir.duckdb"), read_only=True)
    try:
        (event_id, start) = con.execute(
            "SELECT event_id, line_start FROM events WHERE text LIKE ? ORDER BY seq LIMIT 1", [f"%{OPENAI}%"]
        ).fetchone()  # type: ignore[misc]
    finally:
        con.close()
    calls = [
        ("show_ref", {"ref": f"{PLANTED_FILE}#L{start}-L{start}", "context": 2}),
        ("show_ref", {"ref": event_id}),
        ("query", {"sql": f"SELECT text FROM events WHERE event_id = '{event_id}'"}),
        ("query", {"sql": "SELECT event_id, text FROM events WHERE text LIKE '%sk-proj%' OR text LIKE '%ghp_%'"}),
    ]
    async with Client(_params(planted_run, cwd=tmp_path)) as client:
        for name, args in calls:
            res = await client.call_tool(name, args)
            assert not res.is_error, _text(res)
            seen = _text(res) + json.dumps(res.structured_content)
            assert OPENAI not in seen and GITHUB not in seen, name
            assert "[REDACTED:openai-key]" in seen and "[REDACTED:github-token]" in seen, (name, seen[:500])
        state = (await client.call_tool("run_state", {})).structured_content
        assert state["redaction"] == "off"  # said, not hidden


def test_a_runaway_query_is_stopped(planted_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.core.errors import BadInput

    monkeypatch.setattr(tools, "QUERY_SECONDS", 0.3)
    runs = tools.Runs([planted_run])
    with pytest.raises(BadInput, match="stopped after"):
        tools.query(runs, "SELECT sum(a.range * b.range) FROM range(200000) a, range(200000) b")


def test_bad_runs_are_one_line_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    for bad in ("missing", "empty"):
        res = CliRunner().invoke(app, ["mcp", str(tmp_path / bad)])
        assert res.exit_code == 2 and res.output.count("\n") == 1, res.output
        assert res.output.startswith("lunasol: ") and bad in res.output
