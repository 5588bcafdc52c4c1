"""The main job live on real foreign logs (../shared/data): every ref it writes resolves to raw bytes.

Inspect ``.eval`` zips, Who&When JSON documents and an OpenHands ``output.jsonl`` (one run per line)
put their events inside JSON elements: an event's ref carries a JSON pointer. The Coordinator's
occurrence refs, Sol's checks and the report must keep it, or the ref names a whole file, or
bytes no one can read (a zip). Live through the local server with the scripted model.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import duckdb

from pipeline.adapters import import_bundle
from pipeline.core.context import RunOptions
from pipeline.core.settings import ModelSettings
from pipeline.diff.match import cited_ids
from pipeline.ir.refs import read_refs, ref_of
from pipeline.report.build import render_report
from pipeline.run.runner import run
from pipeline.sol.checks import load_index
from pipeline.testing.openai_server import FakeOpenAI
from pipeline.testing.scripted import ScriptedModel
from tests.adapters.adapter_helpers import SHARED_DATA, need_shared_data

# Runs the scripted model finds patterns in (each a format whose events carry a JSON pointer).
FILES = (
    "inspect-ai-logs/tests/log/test_eval_log/log_message_deduplication.eval",  # a zip: members by pointer
    "openhands-trajectories/evaluation/benchmarks/multi_swe_bench/examples/output.jsonl",  # run id '...#L2'
    "who-and-when/Hand-Crafted/2.json",
    "who-and-when/Hand-Crafted/9.json",
)


def _event_refs(run_dir: Path) -> dict[str, str]:
    con = duckdb.connect(str(run_dir / "ir.duckdb"), read_only=True)
    try:
        rows = con.execute("SELECT event_id, source_path, line_start, line_end, json_pointer FROM events").fetchall()
    finally:
        con.close()
    return {r[0]: ref_of(r[1], r[2], r[3], r[4]) for r in rows}


def _foreign_bundle(tmp_path: Path) -> Path:
    need_shared_data()
    src = tmp_path / "logs"
    for rel in FILES:
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SHARED_DATA / rel, src / rel)
    bundle = tmp_path / "bundle"
    import_bundle("auto", src, bundle)
    return bundle


def test_refs_of_a_foreign_batch_keep_their_pointers_and_resolve(
    tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    bundle = _foreign_bundle(tmp_path)
    fake_llm.handler = ScriptedModel()
    opts = RunOptions(bundle=bundle, run_id="r", runs_dir=tmp_path / "runs", models=model_settings())
    res = run(opts, log=lambda _m: None)
    run_dir = tmp_path / "runs" / "r"
    assert res.ran == ["export", "select", "probes", "luna", "coordinator", "sol"]

    # Every occurrence ref is its event's own ref, pointer included, and names readable raw bytes.
    own = _event_refs(run_dir)
    groups = json.loads((run_dir / "pattern-groups.json").read_text())["groups"]
    occurrences = [o for g in groups for o in g["occurrences"]]
    for o in occurrences:
        assert o["refs"] == [own[e] for e in o["events"]]
    refs = sorted({r for o in occurrences for r in o["refs"]})
    assert any(".eval#L1-L1/samples/" in r for r in refs)  # a zip member's element
    assert any(o["run_id"].endswith("output.jsonl#L2") for o in occurrences)  # a run id that looks like a ref
    lines = read_refs(run_dir, refs)  # raises on any ref that does not resolve (a zip without its member)
    assert all(lines[r] for r in refs)

    # Sol's checks resolve a pointer ref to its cell, and refuse a pointer no event of those lines has.
    index = load_index(run_dir / "ir.duckdb")
    cell_of = {o["refs"][0]: o["cell_id"] for o in occurrences}
    for ref, cell in cell_of.items():
        assert index.resolve(ref) == (cell, None)
    # ... and gives an event's raw-bytes ref with its pointer (what the follow-up judge cites).
    pointed = [e for o in occurrences for e in o["events"] if "!" in own[e]]
    index.load(pointed)
    assert pointed and [index.source_ref(e) for e in pointed] == [own[e] for e in pointed]
    zipped = next(r for r in cell_of if ".eval#" in r)
    bogus = zipped.split("#L1-L1/")[0] + "#L1-L1/samples/no_such_member.json!/messages/0"
    found, why = index.resolve(bogus)
    assert found is None and why is not None and "is at" in why

    # The report embeds every cited ref and event; a run id that looks like a ref is not cited.
    shortlist = json.loads((run_dir / "weakness-shortlist.json").read_text())
    assert not any("#L" in c for w in shortlist["weaknesses"] for c in cited_ids(w))
    _, stats = render_report(run_dir)
    assert stats["refs"] > 0
    assert stats["unresolved"] == 0 and stats["hash_mismatches"] == 0


def test_a_recorded_foreign_run_replays_byte_for_byte_offline(
    tmp_path: Path, fake_llm: FakeOpenAI, model_settings: Callable[..., ModelSettings]
) -> None:
    bundle, store = _foreign_bundle(tmp_path), tmp_path / "store"
    fake_llm.handler = ScriptedModel()
    recorded = RunOptions(
        bundle=bundle, run_id="r", runs_dir=tmp_path / "a", models=model_settings(mode="record", store=store)
    )
    run(recorded, log=lambda _m: None)
    fake_llm.handler = None  # replay must not reach the server
    asked = len(fake_llm.requests)
    replayed = RunOptions(
        bundle=bundle, run_id="r", runs_dir=tmp_path / "b", models=ModelSettings(mode="replay", store=store)
    )
    run(replayed, log=lambda _m: None)
    assert len(fake_llm.requests) == asked
    for name in ("patterns.jsonl", "pattern-groups.json", "weakness-shortlist.json"):
        assert (tmp_path / "a" / "r" / name).read_bytes() == (tmp_path / "b" / "r" / name).read_bytes(), name
