"""`lunasol bundle import FORMAT s3://… DEST` against a real S3 server (SeaweedFS): same bundle as from disk,
a source record `bundle verify --source` checks, resume without refetching, one-line refusals, no credential
written anywhere."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline import catalog
from pipeline.adapters import import_bundle, import_from_url, remote
from pipeline.artifacts import schemas
from pipeline.bundle.manifest import MANIFEST_FILE, verify
from pipeline.bundle.sources import SOURCES_FILE, read_sources
from pipeline.cli.app import app
from pipeline.core.canonical import sha256_bytes
from pipeline.core.objstore import list_objects
from pipeline.testing.seaweed import S3Server
from tests.adapters.adapter_helpers import FOREIGN_FIXTURES
from tests.conftest import SHARED_DATA
from tests.objstore.conftest import client, upload

runner = CliRunner()


class Interrupted(BaseException):
    """Stands for ^C or a kill: not an Exception, so nothing on the way may catch it as an error."""


def _inspect_logs(root: Path) -> Path:
    """An Inspect log set: the zstd .eval fixture, plus the public Inspect test logs when present."""
    logs = root / "logs"
    logs.mkdir(parents=True)
    shutil.copy(FOREIGN_FIXTURES / "inspect" / "mockllm-tools.eval", logs / "mockllm-tools.eval")
    public = SHARED_DATA / "inspect-ai-logs" / "tests" / "log" / "test_eval_log"
    if public.is_dir():
        for p in sorted(public.glob("log_read_sample.*")):
            shutil.copy(p, logs / p.name)
    return logs


def _mixed(root: Path) -> Path:
    """A folder of several formats (Codex, Gemini CLI, mini-SWE-agent, Inspect) in subfolders."""
    mixed = root / "mixed"
    for name in ("codex", "gemini-cli", "mini-swe-agent"):
        shutil.copytree(FOREIGN_FIXTURES / name, mixed / name)
    shutil.copytree(FOREIGN_FIXTURES / "inspect", mixed / "inspect", ignore=shutil.ignore_patterns("*.py"))
    return mixed


def _digest(bundle: Path) -> str:
    return sha256_bytes((bundle / MANIFEST_FILE).read_bytes())


def _no_secret_under(root: Path, s3: S3Server) -> None:
    for p in root.rglob("*"):
        if p.is_file():
            data = p.read_bytes()
            assert s3.secret_key.encode() not in data, p
            assert s3.access_key.encode() not in data, p


@pytest.mark.parametrize("make", [_inspect_logs, _mixed], ids=["inspect", "mixed"])
def test_bucket_import_gives_the_bundle_of_the_same_files_from_disk(
    make: object, bucket: str, s3: S3Server, tmp_path: Path
) -> None:
    src = make(tmp_path / "src")  # type: ignore[operator]
    n = upload(src, f"s3://{bucket}/runs/{src.name}")
    # the same DEST name: a bundle's request names it (analysis_run_id)
    from_disk = import_bundle("auto", src, tmp_path / "disk" / "b")
    url = f"s3://{bucket}/runs/{src.name}"
    dest = tmp_path / "bucket" / "b"
    result = runner.invoke(app, ["bundle", "import", "auto", url, str(dest)])
    assert result.exit_code == 0, result.output
    assert f"fetched {n} objects" in result.output
    assert _digest(dest) == _digest(tmp_path / "disk" / "b")
    assert from_disk.cells > 0 and f"imported {from_disk.cells} cells" in result.output
    assert verify(dest).ok  # the source record is beside the manifest, not an extra file
    record = read_sources(dest)
    assert record is not None and record.url == url and len(record.objects) == n
    art = catalog.get("manifest-sources")
    assert schemas.load_artifact(dest / SOURCES_FILE, art.name, art.model) == record  # at the current version
    manifest = json.loads((dest / MANIFEST_FILE).read_text())
    frozen = {f["path"]: f["sha256"] for f in manifest["files"]}
    kept = [o for o in record.objects if o.path is not None]
    assert kept and all(frozen[o.path] == o.sha256 for o in kept)
    assert all(o.etag and o.url == f"{url}/{o.key}" for o in record.objects)
    assert not remote.staging_dir(dest).exists()
    _no_secret_under(tmp_path / "bucket", s3)
    assert s3.secret_key not in result.output and s3.access_key not in result.output


def test_verify_source_names_the_objects_changed_gone_and_added(bucket: str, s3: S3Server, tmp_path: Path) -> None:
    src = _mixed(tmp_path / "src")
    url = f"s3://{bucket}/mixed"
    upload(src, url)
    import_from_url("auto", url, tmp_path / "b")
    ok = runner.invoke(app, ["bundle", "verify", str(tmp_path / "b"), "--source"])
    assert ok.exit_code == 0, ok.output
    assert "unchanged since the import" in ok.output
    fs = client()
    fs.pipe(f"{bucket}/mixed/mini-swe-agent/timeparse-1.traj.json", b'{"changed": true}')
    fs.rm(f"{bucket}/mixed/codex/README.md")
    fs.pipe(f"{bucket}/mixed/new.jsonl", b"{}\n")
    res = runner.invoke(app, ["bundle", "verify", str(tmp_path / "b"), "--source"])
    assert res.exit_code == 1, res.output
    assert f"source changed: {url}/mini-swe-agent/timeparse-1.traj.json" in res.output
    assert f"source missing: {url}/codex/README.md" in res.output
    assert f"source added: {url}/new.jsonl" in res.output
    assert "ok: " in res.output.splitlines()[0]  # the local bundle itself did not change
    offline = runner.invoke(app, ["bundle", "verify", str(tmp_path / "b")])
    assert offline.exit_code == 0 and f"source: {url}" in offline.output


def test_an_interrupted_import_resumes_without_refetching(
    bucket: str, s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = _mixed(tmp_path / "src")
    url = f"s3://{bucket}/mixed"
    n = upload(src, url)
    real = remote._fetch_one
    calls: list[str] = []
    armed = [True]

    def flaky(fs: object, rpath: str, local: Path, size: int) -> str:
        calls.append(rpath)
        if armed[0] and len(calls) == 4:
            raise Interrupted  # the process stopped mid-import (^C, a kill)
        return real(fs, rpath, local, size)

    monkeypatch.setattr(remote, "_fetch_one", flaky)
    monkeypatch.setattr(remote, "FETCH_WORKERS", 1)  # one at a time: exactly three are whole before ^C
    dest = tmp_path / "b"
    with pytest.raises(Interrupted):
        import_from_url("auto", url, dest)
    assert not dest.exists()
    stage = remote.staging_dir(dest)
    whole = sorted(p for p in (stage / "objects").rglob("*") if p.is_file() and not p.name.endswith(".part"))
    logged = [json.loads(line)["key"] for line in (stage / remote.STATE_FILE).read_text().splitlines()]
    assert len(logged) >= 3 and len(whole) >= len(logged)  # three (or, racing the ^C, a few more) whole objects
    calls.clear()
    armed[0] = False
    result, stats = import_from_url("auto", url, dest)
    assert (stats.reused, stats.fetched, stats.objects) == (len(logged), n - len(logged), n)
    assert len(calls) == n - len(logged)  # each object logged whole by the first run was not asked for again
    assert not [c for c in calls if any(c.endswith("/" + k) for k in logged)]
    assert result.cells > 0 and not stage.exists()
    assert _digest(dest) == _digest(import_bundle("auto", src, tmp_path / "disk" / "b").dest)


def test_a_changed_object_is_fetched_again_on_resume(bucket: str, s3: S3Server, tmp_path: Path) -> None:
    src = _mixed(tmp_path / "src")
    url = f"s3://{bucket}/mixed"
    upload(src, url)
    dest = tmp_path / "b"
    single, listing = list_objects(url)
    remote.fetch(url, dest, single, listing)  # a whole fetch, then "interrupted" before the import
    client().pipe(
        f"{bucket}/mixed/mini-swe-agent/timeparse-1.traj.json",
        (src / "mini-swe-agent" / "timeparse-1.traj.json").read_bytes() + b"\n",
    )
    _, stats = import_from_url("auto", url, dest)
    assert stats.fetched == 1 and stats.reused == len(listing) - 1


@pytest.mark.parametrize(
    ("case", "expect"),
    [
        ("missing-bucket", "not found"),
        ("wrong-secret", "access denied"),
        ("empty-prefix", "no object under it"),
    ],
)
def test_bad_sources_are_one_line_exit_2_and_leave_nothing(
    case: str, expect: str, bucket: str, s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    upload(_mixed(tmp_path / "src"), f"s3://{bucket}/mixed")
    url = {"missing-bucket": "s3://no-such-bucket-lunasol/x", "empty-prefix": f"s3://{bucket}/nothing-here"}.get(
        case, f"s3://{bucket}/mixed"
    )
    if case == "wrong-secret":
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-" + s3.secret_key)
    out = tmp_path / "out"
    out.mkdir()
    res = runner.invoke(app, ["bundle", "import", "auto", url, str(out / "b")])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and expect in lines[0] and url in lines[0], res.output
    assert "Traceback" not in res.output and s3.secret_key not in res.output
    assert list(out.iterdir()) == []


def test_no_credential_in_a_url_reaches_an_error(bucket: str, s3: S3Server, tmp_path: Path) -> None:
    url = f"s3://{bucket}/x?X-Amz-Signature=s3cr3tsig"
    res = runner.invoke(app, ["bundle", "import", "auto", url, str(tmp_path / "b")])
    assert res.exit_code == 2 and "s3cr3tsig" not in res.output, res.output


def test_a_missing_backend_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "gcsfs", None)  # as if gcsfs were not installed
    res = runner.invoke(app, ["bundle", "import", "auto", "gs://bucket/logs", str(tmp_path / "b")])
    assert res.exit_code == 2, res.output
    assert "gcsfs" in res.output and "lunasol[gcs]" in res.output
    assert not (tmp_path / "b").exists()


def test_one_object_imports_as_the_one_file_from_disk(bucket: str, s3: S3Server, tmp_path: Path) -> None:
    logs = _inspect_logs(tmp_path / "src")
    upload(logs, f"s3://{bucket}/logs")
    one = logs / "mockllm-tools.eval"
    url = f"s3://{bucket}/logs/mockllm-tools.eval"
    result, stats = import_from_url("inspect", url, tmp_path / "bucket" / "b")
    disk = import_bundle("inspect", one, tmp_path / "disk" / "b")
    assert stats.objects == 1 and result.cells == disk.cells > 0
    assert _digest(tmp_path / "bucket" / "b") == _digest(tmp_path / "disk" / "b")
    record = read_sources(tmp_path / "bucket" / "b")
    assert record is not None and record.single and record.objects[0].path == "raw/mockllm-tools.eval"
    res = runner.invoke(app, ["bundle", "verify", str(tmp_path / "bucket" / "b"), "--source"])
    assert res.exit_code == 0, res.output


def test_a_file_url_is_a_local_folder(tmp_path: Path) -> None:
    src = _mixed(tmp_path / "src")
    result, _ = import_from_url("auto", f"file://{src}", tmp_path / "url" / "b")
    import_bundle("auto", src, tmp_path / "disk" / "b")
    assert result.cells > 0 and _digest(tmp_path / "url" / "b") == _digest(tmp_path / "disk" / "b")


def test_a_killed_import_process_resumes_without_refetching(bucket: str, s3: S3Server, tmp_path: Path) -> None:
    """The real thing: `lunasol bundle import` killed (SIGKILL) mid-fetch, then run again."""
    import os
    import signal
    import subprocess
    import sys
    import time

    src = _mixed(tmp_path / "src")
    for i in range(400):  # many small objects: the fetch lasts long enough to be killed part way
        (src / "notes" / f"{i:03d}.txt").parent.mkdir(exist_ok=True)
        (src / "notes" / f"{i:03d}.txt").write_text(f"note {i}\n")
    url = f"s3://{bucket}/mixed"
    fs = client()
    files = sorted(p for p in src.rglob("*") if p.is_file())
    fs.put([str(p) for p in files], [f"{bucket}/mixed/{p.relative_to(src).as_posix()}" for p in files])
    dest = tmp_path / "out" / "b"
    log = remote.staging_dir(dest) / remote.STATE_FILE
    cmd = [
        sys.executable,
        "-c",
        "from pipeline.cli.app import main; main()",
        "bundle",
        "import",
        "auto",
        url,
        str(dest),
    ]
    proc = subprocess.Popen(cmd, env=os.environ.copy(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if log.is_file() and len(log.read_text().splitlines()) >= 20:
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the import finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not dest.exists()
    logged = {json.loads(line)["key"] for line in log.read_text().splitlines() if line.endswith("}")}
    assert 20 <= len(logged) < len(files)
    res = runner.invoke(app, ["bundle", "import", "auto", url, str(dest), "--json"])
    assert res.exit_code == 0, res.output
    source = json.loads(res.stdout)["source"]
    assert source["reused"] >= len(logged) and source["fetched"] == len(files) - source["reused"]
    assert _digest(dest) == _digest(import_bundle("auto", src, tmp_path / "disk" / "b").dest)
