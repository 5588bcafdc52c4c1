"""pipeline.api: the run's tables as Arrow, the documented example, and `lunasol export-tables`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from pipeline import api
from pipeline.cli.app import app
from pipeline.core.errors import BadInput

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def test_tables_match_the_artifacts(demo_gate1: Path) -> None:
    run = api.load_run(demo_gate1)
    tables = run.tables()
    assert set(tables) == set(api.TABLES)
    shortlist = json.loads((demo_gate1 / "weakness-shortlist.json").read_text())
    w = tables["weaknesses"].to_pylist()
    assert [r["weakness_id"] for r in w] == [x["weakness_id"] for x in shortlist["weaknesses"]]
    assert json.loads(w[0]["support"]) == shortlist["weaknesses"][0]["support"]  # nested fields as JSON
    n_patterns = sum(1 for line in (demo_gate1 / "patterns.jsonl").read_text().splitlines() if line.strip())
    assert tables["patterns"].num_rows == n_patterns
    assert tables["events"].num_rows > 1000 and "source_path" in tables["events"].column_names
    assert set(tables["cells"].column("outcome").to_pylist()) == {"failed", "successful", "excluded"}
    assert tables["proposals"].num_rows == 0  # the demo run is at gate 1: an empty table, not an error
    with pytest.raises(BadInput, match="no table"):
        run.table("nope")


def test_the_documented_example_runs(demo_gate1: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (block,) = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    exec(compile(block, str(DOC), "exec"), {"RUN": str(demo_gate1)})
    assert "W-01" in capsys.readouterr().out


def test_export_tables_cli(demo_gate1: Path, tmp_path: Path) -> None:
    out = tmp_path / "tables"
    res = CliRunner().invoke(app, ["export-tables", str(demo_gate1), "--parquet", str(out), "--json"])
    assert res.exit_code == 0, res.output
    written = json.loads(res.stdout)["tables"]
    assert set(written) == set(api.TABLES)
    assert pq.read_table(out / "weaknesses.parquet").num_rows == api.load_run(demo_gate1).table("weaknesses").num_rows
    assert not list(out.glob("*.tmp"))
    bad = CliRunner().invoke(app, ["export-tables", str(tmp_path / "nope"), "--parquet", str(out)])
    assert bad.exit_code == 2


def test_export_tables_streams_ir_tables_in_row_groups(
    demo_gate1: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # At 10,000 cells the events are 1.8 GB of Arrow: they are written a row group at a time,
    # never held whole, and read back as the same table.
    monkeypatch.setattr(api, "PARQUET_ROWS", 1000)
    api.export_tables(demo_gate1, tmp_path / "t")
    run = api.load_run(demo_gate1)
    events = pq.ParquetFile(tmp_path / "t" / "events.parquet")
    whole = run.table("events")
    assert whole.num_rows > 1000 and events.metadata.num_row_groups == -(-whole.num_rows // 1000)
    assert events.read().equals(whole)
    for name in ("cells", "patterns"):
        assert pq.read_table(tmp_path / "t" / f"{name}.parquet").equals(run.table(name))
