"""User-defined probes (``--probes DIR``): the file contract, run.json, the ledger, one-line refusals.

Every probe here is written by the test; the Inspect log is the committed fixture written by
inspect_ai (tests/fixtures/foreign/inspect/).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from pipeline import probes
from pipeline.adapters import import_bundle
from pipeline.cli.app import app
from pipeline.core.context import RunContext, RunOptions
from pipeline.core.errors import BadInput
from pipeline.core.settings import ModelSettings
from pipeline.ir.export import export
from pipeline.probes.files import check_against_empty_ir
from pipeline.run.runner import run, stage_inputs, write_run_json
from tests.conftest import DEMO_BUNDLE, DEMO_RECORDINGS

LOG = Path(__file__).parent.parent / "fixtures" / "foreign" / "inspect" / "mockllm-tools.eval"

# A probe a user might write: the run was stopped by a harness limit (evidence: the limit event and
# the tool calls before it), using the shipped probe_events view.
LIMIT_PROBE = """-- type: omission
-- proves_unchanged: false
-- summary: the harness stopped the run at a limit before it answered
WITH stops AS (
    SELECT cell_id, event_id, seq, detail FROM probe_events WHERE kind = 'error' AND detail LIKE '%\\_limit' ESCAPE '\\'
)
SELECT s.cell_id,
       'obligation:answer before the ' || s.detail AS key,
       list(e.event_id ORDER BY e.seq) AS evidence,
       min(e.seq) AS first_seq,
       max(e.seq) AS last_seq,
       printf('stopped by %s after %d tool calls', any_value(s.detail), count(*) - 1) AS explanation
FROM stops s JOIN probe_events e
  ON e.cell_id = s.cell_id AND (e.event_id = s.event_id OR (e.kind = 'tool_call' AND e.seq < s.seq))
GROUP BY s.cell_id, s.detail
"""


@pytest.fixture
def inspect_run(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "src").mkdir()
    shutil.copyfile(LOG, tmp_path / "src" / LOG.name)
    import_bundle("inspect", tmp_path / "src", tmp_path / "bundle")
    return tmp_path / "bundle", export(tmp_path / "bundle", tmp_path / "runs" / "r").run_dir


def _probe_dir(tmp: Path, files: dict[str, str]) -> Path:
    d = tmp / "my-probes"
    d.mkdir(exist_ok=True)
    for name, text in files.items():
        (d / name).write_text(text)
    return d


def test_shipped_probes_meet_the_contract() -> None:
    sql = Path(probes.__file__).parent / "sql"
    assert sorted(p.probe_id for p in probes.PROBES) == sorted(f.stem for f in sql.glob("[!_]*.sql"))
    assert all(p.shipped and p.sha256.startswith("sha256:") and p.summary for p in probes.PROBES)
    check_against_empty_ir(probes.PROBES)  # the same check a user's probe gets


def test_user_probe_runs_beside_the_shipped_and_is_recorded(inspect_run: tuple[Path, Path], tmp_path: Path) -> None:
    bundle, run_dir = inspect_run
    folder = _probe_dir(tmp_path, {"stopped_at_limit.sql": LIMIT_PROBE})
    ctx = RunContext(RunOptions(bundle=bundle, probes_dir=folder), run_dir, log=lambda _m: None)
    summary = probes.stage(ctx)
    assert "stopped_at_limit 2" in summary
    con = duckdb.connect(str(run_dir / "ir.duckdb"), read_only=True)
    try:
        hits = probes.read_probe_hits(con)
        rows = con.execute("SELECT cell_id FROM events WHERE detail = 'message_limit'").fetchall()
        limit_cells = {r[0] for r in rows}
    finally:
        con.close()
    mine = [h for h in hits if h.probe_id == "stopped_at_limit"]
    assert {h.cell_id for h in mine} == limit_cells and len(mine) == 2
    assert all(h.type == "omission" and not h.proves_unchanged and "after 4 tool calls" in h.explanation for h in mine)
    assert any(h.probe_id != "stopped_at_limit" for h in hits)  # the shipped ones ran too
    # run.json lists it with its hash; the probes stage's ledger inputs carry the hash
    write_run_json(ctx, "sha256:x")
    listed = json.loads((run_dir / "run.json").read_text())["inputs"]["probes"]
    sha = probes.user_probes(folder)[0].sha256
    assert listed == [{"probe_id": "stopped_at_limit", "path": str(folder / "stopped_at_limit.sql"), "sha256": sha}]
    before = stage_inputs("probes", ctx, "sha256:x", ("export", "f"))
    (folder / "stopped_at_limit.sql").write_text(LIMIT_PROBE.replace("tool calls", "calls"))
    after = stage_inputs("probes", ctx, "sha256:x", ("export", "f"))
    assert before["probe:stopped_at_limit"] == sha != after["probe:stopped_at_limit"]
    assert {k: v for k, v in before.items() if k != "probe:stopped_at_limit"} == {
        k: v for k, v in after.items() if k != "probe:stopped_at_limit"
    }


_BAD = {
    "no-header": ("nohead.sql", "SELECT 1", "header line(s) missing"),
    "bad-type": ("t.sql", LIMIT_PROBE.replace("-- type: omission", "-- type: vibes"), "type 'vibes'"),
    "two-statements": ("two.sql", LIMIT_PROBE + ";\nDROP TABLE events;", "exactly one SELECT"),
    "not-a-select": ("drop.sql", LIMIT_PROBE.split("WITH")[0] + "DROP TABLE events", "exactly one SELECT"),
    "wrong-columns": ("cols.sql", LIMIT_PROBE.replace(" AS explanation", " AS why"), "returns columns"),
    "unknown-column": ("col.sql", LIMIT_PROBE.replace("e.seq < s.seq", "e.sequence < s.seq"), "sequence"),
    "shipped-id": ("identical_result.sql", LIMIT_PROBE, "already the probe sql/identical_result.sql"),
    "bad-name": ("My Probe.sql", LIMIT_PROBE, "file name must be"),
}


@pytest.mark.parametrize("case", sorted(_BAD))
def test_bad_probe_file_is_one_line_naming_it(case: str, tmp_path: Path) -> None:
    name, text, why = _BAD[case]
    folder = _probe_dir(tmp_path, {name: text})
    runs = tmp_path / "runs"
    out = CliRunner().invoke(app, ["run", str(DEMO_BUNDLE), "--runs-dir", str(runs), "--probes", str(folder)])
    assert out.exit_code == 2, out.output
    lines = [x for x in out.output.splitlines() if x.strip()]
    assert len(lines) == 1 and str(folder / name) in lines[0] and why in lines[0], lines
    assert not runs.exists()  # refused before anything was written


def test_evidence_must_be_events_of_the_cell(inspect_run: tuple[Path, Path], tmp_path: Path) -> None:
    bundle, run_dir = inspect_run
    liar = LIMIT_PROBE.replace("list(e.event_id ORDER BY e.seq)", "['C999-e0001']")
    folder = _probe_dir(tmp_path, {"liar.sql": liar})
    ctx = RunContext(RunOptions(bundle=bundle, probes_dir=folder), run_dir, log=lambda _m: None)
    with pytest.raises(BadInput, match=r"liar\.sql: evidence C999-e0001 is not an event of cell C00\d"):
        probes.stage(ctx)


def test_changed_probe_file_reruns_probes_and_what_follows(demo_copy: Path, tmp_path: Path) -> None:
    # a probe that finds nothing on the demo, so Luna's replayed requests stay the recorded ones
    quiet = LIMIT_PROBE.replace("GROUP BY", "WHERE FALSE GROUP BY")
    folder = _probe_dir(tmp_path, {"quiet.sql": quiet})
    settings = ModelSettings(mode="replay", store=DEMO_RECORDINGS)
    logs: list[str] = []
    opts = RunOptions(bundle=DEMO_BUNDLE, runs_dir=demo_copy.parent, models=settings, probes_dir=folder)
    run(opts, log=logs.append)
    assert any(m.startswith("[export] reused") for m in logs)
    assert any(m.startswith("[probes]") and "reused" not in m for m in logs)
    assert any(m.startswith("[luna]") and "reused" not in m for m in logs)
    logs.clear()
    run(opts, log=logs.append)  # unchanged: everything reused
    assert all("reused" in m for m in logs if m.startswith(("[probes]", "[luna]")))
