"""`lunasol export-tables RUN --parquet s3://…` and `lunasol report RUN -o s3://…` against a real S3 server."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from pipeline import api
from pipeline.cli.app import app
from pipeline.core import objstore
from pipeline.report import write_report
from pipeline.testing.seaweed import S3Server
from tests.objstore.conftest import client

runner = CliRunner()


def test_export_tables_round_trips_every_table_through_a_bucket(demo_gate1: Path, bucket: str, s3: S3Server) -> None:
    url = f"s3://{bucket}/tables"
    res = runner.invoke(app, ["export-tables", str(demo_gate1), "--parquet", url, "--json"])
    assert res.exit_code == 0, res.output
    written = json.loads(res.stdout)["tables"]
    assert set(written) == set(api.TABLES)
    run = api.load_run(demo_gate1)
    fs = client()
    assert sorted(fs.ls(f"{bucket}/tables")) == sorted(f"{bucket}/tables/{t}.parquet" for t in api.TABLES)
    for name in api.TABLES:
        assert written[name] == f"{url}/{name}.parquet"
        got = pq.read_table(io.BytesIO(fs.cat(f"{bucket}/tables/{name}.parquet")))
        want = run.table(name)
        assert got.num_rows == want.num_rows and got.column_names == want.column_names, name
        assert got.to_pylist() == want.to_pylist(), name
    assert s3.secret_key not in res.output


def test_report_goes_to_keys_whole(
    demo_gate1: Path, bucket: str, s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clients: list[str] = []
    real_open = objstore.open_url

    def counted(url: str) -> tuple[object, str]:
        clients.append(url)
        return real_open(url)

    monkeypatch.setattr(objstore, "open_url", counted)
    url = f"s3://{bucket}/reports/r1"
    res = runner.invoke(app, ["report", str(demo_gate1), "-o", url])
    assert res.exit_code == 0, res.output
    # one storage client for the shards and one for the page, not one per file (400 took 100 s)
    assert len(clients) <= 3
    assert f"wrote {url}/index.html" in res.output
    page = client().cat(f"{bucket}/reports/r1/index.html")
    assert page.startswith(b"<!") and b"W-01" in page
    local, _ = write_report(demo_gate1, out=tmp_path / "r1")  # the same report on disk: every file, same bytes
    files = sorted(p.relative_to(local.parent).as_posix() for p in local.parent.rglob("*") if p.is_file())
    stored = sorted(k.removeprefix(f"{bucket}/reports/r1/") for k in client().find(f"{bucket}/reports/r1"))
    assert stored == files  # no temporary key left
    assert client().cat(f"{bucket}/reports/r1/data/c0.js") == (local.parent / "data" / "c0.js").read_bytes()


def test_export_with_wrong_credentials_is_one_line_exit_2(
    demo_gate1: Path, bucket: str, s3: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-" + s3.secret_key)
    url = f"s3://{bucket}/denied"
    res = runner.invoke(app, ["export-tables", str(demo_gate1), "--parquet", url])
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and "access denied" in lines[0] and url in lines[0]
    assert s3.secret_key not in res.output
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.secret_key)
    assert not client().exists(f"{bucket}/denied")


def test_file_url_tables_are_written_whole(demo_gate1: Path, tmp_path: Path) -> None:
    res = runner.invoke(app, ["export-tables", str(demo_gate1), "--parquet", f"file://{tmp_path}/t"])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == sorted(f"{t}.parquet" for t in api.TABLES)
