"""The run's stat cache of hashed bundle files: a rerun hashes only what changed, and never trusts a changed file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pipeline.bundle import manifest as manifest_mod
from pipeline.bundle import verified
from pipeline.bundle.manifest import freeze, read_manifest, verify
from pipeline.bundle.synth import write_bundle
from pipeline.core import canonical
from pipeline.ir.export import export

SESSION = "cells/C001/sessions/01-proposal-candidate.jsonl"


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    root = tmp_path / "bundle"
    write_bundle(root, cells=3, events_per_cell=12)
    return root


@pytest.fixture
def settled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files written by the test count as settled (else only files older than RACY_NS are kept)."""
    monkeypatch.setattr(canonical, "RACY_NS", 0)


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the files verify hashes, in order (the real hash still runs)."""
    seen: list[str] = []
    from pipeline.core.canonical import sha256_file as real

    def spy(path: Path, chunk: int = 1 << 20) -> str:
        seen.append(path.name)
        return real(path, chunk)

    monkeypatch.setattr(manifest_mod, "sha256_file", spy)
    return seen


def _verify(bundle: Path, run_dir: Path) -> manifest_mod.VerifyReport:
    manifest = read_manifest(bundle)
    report = verify(bundle, manifest, verified.load(run_dir, bundle, manifest))
    if report.ok:
        verified.save(run_dir, bundle, manifest, report)
    return report


@pytest.mark.usefixtures("settled")
def test_a_rerun_hashes_only_the_file_that_changed(bundle: Path, tmp_path: Path, hashed: list[str]) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    files = len(read_manifest(bundle).files)
    assert _verify(bundle, run_dir).ok and len(hashed) == files  # first run: every file
    hashed.clear()
    again = _verify(bundle, run_dir)
    assert again.ok and hashed == [] and again.unchanged_stat == files
    (bundle / SESSION).write_text((bundle / SESSION).read_text() + "\n")
    freeze(bundle)  # a new manifest, for the one changed file
    hashed.clear()
    third = _verify(bundle, run_dir)
    assert third.ok and hashed == [Path(SESSION).name] and third.unchanged_stat == files - 1


@pytest.mark.usefixtures("settled")
def test_an_edit_of_the_same_size_with_its_mtime_put_back_is_caught(bundle: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    assert _verify(bundle, run_dir).ok
    path = bundle / SESSION
    st = path.stat()
    raw = bytearray(path.read_bytes())
    raw[5] = ord("Q") if raw[5] != ord("Q") else ord("R")
    with path.open("r+b") as fh:  # in place: the same inode and size
        fh.write(bytes(raw))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # the mtime put back; the ctime cannot be
    assert path.stat().st_size == st.st_size and path.stat().st_ino == st.st_ino
    report = _verify(bundle, run_dir)
    assert report.changed == [SESSION]


@pytest.mark.usefixtures("settled")
def test_a_cache_that_is_torn_edited_or_of_another_bundle_is_not_used(
    bundle: Path, tmp_path: Path, hashed: list[str]
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    assert _verify(bundle, run_dir).ok
    path = run_dir / verified.VERIFIED_FILE
    good = json.loads(path.read_text())
    assert verified.load(run_dir, bundle, read_manifest(bundle))
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / verified.VERIFIED_FILE).write_text(json.dumps(good))
    assert verified.load(copy, tmp_path / "elsewhere", read_manifest(bundle)) == {}  # names another bundle
    bad_values = (["12", 1, 2, 3, "sha256:x"], [True, 1, 2, 3, "sha256:x"], [12, 1, 2, "sha256:x"], [12, 1, 2, 3, 4])
    first = next(iter(good["files"]))
    bad_entries = [json.dumps({**good, "files": {**good["files"], first: v}}) for v in bad_values]
    bad_entries.append(json.dumps({**good, "files": {**good["files"], "999999": good["files"][first]}}))  # no such file
    bad_entries.append(json.dumps({**good, "files": {**good["files"], SESSION: good["files"][first]}}))  # a path
    for text in (path.read_text()[:-9], json.dumps({**good, "schema": 99}), *bad_entries):
        path.write_text(text)
        assert verified.load(run_dir, bundle, read_manifest(bundle)) == {}
        hashed.clear()
        assert verify(bundle, read_manifest(bundle), verified.load(run_dir, bundle, read_manifest(bundle))).ok
        assert len(hashed) == len(good["files"])  # every file hashed again


@pytest.mark.usefixtures("settled")
def test_an_entry_counts_only_for_the_sha256_the_manifest_still_lists(bundle: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    assert _verify(bundle, run_dir).ok
    doc = json.loads((bundle / "manifest.json").read_text())
    entry = next(f for f in doc["files"] if f["path"] == SESSION)
    entry["sha256"] = "sha256:" + "0" * 64  # a manifest that lists other bytes for an untouched file
    (bundle / "manifest.json").write_text(json.dumps(doc))
    manifest = read_manifest(bundle)
    assert verify(bundle, manifest, verified.load(run_dir, bundle, manifest)).changed == [SESSION]


def test_files_changed_moments_before_the_verify_are_not_kept(bundle: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    old = 1_600_000_000 * 10**9
    for rel in read_manifest(bundle).by_path:
        if rel != SESSION:
            os.utime(bundle / rel, ns=(old, old))  # an old mtime; every ctime is still now
    assert _verify(bundle, run_dir).ok
    assert not (run_dir / verified.VERIFIED_FILE).exists()  # nothing has settled: nothing kept, nothing written


def test_bundle_verify_without_the_cache_hashes_every_file(bundle: Path, tmp_path: Path, hashed: list[str]) -> None:
    export(bundle, tmp_path / "runs" / "r")
    hashed.clear()
    report = verify(bundle)
    assert report.ok and report.unchanged_stat == 0 and len(hashed) == report.files


@pytest.mark.usefixtures("settled")
def test_export_keeps_the_cache_and_a_re_export_hashes_nothing_unchanged(
    bundle: Path, tmp_path: Path, hashed: list[str]
) -> None:
    run_dir = tmp_path / "runs" / "r"
    export(bundle, run_dir)
    assert (run_dir / verified.VERIFIED_FILE).is_file()
    hashed.clear()
    export(bundle, run_dir)
    assert hashed == []
