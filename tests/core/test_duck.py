"""DuckDB connections carry lunasol's memory limit (pipeline.core.duck)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from pipeline.core import duck
from pipeline.core.errors import BadInput


def _limit(con: duckdb.DuckDBPyConnection) -> str:
    row = con.execute("SELECT current_setting('memory_limit')").fetchone()
    assert row is not None
    return str(row[0])


def test_default_limit_is_512_mib(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(duck.MEMORY_ENV, raising=False)
    con = duck.connect(tmp_path / "a.duckdb")
    try:
        assert _limit(con) == "512.0 MiB"
    finally:
        con.close()


def test_env_sets_the_limit_and_a_plain_connection_to_the_same_file_still_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(duck.MEMORY_ENV, "300MiB")
    path = tmp_path / "a.duckdb"
    plain = duckdb.connect(str(path))  # e.g. a test's or a tool's own connection, opened first
    try:
        con = duck.connect(path)  # a connect option would refuse here ("different configuration")
        try:
            assert _limit(con) == "300.0 MiB"
        finally:
            con.close()
    finally:
        plain.close()


def test_a_bad_value_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(duck.MEMORY_ENV, "lots")
    with pytest.raises(BadInput, match="LUNASOL_DUCKDB_MEMORY"):
        duck.connect(tmp_path / "a.duckdb")
    assert not (tmp_path / "a.duckdb").exists()  # refused before anything is opened
