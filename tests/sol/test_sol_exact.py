"""Sol's CPU shortcuts give exactly what the plain computation gave (and never a stale answer)."""

from __future__ import annotations

import re
from typing import Any

import duckdb

from pipeline.sol.timeline import read_timelines

_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")


def python_timeline(events: list[dict[str, Any]]) -> dict[str, list[tuple[str, str]]]:
    """The compact lines as Sol made them in Python before DuckDB made them (the reference)."""
    out: dict[str, list[tuple[str, str]]] = {}
    for e in events:
        text = " ".join(str(e["text"] or "").split())
        text = _DIGEST.sub(lambda m: m.group(1)[:8], text)
        line = f"{e['event_id']} {e['stage'] or '-'}/{e['actor'] or '-'} {e['detail'] or e['kind']}: {text}"
        out.setdefault(e["cell_id"], []).append((str(e["detail"] or e["kind"]), line))
    return out


def test_timeline_lines_from_sql_rows_equal_the_per_event_python_ones() -> None:
    digest = "ab12" * 16
    texts = [
        None,
        "",
        "  plain   text\twith\ttabs\n\nand lines  ",
        "odd\x0bspaces\x1cand\x1d\x1e\x1fseparators\x85\xa0nbsp\u1680ogham\u2000\u2005\u200aem\u2028\u2029",
        "\u202fnarrow\u205fmath\u3000ideographic\u200bzero-width-is-not-space\ufeffbom",
        f"state sha256:{digest} then sha256:{digest}ff and sha256:{digest[:60]} short",
        f"sha256:{digest}sha256:{digest}",
        "SHA256:" + digest + " upper prefix stays",
        "x" * 190 + " sha256:" + digest,  # the digest is cut at 200 characters first
        "日本語 の テキスト 　 全角",
    ]
    con = duckdb.connect()
    con.execute("CREATE TABLE cells (cell_id VARCHAR, eligibility VARCHAR)")
    con.execute(
        "CREATE TABLE events (event_id VARCHAR, cell_id VARCHAR, seq INTEGER, stage VARCHAR, actor VARCHAR, "
        "kind VARCHAR, detail VARCHAR, tool_name VARCHAR, text VARCHAR)"
    )
    con.executemany("INSERT INTO cells VALUES (?, ?)", [("C1", "valid_behavior"), ("C2", "valid_behavior")])
    rows: list[tuple[Any, ...]] = []
    for i, text in enumerate(texts):
        stage = [None, "", "plan", "review"][i % 4]
        actor = [None, "", "operator", "controller"][(i + 1) % 4]
        detail = [None, "", "stage_started", "transition"][(i + 2) % 4]
        cell = "C1" if i % 2 else "C2"
        rows.append((f"{cell}-e{i:04d}", cell, 10 - i, stage, actor, "state_change", detail, None, text))
    con.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    ordered = sorted(rows, key=lambda r: (r[1], r[2]))
    names = ("event_id", "cell_id", "seq", "stage", "actor", "kind", "detail", "tool_name", "text")
    # as the SQL selects them: the first 200 characters of the text
    events = [dict(zip(names, (*r[:-1], (r[-1] or "")[:200]), strict=True)) for r in ordered]
    assert read_timelines(con) == python_timeline(events)
