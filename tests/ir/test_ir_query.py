"""lunasol query: read-only SQL, table or JSON, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.bundle.synth import write_bundle
from pipeline.cli.app import app
from pipeline.core.errors import BadInput
from pipeline.ir.export import export
from pipeline.ir.query import query

runner = CliRunner()


@pytest.fixture
def run_dir(tmp_path: Path, runs_dir: Path) -> Path:
    bundle = tmp_path / "bundle"
    write_bundle(bundle, cells=2, events_per_cell=12, excluded=1)
    export(bundle, runs_dir / "r")
    return runs_dir / "r"


def test_query_library(run_dir: Path) -> None:
    result = query(run_dir, "SELECT cell_id, count(*) AS n FROM events GROUP BY 1 ORDER BY 1")
    assert result.columns == ["cell_id", "n"]
    assert [r[0] for r in result.rows] == ["C001", "C002"]
    assert result.records()[0]["n"] == result.rows[0][1]


def test_query_cli_table_and_json(run_dir: Path) -> None:
    result = runner.invoke(app, ["query", str(run_dir), "SELECT cell_id, status FROM coverage ORDER BY 1"])
    assert result.exit_code == 0, result.output
    assert "C003" in result.output and "excluded" in result.output
    assert "3 rows" in result.output
    result = runner.invoke(app, ["query", str(run_dir), "SELECT cell_id, events FROM coverage ORDER BY 1", "--json"])
    assert result.exit_code == 0
    rows = json.loads(result.stdout)
    assert rows[2] == {"cell_id": "C003", "events": 0}


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO meta VALUES ('a', 'b')",
        "DELETE FROM events",
        "WITH x AS (SELECT 1) INSERT INTO meta SELECT 'k', 'v' FROM x",
        "  -- comment\n DROP TABLE events",
        "ATTACH '/tmp/other.duckdb' AS o",
        "COPY events TO '/tmp/leak.csv'",
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELEKT 1",
        "SELECT no_such_column FROM events",
    ],
)
def test_query_refuses_writes_and_errors_cleanly(run_dir: Path, sql: str) -> None:
    before = (run_dir / "ir.duckdb").read_bytes()
    result = runner.invoke(app, ["query", str(run_dir), sql])
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1
    assert result.output.startswith("lunasol: ")
    assert (run_dir / "ir.duckdb").read_bytes() == before
    with pytest.raises(BadInput):
        query(run_dir, sql)


def test_read_only_connection_is_the_real_guard(run_dir: Path) -> None:
    # A statement the allow-list lets through (WITH) still cannot write.
    with pytest.raises(BadInput, match="read-only"):
        query(run_dir, "WITH x AS (SELECT 1) INSERT INTO meta SELECT 'k', 'v' FROM x")


def test_query_missing_ir(tmp_path: Path) -> None:
    result = runner.invoke(app, ["query", str(tmp_path), "SELECT 1"])
    assert result.exit_code == 2


@pytest.mark.parametrize("verb", [["bundle", "freeze"], ["bundle", "verify"], ["export"], ["show-ref"], ["query"]])
def test_verbs_have_help(verb: list[str]) -> None:
    result = runner.invoke(app, [*verb, "--help"])
    assert result.exit_code == 0
    assert "Usage" in result.output
