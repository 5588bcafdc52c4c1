"""Bundles: the request model, freeze / verify (library and CLI)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path, PurePosixPath

import pytest
from typer.testing import CliRunner

from pipeline.bundle import AnalysisRequest, freeze, load_request, read_manifest, request_json_schema, verify
from pipeline.bundle import manifest as manifest_mod
from pipeline.bundle.manifest import MANIFEST_FILE, forget_manifests, iter_files, remember_manifests
from pipeline.bundle.request import check_relative
from pipeline.bundle.synth import write_bundle
from pipeline.cli.app import app
from pipeline.core.canonical import sha256_file
from pipeline.core.errors import BundleError

runner = CliRunner()


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    root = tmp_path / "bundle"
    write_bundle(root, cells=2, events_per_cell=12)
    return root


def _request(**changes: object) -> dict[str, object]:
    base: dict[str, object] = {
        "schema_version": 1,
        "parent_harness": "H0",
        "generation": 0,
        "analysis_run_id": "r1",
        "tasks": [{"task_id": "t1", "summary": "s"}],
        "cells": [
            {"cell_id": "C001", "task_id": "t1", "run_id": "r", "eligibility": "valid_behavior", "path": "cells/C001"},
            {"cell_id": "C002", "task_id": "t1", "run_id": "r", "eligibility": "excluded", "path": "cells/C002"},
        ],
        "exclusions": [{"cell_id": "C002", "reason": "crashed"}],
        "allowed_history": [],
    }
    base.update(changes)
    return base


def test_request_model_defaults_and_schema() -> None:
    req = AnalysisRequest.model_validate(_request())
    assert req.format == "native"
    assert req.source is None
    assert [c.cell_id for c in req.eligible_cells] == ["C001"]
    assert req.exclusion_reason("C002") == "crashed"
    schema = request_json_schema()
    assert schema["additionalProperties"] is False
    assert {"format", "source", "cells", "exclusions", "allowed_history"} <= set(schema["properties"])


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"cells": [_request()["cells"][0], _request()["cells"][0]]}, "duplicate cell ids: C001"),  # type: ignore[index]
        ({"exclusions": []}, "excluded cell C002 has no reason"),
        ({"exclusions": [{"cell_id": "C002", "reason": "  "}]}, "excluded cell C002 has an empty reason"),
        ({"tasks": [{"task_id": "other", "summary": "s"}]}, "unknown task id 't1'"),
        ({"exclusions": [{"cell_id": "C001", "reason": "x"}, {"cell_id": "C002", "reason": "y"}]}, "valid_behavior"),
        ({"schema_version": 9}, "newer"),
        ({"analysis_run_id": "../evil"}, "not a safe id"),
    ],
)
def test_request_validation_is_one_bundle_error(changes: dict[str, object], message: str) -> None:
    with pytest.raises(BundleError) as info:
        AnalysisRequest.model_validate(_request(**changes))
    assert message in info.value.one_line()
    assert "\n" not in info.value.one_line()


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"extra": 1}, "cells.0.extra"),
        ({"cell_id": 7}, "cells.0.cell_id: Input should be a valid string"),  # strict: no number for an id
        ({"task_id": ""}, "cells.0.task_id: String should have at least 1 character"),
        ({"eligibility": "maybe"}, "cells.0.eligibility"),
        ({"path": None}, "cells.0.path"),
    ],
)
def test_a_bad_cell_is_one_bundle_error_naming_its_field(tmp_path: Path, change: dict[str, object], where: str) -> None:
    cells: list[dict[str, object]] = _request()["cells"]  # type: ignore[assignment]
    (tmp_path / "analysis-request.json").write_text(json.dumps(_request(cells=[{**cells[0], **change}, cells[1]])))
    with pytest.raises(BundleError, match=re.escape(where)):
        load_request(tmp_path)


def test_a_request_holds_its_cells_small_and_they_travel_to_workers(tmp_path: Path) -> None:
    """A sweep's request lists 100,000 cells, held through the export: a few hundred bytes a cell with its
    strings (a pydantic model instance took 1.2 KB: 162 MiB at 100,000 cells). Cells pickle (export workers)."""
    import pickle
    import tracemalloc

    n = 2_000
    cells = [
        {
            "cell_id": f"C{i:05d}",
            "task_id": f"task-{i % 500:04d}",
            "run_id": f"run-{i:05d}",
            "eligibility": "valid_behavior",
            "path": f"cells/C{i:05d}",
        }
        for i in range(n)
    ]
    tasks = [{"task_id": f"task-{i:04d}", "summary": "s"} for i in range(500)]
    (tmp_path / "analysis-request.json").write_text(json.dumps(_request(cells=cells, tasks=tasks, exclusions=[])))
    tracemalloc.start()
    req = load_request(tmp_path)
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert held / n < 500, f"{held / n:.0f} bytes a cell"
    cell = req.cells[7]
    assert pickle.loads(pickle.dumps(cell)) == cell
    assert cell.as_json() == cells[7]  # what source digests are made of: the cell as the request lists it


def test_request_extra_field_forbidden(tmp_path: Path) -> None:
    (tmp_path / "analysis-request.json").write_text(json.dumps(_request(surprise=1)))
    with pytest.raises(BundleError, match="surprise"):
        load_request(tmp_path)


def test_cell_path_escape_in_request() -> None:
    cells = [dict(_request()["cells"][0], path="../outside")]  # type: ignore[index]
    with pytest.raises(BundleError, match="escapes the bundle"):
        AnalysisRequest.model_validate(_request(cells=cells, exclusions=[]))


def test_freeze_writes_sorted_manifest_with_real_hashes(bundle: Path) -> None:
    data = json.loads((bundle / MANIFEST_FILE).read_text())
    assert data["schema_version"] == 1
    paths = [f["path"] for f in data["files"]]
    assert paths == sorted(paths)
    assert MANIFEST_FILE not in paths
    for f in data["files"]:
        assert set(f) == {"path", "sha256", "size"}
        assert f["sha256"] == sha256_file(bundle / f["path"])
        assert f["size"] == (bundle / f["path"]).stat().st_size
    assert verify(bundle).ok


def test_verify_names_changed_missing_extra(bundle: Path) -> None:
    manifest = read_manifest(bundle)
    victim = next(f.path for f in manifest.files if f.path.endswith("controller.jsonl"))
    raw = bytearray((bundle / victim).read_bytes())
    raw[10] = ord("X") if raw[10] != ord("X") else ord("Y")  # same size, different bytes
    (bundle / victim).write_bytes(bytes(raw))
    (bundle / "sidecar" / "outcomes.jsonl").unlink()
    (bundle / "cells" / "new.txt").write_text("hello")
    report = verify(bundle)
    assert report.changed == [victim]
    assert report.missing == ["sidecar/outcomes.jsonl"]
    assert report.extra == ["cells/new.txt"]
    assert not report.ok


def test_cli_freeze_and_verify(bundle: Path) -> None:
    (bundle / MANIFEST_FILE).unlink()
    result = runner.invoke(app, ["bundle", "freeze", str(bundle)])
    assert result.exit_code == 0, result.output
    assert "froze" in result.output
    result = runner.invoke(app, ["bundle", "verify", str(bundle)])
    assert result.exit_code == 0
    assert result.output.startswith("ok:")
    (bundle / "cells" / "C001" / "cell.json").write_text("{}")
    (bundle / "analysis-request.json").rename(bundle / "moved.json")
    result = runner.invoke(app, ["bundle", "verify", str(bundle)])
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        "changed: cells/C001/cell.json",
        "missing: analysis-request.json",
        "extra: moved.json",
    ]
    result = runner.invoke(app, ["bundle", "verify", str(bundle), "--json"])
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["ok"] is False
    assert data["missing"] == ["analysis-request.json"]


def test_verify_missing_manifest_exit_2(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    result = runner.invoke(app, ["bundle", "verify", str(tmp_path / "b")])
    assert result.exit_code == 2
    assert "missing manifest.json" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_freeze_refuses_symlink_out(bundle: Path, tmp_path: Path) -> None:
    outside = tmp_path / "secret.txt"
    outside.write_text("secret")
    os.symlink(outside, bundle / "cells" / "C001" / "leak.jsonl")
    before = (bundle / MANIFEST_FILE).read_bytes()
    result = runner.invoke(app, ["bundle", "freeze", str(bundle)])
    assert result.exit_code == 2
    assert "points outside the bundle" in result.output
    assert (bundle / MANIFEST_FILE).read_bytes() == before


def test_symlink_inside_is_listed_and_dir_links_not_followed(bundle: Path, tmp_path: Path) -> None:
    os.symlink(bundle / "cells" / "C001" / "cell.json", bundle / "alias.json")
    os.symlink(bundle / "cells" / "C001", bundle / "cells" / "C001-alias")
    files = list(iter_files(bundle))
    assert "alias.json" in files
    assert not any(f.startswith("cells/C001-alias/") for f in files)
    os.symlink(tmp_path, bundle / "cells" / "outdir")
    with pytest.raises(BundleError, match="points outside"):
        freeze(bundle)


@pytest.mark.parametrize(
    ("path", "message"),
    [("../outside.txt", "escapes the bundle"), ("/etc/hostname", "absolute"), ("cells/../../x", "escapes")],
)
def test_manifest_path_escape(bundle: Path, path: str, message: str) -> None:
    data = json.loads((bundle / MANIFEST_FILE).read_text())
    data["files"].append({"path": path, "sha256": "sha256:" + "0" * 64, "size": 1})
    (bundle / MANIFEST_FILE).write_text(json.dumps(data))
    with pytest.raises(BundleError, match=message):
        verify(bundle)
    result = runner.invoke(app, ["bundle", "verify", str(bundle)])
    assert result.exit_code == 2


def test_manifest_listed_symlink_out(bundle: Path, tmp_path: Path) -> None:
    outside = tmp_path / "o.txt"
    outside.write_text("x")
    os.symlink(outside, bundle / "o.txt")
    data = json.loads((bundle / MANIFEST_FILE).read_text())
    data["files"].append({"path": "o.txt", "sha256": sha256_file(outside), "size": 1})
    (bundle / MANIFEST_FILE).write_text(json.dumps(data))
    with pytest.raises(BundleError, match="outside the bundle"):
        verify(bundle)


def test_read_frozen_rehashes_a_file_changed_after_verify(bundle: Path) -> None:
    from pipeline.bundle import read_frozen

    manifest = read_manifest(bundle)
    assert verify(bundle, manifest).ok
    rel = "cells/C001/controller.jsonl"
    assert rel in manifest.hashed_ok
    assert read_frozen(bundle, rel, manifest) == (bundle / rel).read_bytes()
    raw = bytearray((bundle / rel).read_bytes())
    raw[1] = ord("Z") if raw[1] != ord("Z") else ord("Y")
    os.unlink(bundle / rel)  # a new inode, as editors and generators produce
    (bundle / rel).write_bytes(bytes(raw))
    with pytest.raises(BundleError, match="changed since the bundle was frozen"):
        read_frozen(bundle, rel, manifest)
    with pytest.raises(BundleError, match="changed since the bundle was frozen"):
        read_frozen(bundle, rel, read_manifest(bundle))


def _old_check_relative(path: str) -> str | None:
    """check_relative as it was with PurePosixPath (the verdict the string tests must keep)."""
    p = PurePosixPath(path)
    if not path or path.startswith(("/", "\\")) or p.is_absolute() or re.match(r"^[A-Za-z]:", path):
        return "absolute"
    if "\\" in path or ".." in p.parts or "\x00" in path:
        return "escapes"
    return None


@pytest.mark.parametrize(
    "path",
    [
        "", "a", "a/b.txt", "./a", "a/./b", "a//b", "a/", "/a", "//a", "\\a", "a\\b", "C:x", "c:/x", "1:x",
        "..", "../a", "a/..", "a/../b", "a/..b", "a..", "..a/b", "a/b..", "...", "a/.../b", "a\x00b", " a",
        "a/ ../b", ".", "./..", "a/.", "é/..", "cells/C001/sessions/01.jsonl",
    ],
)  # fmt: skip
def test_check_relative_keeps_its_verdicts(path: str) -> None:
    try:
        check_relative(path, "p")
        got = None
    except BundleError as exc:
        got = "absolute" if "absolute" in str(exc) else "escapes"
    assert got == _old_check_relative(path)


def test_remembered_manifest_is_checked_once_per_content(bundle: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    checked: list[int] = []
    check = manifest_mod._check_manifest
    monkeypatch.setattr(manifest_mod, "_check_manifest", lambda data: checked.append(1) or check(data))
    outside = [read_manifest(bundle), read_manifest(bundle)]
    assert len(checked) == 2  # no block: every read parses and checks
    with remember_manifests():
        first, again = read_manifest(bundle), read_manifest(bundle)
        assert len(checked) == 3
        assert first == again == outside[0] and first is not again
        assert verify(bundle, first).ok
        assert first.hashed_ok and not again.hashed_ok  # what verify hashed is never shared
        # an edited manifest (another file's digest) is read and checked afresh, and refused when bad
        data = json.loads((bundle / MANIFEST_FILE).read_text())
        data["files"].append({"path": "../x", "sha256": "sha256:" + "0" * 64, "size": 1})
        (bundle / MANIFEST_FILE).write_text(json.dumps(data))
        with pytest.raises(BundleError, match="escapes the bundle"):
            read_manifest(bundle)
        assert len(checked) == 4
        forget_manifests()  # the block goes on, holding nothing: the next read parses and checks again
        (bundle / MANIFEST_FILE).write_text(json.dumps({**data, "files": data["files"][:-1]}))
        read_manifest(bundle)
        read_manifest(bundle)
        assert len(checked) == 5
    assert manifest_mod._remembered is None  # nothing kept after the block


def test_hashing_in_chunks_gives_every_file_its_digest(bundle: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    one = freeze(bundle)  # one chunk: hashed in this thread
    monkeypatch.setattr(manifest_mod, "HASH_THREADS_FROM", 0)  # any bundle: the thread pool
    monkeypatch.setattr(manifest_mod, "HASH_CHUNK_BYTES", 1)  # a chunk per file
    assert freeze(bundle) == one
    assert [f.sha256 for f in one.files] == [sha256_file(bundle / f.path) for f in one.files]
    last = bundle / one.files[-1].path
    data = last.read_bytes()
    last.write_bytes(bytes([data[0] ^ 1]) + data[1:])  # same size: only the hash can tell
    assert verify(bundle).changed == [one.files[-1].path]
