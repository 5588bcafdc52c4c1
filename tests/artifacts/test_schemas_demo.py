"""Every artifact of a real run (the demo, replayed through both gates) is valid under its registry model.

So the models in pipeline.artifacts.schemas describe what lunasol writes, not what someone thought it writes.
The model answers are the demo's hand-written fixture recordings.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline import catalog
from pipeline.artifacts import schemas
from pipeline.cli.app import app
from pipeline.core.canonical import read_json
from tests.conftest import DEMO_BUNDLE, DEMO_RECORDINGS, copy_demo

pytestmark = pytest.mark.skipif(
    not any(DEMO_RECORDINGS.glob("*/*.json")), reason="demo recordings absent (run: python fixtures/record_demo.py)"
)


def _ok(args: list[str]) -> str:
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    return res.stdout


@pytest.fixture(scope="module")
def demo_run(demo_gate1: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's demo run taken through both gates on the CLI (a copy)."""
    run = copy_demo(demo_gate1, tmp_path_factory.mktemp("schemas"))
    sl = read_json(run / "weakness-shortlist.json")
    decisions = [a for w in sl["weaknesses"] for a in ("--decision", f"{w['weakness_id']}=confirm")]
    _ok(["confirm", str(run), *decisions, "--by", "tester", "--digest", sl["digest"]])
    _ok(["propose", str(run), "--replay", str(DEMO_RECORDINGS)])
    digest = read_json(run / "handoff.json")["proposals_digest"]
    _ok(["select", str(run), "--proposal", "P-01", "--by", "tester", "--digest", digest])
    return run


def _files(run: Path) -> dict[str, list[Path]]:
    return {
        "run": [run / "run.json"],
        "pattern-groups": [run / "pattern-groups.json"],
        "weakness-shortlist": [run / "weakness-shortlist.json"],
        "proposals": [run / "proposals.yaml"],
        "validation": [run / "validation.json"],
        "gate-receipt": sorted((run / "gates").glob("*.json")),
        "handoff": [run / "handoff.json"],
        "ledger": [run / "ledger.json"],
        "cell-result": sorted((run / "luna").glob("*.json")),
        "manifest": [DEMO_BUNDLE / "manifest.json"],
        "analysis-request": [DEMO_BUNDLE / "analysis-request.json"],
        "recording": sorted(DEMO_RECORDINGS.glob("*/*.json"))[:5],
    }


def test_every_artifact_validates_at_the_current_version(demo_run: Path) -> None:
    seen = set()
    for name, paths in _files(demo_run).items():
        assert paths, f"the demo run wrote no {name}"
        for path in paths:
            art = catalog.get(name)
            _, found = schemas.load_document(path, name, art.kind)
            assert found == art.version, f"{path} was written at v{found}"
            schemas.load_artifact(path, name, art.model, art.kind)
        seen.add(name)
    for name, file in (("patterns", "patterns.jsonl"), ("calls", "calls.jsonl")):
        rows = [json.loads(line) for line in (demo_run / file).read_text(encoding="utf-8").splitlines()]
        assert rows and all(r.get("schema_version") == catalog.get(name).version for r in rows), file
        model = catalog.get(name).model
        for row in rows:
            model.model_validate(row)
        seen.add(name)
    # block-receipt: the demo does not block; a model-level check keeps the registry honest.
    # followup: written on the child run (fixtures/bundles/h5-demo); tests/followup/test_followup_demo.py
    # writes it on the demo pair and reads it back through load_artifact at the current version.
    # manifest-sources: written by an import from object storage; tests/objstore reads it back likewise.
    assert seen | {"block-receipt", "followup", "manifest-sources"} == set(catalog.REGISTRY)


def test_block_receipt_as_written_validates(tmp_path: Path) -> None:
    from pipeline.core.errors import Blocked
    from pipeline.state.blocking import write_block_receipt

    exc = Blocked("budget exceeded", reason="user_stop", unblock="lunasol run B --budget-usd 2")
    path = write_block_receipt(tmp_path, exc, stage="luna", unblock=exc.unblock, command="lunasol run B")
    write_block_receipt(tmp_path, exc, stage="luna", unblock=exc.unblock, command="lunasol run B")  # repeats
    receipt = schemas.load_artifact(path, "block-receipt", catalog.get("block-receipt").model)
    assert receipt.model_dump()["repeats"] == 2
