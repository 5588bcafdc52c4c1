"""The call log read back: one row at a time, torn last lines, line separators inside strings, used keys."""

from __future__ import annotations

import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.errors import BadInput
from pipeline.models.calllog import CallLog, iter_calls, read_calls, used_keys


def row(n: int, outcome: str = "ok", **extra: Any) -> dict[str, Any]:
    return {
        "role": "luna",
        "cell_id": f"C{n:05d}",
        "template_hash": "sha256:" + "7" * 64,
        "keys": [f"sha256:{n:064d}"],
        "mode": "live",
        "model": "openai/m",
        "prompt_tokens": 9000,
        "completion_tokens": 700,
        "cost_usd": None,
        "latency_ms": 80.5,
        "attempts": 1,
        "transport_retries": 0,
        "outcome": outcome,
        "errors": [],
        **extra,
    }


def write_log(run: Path, rows: list[dict[str, Any]]) -> None:
    log = CallLog(run)
    for r in rows:
        log.append(r)
    log.close()


def test_a_line_separator_inside_an_error_text_is_not_the_end_of_a_row(tmp_path: Path) -> None:
    # canonical_json keeps UTF-8 as is: a model's text with U+2028 (or U+0085) stays raw in the line
    write_log(tmp_path, [row(1, "invalid", errors=["answer: 'a\u2028b\x85c'"]), row(2)])
    rows = read_calls(tmp_path)
    assert [r["cell_id"] for r in rows] == ["C00001", "C00002"]
    assert rows[0]["errors"] == ["answer: 'a\u2028b\x85c'"]


def test_a_torn_last_line_is_skipped_and_a_torn_line_before_others_is_one_error(tmp_path: Path) -> None:
    write_log(tmp_path, [row(1), row(2)])
    with (tmp_path / "calls.jsonl").open("ab") as fh:
        fh.write(b'{"role": "luna", "cel')  # a crash mid-write
    assert [r["cell_id"] for r in iter_calls(tmp_path)] == ["C00001", "C00002"]
    with (tmp_path / "calls.jsonl").open("ab") as fh:
        fh.write(b"\n\n")  # blank lines after it: still the last row
    assert len(read_calls(tmp_path)) == 2
    write_log(tmp_path, [row(3)])
    with pytest.raises(BadInput, match=r"calls.jsonl line 3 is not JSON"):
        read_calls(tmp_path)
    (tmp_path / "calls.jsonl").write_bytes(b'{"role": "\xff"}\n' + (tmp_path / "calls.jsonl").read_bytes())
    with pytest.raises(BadInput, match=r"line 1 is not JSON"):  # not UTF-8: not JSON either, one line
        read_calls(tmp_path)


def test_rows_are_upgraded_one_by_one_and_a_newer_one_is_refused_by_its_row(tmp_path: Path) -> None:
    (tmp_path / "calls.jsonl").write_text('{"role": "luna"}\n{"schema_version": 9, "role": "sol"}\n')
    it = iter_calls(tmp_path)
    assert next(it)["schema_version"] == 1  # the first row comes before the second is read
    with pytest.raises(BadInput, match=r"calls.jsonl row 2 has schema_version 9, newer"):
        next(it)
    assert read_calls(tmp_path / "no-run") == []


def test_used_keys_are_the_failed_calls_and_with_every_each_finished_one(tmp_path: Path) -> None:
    write_log(tmp_path, [row(1), row(2, "check_failed"), row(3, "interrupted"), row(4, "cancelled")])
    assert used_keys(tmp_path) == {f"sha256:{2:064d}"}
    assert used_keys(tmp_path, every=True) == {f"sha256:{1:064d}", f"sha256:{2:064d}"}
    assert used_keys(tmp_path / "no-run") == frozenset()


def test_the_used_keys_of_a_long_log_are_read_in_constant_memory(tmp_path: Path) -> None:
    # Every model stage's client reads the log at its start; at 100,000 cells it holds ~108,000 rows,
    # which read whole as dicts took ~370 MiB for a moment (Sol's peak).
    write_log(tmp_path, [row(n, "ok" if n % 1000 else "invalid") for n in range(20_000)])
    size = (tmp_path / "calls.jsonl").stat().st_size
    assert size > 8_000_000
    tracemalloc.start()
    try:
        keys = used_keys(tmp_path, every=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(keys) == 20
    assert peak < size / 20, f"{peak:,} bytes held at once reading a {size:,}-byte log"
