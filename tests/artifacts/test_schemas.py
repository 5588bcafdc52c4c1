"""Schema versions (convention 4): registry, numbered migrations, committed samples, exported JSON Schemas.

The samples under tests/samples/ are files as lunasol wrote them (v1, from the demo run), as a
lunasol before ``schema_version`` existed would have written them (v0: the same minus the field;
the v0 shortlist sealed without it), and as a future lunasol might (newer: refused).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline import catalog
from pipeline.artifacts import migrations, schemas
from pipeline.artifacts.versions import VERSIONS
from pipeline.cli.app import app
from pipeline.core.canonical import pretty_json, read_json
from pipeline.core.errors import BadInput
from pipeline.sol.shortlist import SHORTLIST_SCHEMA_VERSION, read_shortlist
from pipeline.state import handoff
from pipeline.state.ledger import LEDGER_SCHEMA_VERSION, Ledger

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = Path(__file__).resolve().parents[1] / "samples"
DOCS_SCHEMAS = ROOT / "docs" / "schemas"
REGEN = "lunasol schema -o docs/schemas"


# -- the registry and its migrations ------------------------------------------------------------


def test_exported_schemas_equal_the_models() -> None:
    """docs/schemas/*.json are exactly what the models export today (a model change needs a re-export)."""
    expected = {f"{a.name}.json": pretty_json(a.json_schema()) for a in catalog.REGISTRY.values()}
    on_disk = {p.name: p.read_text(encoding="utf-8") for p in DOCS_SCHEMAS.glob("*.json")}
    stale = sorted(set(on_disk) - set(expected))
    assert not stale, f"docs/schemas has schemas of no artifact: {stale}; delete them and run: {REGEN}"
    for name, text in expected.items():
        assert on_disk.get(name) == text, f"docs/schemas/{name} differs from its model; run: {REGEN}"


def test_versions_come_from_the_models() -> None:
    """One version source per artifact: every model's ``schema_version`` default is VERSIONS[name]."""
    from pipeline.gates.gate1 import RECEIPT_SCHEMA_VERSION
    from pipeline.state.handoff import HANDOFF_SCHEMA_VERSION

    assert catalog.get("handoff").version == HANDOFF_SCHEMA_VERSION
    assert catalog.get("ledger").version == LEDGER_SCHEMA_VERSION
    assert catalog.get("weakness-shortlist").version == SHORTLIST_SCHEMA_VERSION
    assert catalog.get("gate-receipt").version == RECEIPT_SCHEMA_VERSION
    assert set(catalog.REGISTRY) | {"ir"} == set(VERSIONS), "every versioned artifact is in the catalog"
    for art in catalog.REGISTRY.values():
        assert art.model.model_fields["schema_version"].default == VERSIONS[art.name], art.name
        assert art.json_schema()["x-lunasol"]["schema_version"] == art.version


def test_every_artifact_has_a_migration_chain_from_v0() -> None:
    numbers = [m.number for m in migrations.MIGRATIONS]
    assert numbers == sorted(set(numbers)), "migration numbers are unique and in order"
    for m in migrations.MIGRATIONS:
        assert m.artifact in catalog.REGISTRY, f"migration {m.number} names unknown artifact {m.artifact}"
        assert m.to_version == m.from_version + 1, m.number
    for name, art in catalog.REGISTRY.items():
        steps = [(m.from_version, m.to_version) for m in schemas.migrations_for(name)]
        assert steps == [(v, v + 1) for v in range(art.version)], f"{name}: chain {steps} does not reach v{art.version}"


def test_version_field_checks() -> None:
    assert schemas.version_of({}, "x") == 0
    for bad in ("1", 1.0, True, -1, None):
        with pytest.raises(BadInput, match="whole number"):
            schemas.version_of({"schema_version": bad}, "x.json")
    with pytest.raises(BadInput, match="not a JSON object"):
        schemas.version_of([1], "x.json")
    with pytest.raises(BadInput, match="unknown artifact 'nope'; known: manifest"):
        catalog.get("nope")
    with pytest.raises(BadInput, match="unknown artifact 'nope'; known: manifest"):
        schemas.current_version("nope")


def test_missing_migration_is_named_as_a_lunasol_bug(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(schemas, "migrations_for", lambda name: [])
    with pytest.raises(BadInput, match="no migration from 0 to 1 for handoff"):
        schemas.upgrade({"run_id": "r"}, "handoff", "h.json")


def test_jsonl_rows_upgrade_one_by_one() -> None:
    rows = [{"role": "luna"}, {"schema_version": 1, "role": "sol"}]
    assert [r["schema_version"] for r in schemas.upgrade_rows(rows, "calls", "calls.jsonl")] == [1, 1]
    with pytest.raises(BadInput, match=r"calls.jsonl row 2 has schema_version 5, newer"):
        schemas.upgrade_rows([{}, {"schema_version": 5}], "calls", "calls.jsonl")


# -- committed samples: old upgraded, current unchanged, newer refused ---------------------------


@pytest.mark.parametrize("name", ["handoff", "weakness-shortlist", "run", "ledger"])
def test_samples_old_is_upgraded_current_unchanged(name: str) -> None:
    version = VERSIONS[name]
    v0, now = SAMPLES / f"{name}.v0.json", SAMPLES / f"{name}.v{version}.json"
    assert "schema_version" not in read_json(v0)
    current, found = schemas.load_document(now, name)
    assert found == version and current == read_json(now)  # the current version loads unchanged
    upgraded, found0 = schemas.load_document(v0, name)
    assert found0 == 0 and upgraded["schema_version"] == version
    model = catalog.get(name).model
    assert model.model_validate(upgraded)  # the upgraded file is a valid current artifact
    if name != "weakness-shortlist":  # the shortlist's sealed digest legitimately differs (see below)
        assert upgraded == current


@pytest.mark.parametrize(("sample", "name"), [("handoff.v2-newer.json", "handoff"), ("run.v7-newer.json", "run")])
def test_samples_newer_is_refused(sample: str, name: str) -> None:
    version = read_json(SAMPLES / sample)["schema_version"]
    with pytest.raises(BadInput) as err:
        schemas.load_artifact(SAMPLES / sample, name, catalog.get(name).model)
    msg = err.value.one_line()
    assert f"has schema_version {version}, newer than this lunasol reads (up to {VERSIONS[name]}): upgrade" in msg
    assert "\n" not in msg


def _run_dir(tmp_path: Path, **files: str) -> Path:
    run = tmp_path / "r1"
    run.mkdir()
    shutil.copy(SAMPLES / "run.v1.json", run / "run.json")
    for target, sample in files.items():
        shutil.copy(SAMPLES / sample, run / target.replace("_", "-").replace("-json", ".json"))
    return run


def test_readers_take_v0_files(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, handoff_json="handoff.v0.json", ledger_json="ledger.v0.json")
    h = handoff.load(run)
    assert h.schema_version == 1 and h.revision == read_json(SAMPLES / "handoff.v1.json")["revision"]
    ledger = Ledger(run)
    assert ledger.data.schema_version == 1 and "luna/C001" in ledger.data.entries
    # the first write after an upgrade writes the current version (the file becomes v1)
    handoff.update(run, {"proposalSelection": "redo"}, "test")
    assert read_json(run / "handoff.json")["schema_version"] == 1


def test_v0_shortlist_keeps_the_digest_it_was_sealed_with(tmp_path: Path) -> None:
    v0 = read_shortlist(SAMPLES / "weakness-shortlist.v0.json")
    assert v0.schema_version == VERSIONS["weakness-shortlist"]
    assert v0.digest == read_json(SAMPLES / "weakness-shortlist.v0.json")["digest"]
    v1 = read_shortlist(SAMPLES / "weakness-shortlist.v1.json")
    assert v0.weaknesses == v1.weaknesses and v1.plan is None  # v1 had no plan; upgraded, it has none
    v2 = read_shortlist(SAMPLES / "weakness-shortlist.v2.json")
    assert v2.weaknesses == v1.weaknesses and v2.plan is not None and v2.plan.mode == "single"
    assert not any(c.reused for c in v2.plan.calls)  # v2 had no reused: every call was made
    v3 = read_shortlist(SAMPLES / "weakness-shortlist.v3.json")
    assert v3.weaknesses == v2.weaknesses and v3.plan is not None and v3.plan.calls[0].reused is False
    assert v3.digest == read_json(SAMPLES / "weakness-shortlist.v3.json")["digest"]  # sealed before v4: kept
    v4 = read_shortlist(SAMPLES / "weakness-shortlist.v4.json")
    assert v4.weaknesses == v3.weaknesses and v4.digest != v3.digest
    assert v4.digest == read_json(SAMPLES / "weakness-shortlist.v4.json")["digest"]  # sealed before v5: kept
    v5 = read_shortlist(SAMPLES / "weakness-shortlist.v5.json")
    assert v5.weaknesses == v4.weaknesses and v5.pilot is None and v5.digest == v5.content_digest()
    assert v4.pilot is None  # a v4 shortlist was made on every eligible cell
    # a v0 file edited by hand is still caught
    edited = read_json(SAMPLES / "weakness-shortlist.v0.json")
    edited["run_id"] = "someone-else"
    (tmp_path / "s.json").write_text(json.dumps(edited), encoding="utf-8")
    with pytest.raises(BadInput, match="does not match its digest"):
        read_shortlist(tmp_path / "s.json")


def test_cli_refuses_a_run_with_a_newer_handoff(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, handoff_json="handoff.v2-newer.json")
    res = CliRunner().invoke(app, ["status", str(run)])
    assert res.exit_code == 2, res.output
    err = res.stderr.strip()
    assert err.count("\n") == 0 and "Traceback" not in res.output
    assert "handoff.json has schema_version 2, newer than this lunasol reads (up to 1): upgrade lunasol" in err


def test_cli_status_reads_a_v0_run(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, handoff_json="handoff.v0.json", ledger_json="ledger.v0.json")
    res = CliRunner().invoke(app, ["status", str(run), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["handoff"]["schema_version"] == 1


# -- the IR ---------------------------------------------------------------------------------------


def test_ir_versions(tmp_path: Path) -> None:
    from pipeline.ir.schema import IR_SCHEMA_VERSION
    from pipeline.ir.store import check_ir_version

    check_ir_version(str(IR_SCHEMA_VERSION), tmp_path / "ir.duckdb")
    with pytest.raises(BadInput, match=r"newer than this lunasol reads \(1\): upgrade lunasol"):
        check_ir_version(str(IR_SCHEMA_VERSION + 1), tmp_path / "ir.duckdb")
    with pytest.raises(BadInput, match="rebuilt from the bundle, not migrated: re-export with lunasol run B"):
        check_ir_version(None, tmp_path / "ir.duckdb", rerun=lambda: "lunasol run B --resume")


# -- the CLI verb ---------------------------------------------------------------------------------


def test_schema_verb(tmp_path: Path) -> None:
    runner = CliRunner()
    one = runner.invoke(app, ["schema", "handoff"])
    assert one.exit_code == 0
    assert json.loads(one.stdout) == json.loads(pretty_json(catalog.get("handoff").json_schema()))
    listing = runner.invoke(app, ["schema"])
    assert listing.exit_code == 0 and all(n in listing.stdout for n in catalog.REGISTRY)
    out = runner.invoke(app, ["schema", "-o", str(tmp_path / "s")])
    assert out.exit_code == 0
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == sorted(f"{n}.json" for n in catalog.REGISTRY)
    bad = runner.invoke(app, ["schema", "nope"])
    assert bad.exit_code == 2 and "unknown artifact 'nope'" in bad.stderr
    assert runner.invoke(app, ["schema", "--help"]).exit_code == 0


def test_readers_refuse_newer_rows_and_receipts(tmp_path: Path) -> None:
    from pipeline.models.calllog import read_calls
    from pipeline.state.blocking import read_block_receipt

    (tmp_path / "calls.jsonl").write_text('{"role": "luna"}\n{"schema_version": 1, "role": "sol"}\n')
    assert [r["schema_version"] for r in read_calls(tmp_path)] == [1, 1]
    (tmp_path / "calls.jsonl").write_text('{"schema_version": 4, "role": "luna"}\n')
    with pytest.raises(BadInput, match="row 1 has schema_version 4, newer"):
        read_calls(tmp_path)
    (tmp_path / "block-receipt.json").write_text('{"stage": "luna"}')
    assert read_block_receipt(tmp_path) == {"stage": "luna", "schema_version": 1}
    (tmp_path / "block-receipt.json").write_text('{"schema_version": 2, "stage": "luna"}')
    with pytest.raises(BadInput, match=r"block-receipt\.json has schema_version 2, newer"):
        read_block_receipt(tmp_path)


def test_run_json_writer_never_rewrites_a_newer_run_json(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from pipeline.run.runner import write_run_json

    run = tmp_path / "r"
    run.mkdir()
    shutil.copy(SAMPLES / "run.v7-newer.json", run / "run.json")
    before = (run / "run.json").read_bytes()
    ctx = SimpleNamespace(run_dir=run, bundle=tmp_path, options=None)
    with pytest.raises(BadInput, match="schema_version 7, newer"):
        write_run_json(ctx, "sha256:" + "0" * 64)  # type: ignore[arg-type]
    assert (run / "run.json").read_bytes() == before


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("99", r"has IR schema 99, newer than this lunasol reads \(1\): upgrade lunasol"),
        (None, r"has IR schema 0, older than this lunasol's \(1\); .* re-export with lunasol run \S+ --run-id r1 "),
    ],
)
def test_query_refuses_an_ir_of_another_schema(tmp_path: Path, version: str | None, expected: str) -> None:
    import duckdb

    run = _run_dir(tmp_path)
    con = duckdb.connect(str(run / "ir.duckdb"))
    con.execute("CREATE TABLE meta (key VARCHAR, value VARCHAR)")
    if version is not None:
        con.execute("INSERT INTO meta VALUES ('ir_schema_version', ?)", [version])
    con.close()
    res = CliRunner().invoke(app, ["query", str(run), "SELECT 1"])
    assert res.exit_code == 2, res.output
    assert res.stderr.count("\n") == 1
    assert re.search(expected, res.stderr), res.stderr
    from pipeline.ir.store import open_ir

    with pytest.raises(BadInput, match=expected):
        open_ir(run)


def test_followup_v1_upgrades_to_v2_without_a_judge() -> None:
    """A counts-only v1 follow-up reads as v2: settled conditions decided by the count, the rest by a human."""
    from pipeline.followup.schema import Followup

    v1, v2 = read_json(SAMPLES / "followup.v1.json"), read_json(SAMPLES / "followup.v2.json")
    assert v1["schema_version"] == 1 and VERSIONS["followup"] == 2
    upgraded, found = schemas.load_document(SAMPLES / "followup.v1.json", "followup")
    assert found == 1 and upgraded["schema_version"] == 2
    doc = Followup.model_validate(upgraded)
    assert doc.judge is None and doc.conflicts == [] and doc.digest == v1["digest"]  # the sealed digest is kept
    assert [c.decided_by for c in doc.conditions] == [
        "human" if c["status"] == "undetermined" else "count" for c in v1["conditions"]
    ]
    current, found2 = schemas.load_document(SAMPLES / "followup.v2.json", "followup")
    assert found2 == 2 and current == v2 and Followup.model_validate(current).judge is not None
