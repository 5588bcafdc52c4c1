"""DuckDB connections carry lunasol's memory limit (pipeline.core.duck)."""

from __future__ import annotations

import os
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


def _other_process(code: str) -> str:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    return (out.stdout + out.stderr).strip().splitlines()[-1]


def test_a_file_is_held_exactly_while_a_connection_to_it_is_open(tmp_path: Path) -> None:
    path = tmp_path / "a.duckdb"
    opened = f"import duckdb; c = duckdb.connect({str(path)!r}"
    writes = f"{opened}); c.execute('CREATE TABLE IF NOT EXISTS u (i INT)'); print('wrote')"
    con = duck.connect(path)
    con.execute("CREATE TABLE t AS SELECT range AS i FROM range(1000)")
    assert "lock" in _other_process(writes).lower()  # held, as a file connection holds it
    con.close()
    assert _other_process(writes) == "wrote"  # released, and the table was checkpointed into the file
    reads = f"{opened}, read_only=True); print(c.execute('SELECT count(*) FROM t').fetchall()[0][0])"
    assert _other_process(reads) == "1000"


def test_connections_share_one_instance_yet_see_only_their_own_file(tmp_path: Path) -> None:
    a, b = duck.connect(tmp_path / "a.duckdb"), duck.connect(tmp_path / "b.duckdb")
    try:
        a.execute("CREATE TABLE only_a (i INT)")
        b.execute("CREATE TEMP TABLE only_b_temp (i INT)")
        assert duck.has_table(a, "only_a") and not duck.has_table(b, "only_a")
        assert duck.has_table(b, "only_b_temp") and not duck.has_table(a, "only_b_temp")  # temp: per connection
        again = duck.connect(tmp_path / "a.duckdb")  # a second connection to an attached file
        assert duck.has_table(again, "only_a")
        again.close()
        cur = a.cursor()  # a cursor of a connection sees the same file, not the hub's own database
        assert duck.has_table(cur, "only_a")
        cur.close()
        assert duck.has_table(a, "only_a")  # the first one is still open
        dbs = {r[0] for r in a.execute("SELECT database_name FROM duckdb_databases()").fetchall()}
        assert {"a", "b"} <= dbs  # one instance holds both files
        spills = a.execute("SELECT current_setting('temp_directory')").fetchall()[0][0]
        assert spills == os.path.realpath(tmp_path / "b.duckdb") + ".tmp"  # next to a file, never the cwd
    finally:
        a.close()
        b.close()


def test_the_same_file_read_only_and_read_write_at_once_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "a.duckdb"
    duck.connect(path).close()
    ro = duck.connect(path, read_only=True)
    try:
        with pytest.raises(duckdb.ConnectionException, match="different configuration"):
            duck.connect(path)
    finally:
        ro.close()
    rw = duck.connect(path)  # after the read-only one closed: fine
    rw.close()


def test_the_last_close_hands_the_instance_memory_back_and_the_next_open_has_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(duck.MEMORY_ENV, raising=False)
    con = duck.connect(tmp_path / "a.duckdb")
    con.execute("CREATE TABLE t AS SELECT range AS i FROM range(100000)")
    con.close()
    hub = duck._HUB._con
    assert not duck._HUB._files, sorted(duck._HUB._files)  # no file is held by a connection another test leaked
    assert hub.execute("SELECT current_setting('memory_limit')").fetchall()[0][0] != "512.0 MiB"  # asked back
    again = duck.connect(tmp_path / "a.duckdb", read_only=True)
    try:
        assert _limit(again) == "512.0 MiB"
    finally:
        again.close()


class _Seen:
    """The hub's connection, recording the memory limit each DETACH ran under."""

    def __init__(self, con: object) -> None:
        self.con = con
        self.detached: list[tuple[str, str]] = []

    def execute(self, sql: str, *args: object) -> object:
        if sql.startswith("DETACH"):
            limit = self.con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0]  # type: ignore[attr-defined]
            self.detached.append((sql.split()[1].strip('"'), limit))
        return self.con.execute(sql, *args)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self.con, name)


@pytest.mark.parametrize("user", [None, "300MiB"])
def test_the_checkpoint_of_a_written_file_runs_under_its_own_smaller_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, user: str | None
) -> None:
    """A DETACH checkpoints the writes: under the shared 512 MiB one took +480 MiB (Luna's peak at 100,000 cells)."""
    if user is None:
        monkeypatch.delenv(duck.MEMORY_ENV, raising=False)
    else:
        monkeypatch.setenv(duck.MEMORY_ENV, user)
    warm = duck.connect(tmp_path / "warm.duckdb")  # the hub's instance exists before it is watched
    warm.close()
    seen = _Seen(duck._HUB._con)
    monkeypatch.setattr(duck._HUB, "_con", seen)
    con = duck.connect(tmp_path / "w.duckdb")
    con.execute("CREATE TABLE t AS SELECT range AS i FROM range(1000)")
    con.close()
    ro = duck.connect(tmp_path / "w.duckdb", read_only=True)
    ro.close()
    # a file closed while another stays attached keeps the shared limit: a query on the other may be running
    other, kept = duck.connect(tmp_path / "x.duckdb"), duck.connect(tmp_path / "y.duckdb")
    other.close()
    kept.close()
    want = "300.0 MiB" if user else "128.0 MiB"
    shared = "300.0 MiB" if user else "512.0 MiB"
    assert seen.detached == [("w", want), ("w", shared), ("x", shared), ("y", want)]


def test_a_limited_block_has_its_own_limit_then_lunasols_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LUNASOL_DUCKDB_MEMORY", raising=False)
    con = duck.connect(tmp_path / "x.duckdb")
    try:
        with pytest.raises(RuntimeError), duck.limited(con, "64MiB"):
            assert _limit(con) == "64.0 MiB"
            raise RuntimeError("a failed statement")
        assert _limit(con) == "512.0 MiB"  # restored after an error too
        con.execute("SET threads = 2")
        with pytest.raises(RuntimeError), duck.limited(con, "64MiB", threads=1):
            assert con.execute("SELECT current_setting('threads')").fetchall()[0][0] == 1
            raise RuntimeError("a failed sort")
        assert con.execute("SELECT current_setting('threads')").fetchall()[0][0] == 2  # the threads it had
        assert _limit(con) == "512.0 MiB"
        monkeypatch.setenv("LUNASOL_DUCKDB_MEMORY", "1GiB")  # the user's limit is kept
        con.execute("SET memory_limit = '1GiB'")
        with duck.limited(con, "64MiB"):
            assert _limit(con) == "1.0 GiB"
    finally:
        con.close()


@pytest.mark.parametrize(
    ("held_mib", "share"),
    [
        (100, "512MiB"),
        (350, "512MiB"),
        (400, "480MiB"),
        (600, "326MiB"),
        (900, "256MiB"),
        (3000, "256MiB"),
        (None, "512MiB"),
    ],
)
def test_budget_share_is_what_the_process_leaves_of_its_budget(
    monkeypatch: pytest.MonkeyPatch, held_mib: int | None, share: str
) -> None:
    # what keeps the process under 1 GiB (its room / 1.3), between 256 and 512 MiB; unknown memory (not Linux): 512
    from pipeline.core import memory

    monkeypatch.setattr(memory, "resident_bytes", lambda: None if held_mib is None else held_mib << 20)
    assert duck.budget_share() == share


def test_resident_bytes_is_this_process_rss() -> None:
    from pipeline.core.memory import resident_bytes

    before = resident_bytes()
    assert before is not None and before > 10 << 20
    block = bytearray(64 << 20)  # touched: 64 MiB more resident
    after = resident_bytes()
    assert after is not None and after - before >= 60 << 20
    del block


def test_the_coordinator_runs_under_its_share_of_the_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The Coordinator's DuckDB takes what the process leaves of its budget, then lunasol's limit again.
    from pipeline.coordinator import groups
    from pipeline.core import memory
    from tests.coordinator.test_coordinator import build

    monkeypatch.delenv(duck.MEMORY_ENV, raising=False)
    monkeypatch.setattr(memory, "resident_bytes", lambda: 600 << 20)
    seen: list[str] = []
    run_sql = groups._run_sql

    def spy(con: duckdb.DuckDBPyConnection) -> None:
        seen.append(_limit(con))
        run_sql(con)

    monkeypatch.setattr(groups, "_run_sql", spy)
    ir = build(tmp_path)
    groups.run_coordinator(ir, tmp_path / "run")
    assert seen == ["326.0 MiB"]
    con = duck.connect(ir)
    try:
        assert _limit(con) == "512.0 MiB"
    finally:
        con.close()
