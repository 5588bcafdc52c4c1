"""Hostile inputs through the CLI: every refusal is exit 2, one stderr line, no traceback, nothing left.

Table-driven over the verbs that read them (``run``, ``export``, ``bundle import``, ``validate``):
for each case the bundle (or source) bytes are unchanged and the runs directory (or the import
destination) holds nothing new. Limits are lowered through their env vars where a case would
otherwise need hundreds of megabytes.
"""

from __future__ import annotations

import base64
import json
import os
import random
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.bundle import freeze
from pipeline.bundle.synth import tree_snapshot
from pipeline.cli.app import app
from tests.conftest import DEMO_BUNDLE, DEMO_RECORDINGS

runner = CliRunner()
SESSION = "cells/C001/sessions/01-proposal-operator.jsonl"
REQUEST = "analysis-request.json"


def _append_line(b: Path, payload: bytes) -> None:
    with (b / SESSION).open("ab") as fh:
        fh.write(payload + b"\n")
    freeze(b)


def _request_text(b: Path, fn: Callable[[str], str]) -> None:
    path = b / REQUEST
    path.write_text(fn(path.read_text(encoding="utf-8")), encoding="utf-8")
    freeze(b)


def deep_array_line(b: Path) -> None:
    _append_line(b, b'{"type": "message", "content": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")


def deep_object_line(b: Path) -> None:
    _append_line(b, b'{"type": "message", "content": ' + b'{"a":' * 3_000 + b"1" + b"}" * 3_000 + b"}")


def huge_line(b: Path) -> None:
    _append_line(b, b'{"type": "message", "content": "' + b"x" * 20_000 + b'"}')


def huge_file(b: Path) -> None:
    for _ in range(50):
        _append_line(b, b'{"type": "message", "content": "' + b"y" * 1_000 + b'"}')


def empty_request(b: Path) -> None:
    (b / REQUEST).write_bytes(b"")
    freeze(b)


def blank_request(b: Path) -> None:
    (b / REQUEST).write_bytes(b"  \n")
    freeze(b)


def latin1_request(b: Path) -> None:
    raw = (b / REQUEST).read_bytes().replace(b'"allowed_history"', b'"allowed_h\xe9story"', 1)
    (b / REQUEST).write_bytes(raw)
    freeze(b)


def string_schema_version(b: Path) -> None:
    _request_text(b, lambda t: t.replace('"schema_version": 1', '"schema_version": "1"'))


def string_generation(b: Path) -> None:
    _request_text(b, lambda t: t.replace('"generation": 0', '"generation": "0"'))


def duplicate_request_key(b: Path) -> None:
    _request_text(
        b, lambda t: t.replace('"allowed_history": [],', '"allowed_history": [],\n  "allowed_history": [],', 1)
    )


def deep_request(b: Path) -> None:
    _request_text(b, lambda t: t.replace('"allowed_history": []', '"allowed_history": ' + "[" * 50_000 + "]" * 50_000))


def duplicate_manifest_key(b: Path) -> None:
    path = b / "manifest.json"
    text = path.read_text()
    path.write_text(text.replace('"schema_version": 1', '"schema_version": 1,\n  "schema_version": 1'))


def bool_manifest_version(b: Path) -> None:
    path = b / "manifest.json"
    path.write_text(path.read_text().replace('"schema_version": 1', '"schema_version": true'))


BUNDLE_CASES: list[tuple[Callable[[Path], None], dict[str, str], str]] = [
    (deep_array_line, {}, f"{SESSION} line 2: JSON nested too deeply"),
    (deep_object_line, {}, f"{SESSION} line 2: JSON nested too deeply"),
    (huge_line, {"LUNASOL_MAX_LINE_BYTES": "16384"}, f"{SESSION} line 2: the line is 20,034 bytes, over the 16,384"),
    (huge_file, {"LUNASOL_MAX_FILE_BYTES": "32768"}, f"{SESSION}: the log file is "),
    (empty_request, {}, f"{REQUEST}: empty file"),
    (blank_request, {}, f"{REQUEST}: empty file"),
    (latin1_request, {}, f"{REQUEST}: not UTF-8 (line "),
    (string_schema_version, {}, f"{REQUEST}: schema_version: Input should be a valid integer"),
    (string_generation, {}, f"{REQUEST}: generation: Input should be a valid integer"),
    (duplicate_request_key, {}, f"{REQUEST}: key 'allowed_history' appears twice"),
    (deep_request, {}, f"{REQUEST}: JSON nested too deeply"),
    (duplicate_manifest_key, {}, "manifest.json: key 'schema_version' appears twice"),
    (bool_manifest_version, {}, "manifest.json: unsupported schema_version True"),
]
BUNDLE_IDS = [c[0].__name__ for c in BUNDLE_CASES]


def _one_refusal(output: str, message: str) -> None:
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    assert lines[0].startswith("lunasol: "), output
    assert message in lines[0], output
    assert "Traceback" not in output


@pytest.fixture
def demo_copy(tmp_path: Path) -> Path:
    b = tmp_path / "bundle"
    shutil.copytree(DEMO_BUNDLE, b)
    return b


@pytest.mark.parametrize("verb", ["run", "export"])
@pytest.mark.parametrize(("mutate", "env", "message"), BUNDLE_CASES, ids=BUNDLE_IDS)
def test_hostile_bundle_is_refused_cleanly(
    demo_copy: Path,
    runs_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    verb: str,
    mutate: Callable[[Path], None],
    env: dict[str, str],
    message: str,
) -> None:
    mutate(demo_copy)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    before = tree_snapshot(demo_copy)
    args = [verb, str(demo_copy), "--run-id", "r", "--runs-dir", str(runs_dir)]
    if verb == "run":
        args += ["--replay", str(DEMO_RECORDINGS)]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    _one_refusal(result.output, message)
    assert tree_snapshot(demo_copy) == before  # the bundle is never written
    assert list(runs_dir.iterdir()) == []  # no run.json, ledger or lock left behind


# -- imports ---------------------------------------------------------------------------------------


def _eval_zip(path: Path, samples: dict[str, bytes], *, compress: int = zipfile.ZIP_DEFLATED) -> Path:
    header = {"eval": {"task": "t", "model": "m"}, "status": "success", "version": 2}
    with zipfile.ZipFile(path, "w", compression=compress) as zf:
        zf.writestr("header.json", json.dumps(header))
        for name, data in samples.items():
            zf.writestr(f"samples/{name}", data)
    return path


def _sample(content: str) -> bytes:
    msgs = [{"role": "user", "content": "go"}, {"role": "assistant", "content": content}]
    return json.dumps({"id": 1, "epoch": 1, "input": "go", "messages": msgs}).encode()


def eval_bomb(src: Path) -> Path:
    # 40 MiB of one repeated character compresses about 1000x: refused by ratio before it is inflated
    return _eval_zip(src / "bomb.eval", {"1_epoch_1.json": _sample(" " * (40 * 1024 * 1024))})


def eval_big_member(src: Path) -> Path:
    noise = base64.b64encode(random.Random(3).randbytes(300_000)).decode()  # incompressible: no ratio refusal
    return _eval_zip(src / "big.eval", {"1_epoch_1.json": _sample(noise)})


def eval_deep_member(src: Path) -> Path:
    deep = b'{"id": 1, "epoch": 1, "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    return _eval_zip(src / "deep.eval", {"1_epoch_1.json": deep})


def inspect_json_deep(src: Path) -> Path:
    path = src / "deep.json"
    sample = '{"id": 1, "epoch": 1, "input": "go", "messages": ' + "[" * 100_000 + "]" * 100_000 + "}"
    path.write_text('{"eval": {"task": "t"}, "version": 2, "status": "success", "samples": [' + sample + "]}")
    return path


IMPORT_CASES: list[tuple[Callable[[Path], Path], dict[str, str], str]] = [
    (eval_bomb, {}, "bomb.eval member samples/1_epoch_1.json: decompresses"),
    (eval_big_member, {"LUNASOL_MAX_DOC_BYTES": "262144"}, "big.eval member samples/1_epoch_1.json: the decompressed"),
    (eval_deep_member, {}, "deep.eval member samples/1_epoch_1.json: JSON nested too deeply"),
    (inspect_json_deep, {}, "JSON nested too deeply"),
]


@pytest.mark.parametrize(("make", "env", "message"), IMPORT_CASES, ids=[c[0].__name__ for c in IMPORT_CASES])
def test_hostile_import_is_refused_cleanly(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    make: Callable[[Path], Path],
    env: dict[str, str],
    message: str,
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    log = make(src)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    before = tree_snapshot(src)
    dest = tmp_path / "out" / "bundle"
    result = runner.invoke(app, ["bundle", "import", "inspect", str(log), str(dest)])
    assert result.exit_code == 2, result.output
    _one_refusal(result.output, message)
    assert tree_snapshot(src) == before
    assert not dest.exists()
    assert list((tmp_path / "out").iterdir()) == []  # no temporary import directory left either


def test_a_member_within_the_limits_still_imports(tmp_path: Path) -> None:
    src = tmp_path / "ok.eval"
    _eval_zip(src, {"1_epoch_1.json": _sample("a normal answer")})
    result = runner.invoke(app, ["bundle", "import", "inspect", str(src), str(tmp_path / "b")])
    assert result.exit_code == 0, result.output


# -- cards -----------------------------------------------------------------------------------------


def test_a_5000_deep_yaml_card_is_refused_cleanly(tmp_path: Path) -> None:
    card = tmp_path / "deep.yaml"
    card.write_text("proposal_id: " + "[" * 5_000 + "]" * 5_000 + "\n")
    before = card.read_bytes()
    result = runner.invoke(app, ["validate", str(card)])
    assert result.exit_code == 2, result.output
    _one_refusal(result.output, "YAML nested too deeply")
    assert card.read_bytes() == before


def test_a_card_file_over_the_document_limit_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LUNASOL_MAX_DOC_BYTES", "4096")
    card = tmp_path / "big.yaml"
    card.write_text("proposal_id: P-01\nnote: " + "z" * 5_000 + "\n")
    result = runner.invoke(app, ["validate", str(card)])
    assert result.exit_code == 2, result.output
    _one_refusal(result.output, "the file is 5,")


def test_an_invalid_limit_setting_is_one_line(demo_copy: Path, runs_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LUNASOL_MAX_LINE_BYTES", "lots")
    result = runner.invoke(app, ["export", str(demo_copy), "--run-id", "r", "--runs-dir", str(runs_dir)])
    assert result.exit_code == 2, result.output
    _one_refusal(result.output, "invalid LUNASOL_MAX_LINE_BYTES")
    assert list(runs_dir.iterdir()) == []


def test_env_is_clean() -> None:
    """The limits are read at call time: no test above leaks a lowered limit into the next."""
    assert not any(k.startswith("LUNASOL_MAX_") for k in os.environ)
