"""Answers another run of the same bundle received: which are lent, and which never are."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.core.canonical import write_json
from pipeline.models.donors import Donors
from pipeline.models.store import RecordingStore


def make_run(root: Path, name: str, bundle_digest: str, calls: list[dict[str, object]], keys: list[str]) -> Path:
    run = root / name
    run.mkdir(parents=True)
    write_json(run / "run.json", {"schema_version": 2, "run_id": name, "inputs": {"bundle_digest": bundle_digest}})
    store = RecordingStore(run / "exchanges", "record")
    for k in keys:
        store.save({"key": k, "response": {"choices": []}, "from": name})
    rows = [{"schema_version": 1, **c} for c in calls]
    (run / "calls.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return run


def test_ok_answers_of_the_same_bundle_are_lent_and_failed_or_other_bundles_never(tmp_path: Path) -> None:
    ok, failed, cut, elsewhere = "sha256:" + "a" * 64, "sha256:" + "b" * 64, "sha256:" + "c" * 64, "sha256:" + "d" * 64
    make_run(
        tmp_path,
        "pilot",
        "sha256:bundle",
        [
            {"outcome": "ok", "keys": [ok]},
            {"outcome": "failed", "keys": [failed]},  # a retry wants a new answer: never lent
            {"outcome": "interrupted", "keys": [cut]},  # never judged: lent, as a resume serves it
        ],
        [ok, failed, cut],
    )
    make_run(tmp_path, "other-bundle", "sha256:another", [{"outcome": "ok", "keys": [elsewhere]}], [elsewhere])
    me = make_run(tmp_path, "full", "sha256:bundle", [], [])
    donors = Donors(me)
    got = donors.find(ok)
    assert got is not None and got["from"] == "pilot"
    assert donors.find(failed) is None
    assert donors.find(cut) is not None
    assert donors.find(elsewhere) is None  # another bundle's run lends nothing
    assert (
        donors.said()
        == "2 answer(s) taken from earlier run(s) of this bundle: pilot (2); the same requests, not paid again"
    )
    assert donors.said() is None  # said once


def test_a_run_without_a_bundle_digest_borrows_nothing(tmp_path: Path) -> None:
    key = "sha256:" + "e" * 64
    make_run(tmp_path, "pilot", "sha256:bundle", [{"outcome": "ok", "keys": [key]}], [key])
    lone = tmp_path / "lone"
    lone.mkdir()
    assert Donors(lone).find(key) is None
