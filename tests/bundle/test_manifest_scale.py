"""Manifests of a million files: read entry by entry, held by column, the file cap checked as they come.

A 100,000-cell native bundle holds ~1.2 million files (a 213 MB ``manifest.json``). These tests
build synthetic manifests (no files behind them) and lower the limits rather than write 200 MB.
"""

from __future__ import annotations

import gc
import hashlib
import json
import pickle
import tracemalloc
from array import array
from pathlib import Path

import orjson
import pytest

from pipeline.bundle import verified
from pipeline.bundle.manifest import (
    MANIFEST_FILE,
    FileEntry,
    FileList,
    Manifest,
    StatTable,
    freeze,
    read_manifest,
    verify,
)
from pipeline.bundle.synth import write_bundle
from pipeline.core import canonical
from pipeline.core.canonical import pretty_json_bytes
from pipeline.core.errors import BundleError
from pipeline.core.limits import limit


def _synthetic(n: int, cells_of: int = 12) -> Manifest:
    """``n`` entries shaped like a native bundle's (cells/Cxxxxxx/..., ~12 a cell), digests of their names."""
    paths = sorted(f"cells/C{i // cells_of:06d}/sessions/{i % cells_of:02d}-proposal-operator.jsonl" for i in range(n))
    digests = b"".join(hashlib.sha256(p.encode()).digest() for p in paths)
    return Manifest(files=FileList(paths, digests, array("q", range(n))))


def _write(bundle: Path, manifest: Manifest) -> Path:
    bundle.mkdir(parents=True, exist_ok=True)
    (bundle / MANIFEST_FILE).write_bytes(b"".join(manifest.json_chunks()))
    return bundle


def test_the_default_file_cap_fits_100000_native_cells() -> None:
    assert limit("LUNASOL_MAX_BUNDLE_FILES") >= 4 * 1_200_000


def test_a_manifest_over_the_document_limit_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    manifest = _synthetic(3_000)
    bundle = _write(tmp_path / "b", manifest)
    size = (bundle / MANIFEST_FILE).stat().st_size
    monkeypatch.setenv("LUNASOL_MAX_DOC_BYTES", str(size // 10))  # once refused: the manifest was one document
    got = read_manifest(bundle)
    assert got == manifest and len(got.files) == 3_000


@pytest.mark.slow
def test_a_manifest_past_the_old_200000_file_cap_loads_with_default_limits(tmp_path: Path) -> None:
    manifest = _synthetic(210_000)
    bundle = _write(tmp_path / "b", manifest)
    got = read_manifest(bundle)
    assert len(got.files) == 210_000
    assert got.files[-1] == manifest.files[-1] and got.files[123_456] == manifest.files[123_456]


def test_the_file_cap_refuses_past_its_limit_while_reading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = _write(tmp_path / "b", _synthetic(101))
    monkeypatch.setenv("LUNASOL_MAX_BUNDLE_FILES", "101")
    assert len(read_manifest(bundle).files) == 101
    monkeypatch.setenv("LUNASOL_MAX_BUNDLE_FILES", "100")
    with pytest.raises(BundleError) as err:
        read_manifest(bundle)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{MANIFEST_FILE}: 101 files (at least), over the 100 limit")
    assert "LUNASOL_MAX_BUNDLE_FILES" in message
    # counted as the entries come: what lies far past the cap is never read (here: not even JSON)
    bundle = _write(tmp_path / "c", _synthetic(1_000))
    raw = (bundle / MANIFEST_FILE).read_bytes()
    cut = raw.index(b"C000075/sessions/00")  # entry 900, ~170 KB in (the parser reads 64 KB at a time)
    (bundle / MANIFEST_FILE).write_bytes(raw[:cut] + b"\x00 not json")
    with pytest.raises(BundleError, match=r"101 files \(at least\), over the 100 limit"):
        read_manifest(bundle)
    monkeypatch.setenv("LUNASOL_MAX_BUNDLE_FILES", "5000")
    with pytest.raises(BundleError, match="invalid JSON"):
        read_manifest(bundle)


def test_freeze_refuses_past_the_file_cap_and_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bundle = tmp_path / "b"
    write_bundle(bundle, cells=2, events_per_cell=4)
    files = len(read_manifest(bundle).files)
    before = (bundle / MANIFEST_FILE).read_bytes()
    monkeypatch.setenv("LUNASOL_MAX_BUNDLE_FILES", str(files - 1))
    with pytest.raises(BundleError, match=f"{files:,} files \\(at least\\), over the {files - 1:,} limit"):
        freeze(bundle)
    assert (bundle / MANIFEST_FILE).read_bytes() == before


def test_held_memory_per_entry_is_bounded(tmp_path: Path) -> None:
    n = 20_000
    bundle = _write(tmp_path / "b", _synthetic(n))
    gc.collect()
    tracemalloc.start()
    try:
        manifest = read_manifest(bundle)
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
        table = StatTable(manifest.files)
        for i in range(n):
            table.put(i, (i, 1_700_000_000_000_000_000, 1_700_000_000_000_000_000, 2**63 + i))
        gc.collect()
        with_table, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held / n < 120, f"{held / n:.0f} bytes an entry"  # a tuple of FileEntry took ~340, a list of paths 151
    assert (with_table - held) / n < 40, f"{(with_table - held) / n:.0f} bytes a stat key"  # a dict took ~250
    assert table.at(n - 1) == (n - 1, 1_700_000_000_000_000_000, 1_700_000_000_000_000_000, 2**63 + n - 1)
    assert len(table) == n and table[manifest.files.paths[5]][0] == 5


@pytest.mark.parametrize("per_chunk", [1, 2, 4096])
def test_json_chunks_are_the_bytes_pretty_json_wrote(per_chunk: int) -> None:
    paths = sorted(["a", 'q"uote', "tab\there", "é/ü.json", "emoji-😀", "ctl\x01x", "sp ace/x", "z" * 300])
    manifest = Manifest(files=[FileEntry(p, "sha256:" + hashlib.sha256(p.encode()).hexdigest(), len(p)) for p in paths])
    assert b"".join(manifest.json_chunks(per_chunk)) == pretty_json_bytes(manifest.to_json())
    empty = Manifest(files=())
    assert b"".join(empty.json_chunks(per_chunk)) == pretty_json_bytes(empty.to_json())


def test_file_list_keeps_the_tuple_api() -> None:
    entries = [FileEntry(f"p{i:02d}", "sha256:" + f"{i:02x}" * 32, i) for i in range(10)]
    files = Manifest(files=entries).files
    assert len(files) == 10 and list(files) == entries and tuple(files) == tuple(entries)
    assert files[3] == entries[3] and files[-1] == entries[-1]
    assert files[2:5] == tuple(entries[2:5]) and files[::-3] == tuple(entries[::-3])
    assert files.position("p07") == 7 and files.position("p07x") == -1 and entries[4] in files
    with pytest.raises(IndexError):
        files[10]
    manifest = Manifest(files=entries)
    assert "p03" in manifest.by_path and "nope" not in manifest.by_path
    assert manifest.by_path["p03"] == entries[3] and list(manifest.by_path) == [e.path for e in entries]
    assert manifest.get("p09").sha256 == "sha256:" + "09" * 32
    with pytest.raises(BundleError, match=r"not in the bundle's manifest\.json"):
        manifest.get("nope")


def test_paths_are_one_string_not_an_object_each_and_keep_the_list_api() -> None:
    """1.2 million path objects left ~70 one-MiB arenas mapped after the manifest was freed (100,000 cells):
    the paths are one string and their ends; a path is made when asked for."""
    from pipeline.bundle.manifest import PathList

    paths = sorted(["a/b", "b/é.json", "b/😀", "c" * 300, "d/x y"])
    held = PathList.of(paths)
    assert list(held) == paths and len(held) == len(paths) and held == paths and held == tuple(paths)
    assert [held[i] for i in range(-len(paths), len(paths))] == paths + paths
    assert held[1:4] == paths[1:4] and held[::-2] == paths[::-2]
    with pytest.raises(IndexError):
        held[len(paths)]
    assert pickle.loads(pickle.dumps(held)) == held and PathList.of([]) == []
    files = FileList(paths, bytes(32 * len(paths)), array("q", range(len(paths))))
    assert isinstance(files.paths, PathList) and files.position("b/😀") == paths.index("b/😀")
    # a read manifest holds no str per path: its objects do not grow with its files
    big = _synthetic(30_000).files
    assert isinstance(big.paths, PathList)
    assert sum(1 for o in gc.get_referents(big.paths) if isinstance(o, str)) == 1


def _manifest_text(entries: list[object], version: object = 1) -> str:
    return json.dumps({"files": entries, "schema_version": version})


GOOD = {"path": "a.txt", "sha256": "sha256:" + "ab" * 32, "size": 1}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"files": [{"path": "a", "path": "b", "sha256": "x", "size": 1}]}', "key 'path' appears twice"),
        (_manifest_text([{**GOOD, "sha256": "sha256:" + "AB" * 32}]), "files[0] sha256 must read"),
        (_manifest_text([{**GOOD, "sha256": "sha256:" + "ab" * 31 + " a"}]), "files[0] sha256 must read"),
        (_manifest_text([GOOD, {**GOOD, "path": ["a"]}]), "files[1] has wrongly typed fields"),
        (_manifest_text([GOOD, {**GOOD, "size": True}]), "files[1] has wrongly typed fields"),
        (_manifest_text([GOOD, {**GOOD, "size": 1.0}]), "files[1] has wrongly typed fields"),
        (_manifest_text([GOOD, {**GOOD, "size": -1}]), "files[1] size -1 is not a file size"),
        (_manifest_text([GOOD, {**GOOD, "size": 2**64}]), "integer overflow"),
        (_manifest_text([GOOD, {"path": "b"}]), "files[1] must have exactly path, sha256 and size"),
        (_manifest_text([GOOD, [1, 2]]), "files[1] must have exactly path, sha256 and size"),
        (_manifest_text([GOOD, GOOD]), "path 'a.txt' is listed twice"),
        (_manifest_text([{**GOOD, "path": "../x"}]), "escapes the bundle"),
        (_manifest_text([{**GOOD, "size": "x"}], version=99), "unsupported schema_version 99"),  # the version first
        (_manifest_text([GOOD], version="1"), "unsupported schema_version '1'"),
        ('{"schema_version": 1}', "expected an object with a 'files' list"),
        ('{"files": {}, "schema_version": 1}', "expected an object with a 'files' list"),
        ("[1, 2]", "expected an object with a 'files' list"),
        (_manifest_text([GOOD]) + " x", "invalid JSON"),
        (_manifest_text([GOOD])[:-20], "invalid JSON"),
        ("", "empty file"),
        (" \n\t", "empty file"),
        ('{"files": [], "schema_version": 1, "schema_version": 1}', "key 'schema_version' appears twice"),
    ],
)  # fmt: skip
def test_a_bad_manifest_is_one_line(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / MANIFEST_FILE).write_text(text, encoding="utf-8")
    with pytest.raises(BundleError) as err:
        read_manifest(tmp_path)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert str(err.value).startswith(f"{MANIFEST_FILE}: ") or "escapes" in str(err.value)


def test_a_manifest_not_in_utf8_names_the_line(tmp_path: Path) -> None:
    text = json.dumps({"files": [GOOD, {**GOOD, "path": "b\u00e9.txt"}], "schema_version": 1}, ensure_ascii=False)
    text = text.replace("}, {", "},\n{")
    (tmp_path / MANIFEST_FILE).write_bytes(text.encode("utf-8").replace("é".encode(), b"\xe9"))
    with pytest.raises(BundleError, match=r"manifest.json: not UTF-8 \(line 2, byte \d+\)"):
        read_manifest(tmp_path)


def test_another_tools_order_reads_sorted(tmp_path: Path) -> None:
    entries = [{**GOOD, "path": p} for p in ("c", "a", "b")]
    (tmp_path / MANIFEST_FILE).write_text(json.dumps({"schema_version": 1, "extra": [{"x": [1]}], "files": entries}))
    files = read_manifest(tmp_path).files
    assert files.paths == ["a", "b", "c"] and files[0].sha256 == GOOD["sha256"]


def test_verified_files_are_the_bytes_orjson_wrote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(canonical, "RACY_NS", 0)
    bundle = tmp_path / "bundle"
    write_bundle(bundle, cells=3, events_per_cell=6)
    run_dir = tmp_path / "run"
    manifest = read_manifest(bundle)
    report = verify(bundle, manifest)
    assert report.ok and len(manifest.hashed_ok) == len(manifest.files)
    verified.save(run_dir, bundle, manifest, report)
    files = manifest.files
    expected = {
        str(i): [*manifest.hashed_ok[f.path], f.sha256] for i, f in enumerate(files)
    }  # the old writer: a dict by position, orjson
    old = orjson.dumps({"schema": verified.SCHEMA, "bundle": str(bundle.resolve()), "files": expected})
    assert (run_dir / verified.VERIFIED_FILE).read_bytes() == old
    known = verified.load(run_dir, bundle, manifest)
    assert len(known) == len(files) and known[files[0].path] == (manifest.hashed_ok[files[0].path], files[0].sha256)
    again = verify(bundle, manifest, known)
    assert again.ok and again.unchanged_stat == len(files)
    # the export's workers get the manifest pickled: what verify hashed goes with it
    copy = pickle.loads(pickle.dumps(manifest))
    assert copy == manifest and dict(copy.hashed_ok) == dict(manifest.hashed_ok) and copy.by_path.files is copy.files
    # a caller's own mapping of path -> (stat key, sha256) still works
    plain = {f.path: (manifest.hashed_ok[f.path], f.sha256) for f in files}
    assert verify(bundle, read_manifest(bundle), plain).unchanged_stat == len(files)


def test_hashed_ok_holds_only_the_files_that_verified(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    write_bundle(bundle, cells=2, events_per_cell=6)
    manifest = read_manifest(bundle)
    files = manifest.files.paths
    changed, gone = files[3], files[5]
    raw = bytearray((bundle / changed).read_bytes())
    raw[0] ^= 1  # same size, other bytes: only the hash tells
    (bundle / changed).write_bytes(bytes(raw))
    (bundle / gone).unlink()
    report = verify(bundle, manifest)
    assert report.changed == [changed] and report.missing == [gone]
    assert set(manifest.hashed_ok) == set(files) - {changed, gone}
    assert len(manifest.hashed_ok) == len(files) - 2
    # a second verify adds to what the first kept (the file put back now verifies too)
    (bundle / changed).write_bytes(bytes([raw[0] ^ 1]) + bytes(raw[1:]))
    assert verify(bundle, manifest).missing == [gone]
    assert set(manifest.hashed_ok) == set(files) - {gone}
