"""Sol's CPU shortcuts give exactly what the plain computation gave (and never a stale answer)."""

from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path
from typing import Any

import duckdb

from pipeline.core import duck
from pipeline.core.canonical import digest, sha256_text
from pipeline.ir.export import export
from pipeline.models.budget import role_budget
from pipeline.models.client import ModelClient
from pipeline.sol.evidence import shown_among, shown_events
from pipeline.sol.partition import Chunk
from pipeline.sol.plan import MapCall, maps_digest
from pipeline.sol.reuse import map_key
from pipeline.sol.stage import MAP_ROLE
from pipeline.sol.timeline import LOW_VALUE, fit_timelines, read_timelines, timeline_chars
from pipeline.sol.timeline_cache import TABLE, open_store
from tests.sol.sol_helpers import make_bundle

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


def reference_fit(lines: dict[str, list[tuple[str, str]]], budget: int) -> tuple[dict[str, list[str]], int]:
    """fit_timelines as it was written before its sizes were counted with map (the reference)."""

    def size(t: dict[str, list[str]]) -> int:
        return sum(len(x) + 1 for v in t.values() for x in v)

    full = {c: [ln for _, ln in v] for c, v in lines.items()}
    if size(full) <= budget:
        return full, 0
    kept = {c: [ln for d, ln in v if d not in LOW_VALUE] for c, v in lines.items()}
    omitted = sum(len(v) for v in lines.values()) - sum(len(v) for v in kept.values())
    if size(kept) > budget and kept:
        per_cell = max(budget // len(kept) - 120, 200)
        for c, v in kept.items():
            if sum(len(x) + 1 for x in v) <= per_cell:
                continue
            head: list[str] = []
            tail: list[str] = []
            used = 0
            i, j = 0, len(v) - 1
            while i <= j:
                nxt = v[i] if len(head) <= len(tail) else v[j]
                if used + len(nxt) + 1 > per_cell:
                    break
                used += len(nxt) + 1
                if len(head) <= len(tail):
                    head.append(nxt)
                    i += 1
                else:
                    tail.insert(0, nxt)
                    j -= 1
            cut = len(v) - len(head) - len(tail)
            omitted += cut
            kept[c] = [*head, f"[... {cut} events omitted here to fit the prompt ...]", *tail]
    if omitted:
        for c in kept:
            dropped_low = sum(1 for d, _ in lines[c] if d in LOW_VALUE)
            if dropped_low:
                kept[c].insert(0, f"[{dropped_low} stage-start / handoff / artifact lines omitted in this cell]")
    return kept, omitted


def test_fit_timelines_equals_the_reference_on_every_path() -> None:
    rng = random.Random(7)
    keys = [*sorted(LOW_VALUE), "transition", "message", "error"]
    for _ in range(300):
        lines = {
            f"C{c:03d}": [
                (rng.choice(keys), f"C{c:03d}-e{k:04d} " + "x" * rng.randrange(0, 160))
                for k in range(rng.randrange(0, 30))
            ]
            for c in range(rng.randrange(0, 12))
        }
        total = sum(timeline_chars(v) for v in lines.values())
        assert total == sum(len(ln) + 1 for v in lines.values() for _, ln in v)
        for budget in (0, 1, 400, total // 3, total // 2, total - 1, total, total + 1):
            assert fit_timelines(lines, budget) == reference_fit(lines, budget)


def test_the_timeline_store_gives_the_ir_lines_and_reads_again_what_may_have_changed(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    export(make_bundle(tmp_path), run_dir)
    ir = run_dir / "ir.duckdb"

    def opened() -> tuple[list[str], dict[str, list[tuple[str, str]]], dict[str, int]]:
        store = open_store(ir)
        try:
            return store.read, store.lines(eligible), {c: store.chars(c) for c in eligible}
        finally:
            store.close()

    con = duckdb.connect(str(ir), read_only=True)
    try:
        eligible = [
            r[0]
            for r in con.execute("SELECT cell_id FROM cells WHERE eligibility = 'valid_behavior' ORDER BY 1").fetchall()
        ]
        truth = read_timelines(con)
    finally:
        con.close()
    read, lines, chars = opened()
    assert read == eligible and lines == truth and list(lines) == list(truth)
    assert chars == {c: timeline_chars(truth.get(c, [])) for c in eligible}
    read, lines, _ = opened()
    assert read == [] and lines == truth and list(lines) == list(truth)  # every cell's lines kept in the IR
    # a cell whose stored digest is not its content's (its IR changed) is read again, alone
    con = duck.connect(ir)
    try:
        con.execute(f"UPDATE {TABLE} SET content_digest = 'sha256:' || repeat('0', 64), lines = ['stale line'], "
                    "details = ['x'] WHERE cell_id = ?", [eligible[1]])  # fmt: skip
    finally:
        con.close()
    read, lines, _ = opened()
    assert read == [eligible[1]] and lines == truth
    # lines made by other code or libraries are never taken
    con = duck.connect(ir)
    try:
        con.execute(f"UPDATE {TABLE} SET made_with = 'sha256:' || repeat('1', 64)")
    finally:
        con.close()
    assert opened()[0] == eligible
    # an IR this process holds read-only: the lines are made in a temporary table of the store's own connection
    held = duck.connect(ir, read_only=True)
    try:
        read, lines, _ = opened()
        assert read == eligible and lines == truth
    finally:
        held.close()
    assert os.path.realpath(ir) not in duck._HUB._files  # the stores closed their connections


def test_the_map_contexts_canonical_text_gives_the_digests_of_the_contexts(model_settings: Any) -> None:
    contexts: list[dict[str, Any]] = [
        {"call_id": f"M{i:02d}", "cells_text": "C1 täsk=x\n\"quoted\" \\ back", "tasks": ["b", "a"], "n": i,
         "nested": {"z": [1, None, True], "a": "日本"}}
        for i in range(1, 4)
    ]  # fmt: skip
    maps = [MapCall(chunk=Chunk(call_id=c["call_id"], tasks=[], cells=[]), context=c, tokens=1) for c in contexts]
    assert maps_digest(maps) == digest({"maps": [digest(c) for c in contexts]})
    settings = model_settings()
    kw = {"template_hash": "sha256:t", "model": "openai/m", "instructor_mode": "tools", "settings": settings,
          "max_tokens": 2048}  # fmt: skip
    for m in maps:
        assert map_key(sha256_text(m.canonical), **kw) == map_key(digest(m.context), **kw)
    # a changed cell in a partition changes that partition's key, and the digest of them all
    before = [map_key(digest(m.context), **kw) for m in maps]
    changed = {**contexts[1], "cells_text": contexts[1]["cells_text"] + "!"}
    maps[1] = MapCall(chunk=maps[1].chunk, context=changed, tokens=1)
    after = [map_key(sha256_text(m.canonical), **kw) for m in maps]
    assert [a == b for a, b in zip(after, before, strict=True)] == [True, False, True]
    assert maps_digest(maps) == digest({"maps": [digest(c) for c in (contexts[0], changed, contexts[2])]})
    assert maps_digest(maps) != digest({"maps": [digest(c) for c in contexts]})


def test_a_map_answer_is_keyed_on_the_bound_its_request_carries(model_settings: Any, tmp_path: Path) -> None:
    """Reuse follows the request: the same capped bound keeps the answer, another bound asks again."""

    def key_and_bound(**overrides: Any) -> tuple[str, int | None, int]:
        settings = model_settings(**overrides)
        client = ModelClient(settings, tmp_path)
        bound = client.max_tokens(MAP_ROLE)
        key = map_key(
            "sha256:ctx", template_hash="sha256:t", model=client.model, instructor_mode="tools", settings=settings,
            max_tokens=bound,
        )  # fmt: skip
        return key, bound, role_budget(settings, MAP_ROLE).input_tokens

    # at 6,000 tokens the role's bound (2,048) is capped at the answer's room, a quarter of the context
    capped, bound, room = key_and_bound(context_tokens=6_000)
    assert bound == 1_500 < (model_settings().max_tokens_for(MAP_ROLE) or 0)
    # --max-tokens 1500 sends the same request (same bound, same budget, so the same partitions): reused
    same, same_bound, same_room = key_and_bound(context_tokens=6_000, max_tokens=1_500)
    assert (same_bound, same_room) == (bound, room) and same == capped
    # a larger context raises the cap: the request's bound changes, so does the key (the role's own max_tokens,
    # which the key read before, is 2,048 in both)
    wider, wider_bound, _ = key_and_bound(context_tokens=7_000)
    assert wider_bound == 1_750 and wider != capped
    # above the cap the role's bound is sent whatever the context: one key
    assert key_and_bound(context_tokens=20_000)[:2] == key_and_bound(context_tokens=40_000)[:2]


def test_counter_evidence_samples_equal_the_sort_they_replace() -> None:
    """The reduce step's samples (outside the draft's partition first, by cell id) without a sort per draft
    equal what sorting every row by (inside, cell id) gave, ties in their order included."""
    from pipeline.sol.reduce import COUNTER_SAMPLES, _found_cell, _samples

    rng = random.Random(7)
    for _ in range(300):
        rows = [{"cell_id": f"C{rng.randrange(12):03d}", "n": i} for i in range(rng.randrange(0, 30))]
        own = {f"C{rng.randrange(12):03d}" for _ in range(rng.randrange(0, 12))}
        expected = sorted(rows, key=lambda r: (r["cell_id"] in own, r["cell_id"]))[:COUNTER_SAMPLES]
        # the (cell, event) pairs of a signature, as the reduce holds them
        pairs = sorted(((r["cell_id"], f"E{r['n']}") for r in rows), key=_found_cell)
        assert _samples(pairs, own, _found_cell) == [(r["cell_id"], f"E{r['n']}") for r in expected]
        # the same rows as (order, occurrence id, cell) tuples, as the occurrences are held
        tuples = [(r["n"], f"O{r['n']}", r["cell_id"]) for r in rows]
        assert _samples(sorted(tuples, key=lambda t: t[2]), own, lambda t: t[2]) == [
            (r["n"], f"O{r['n']}", r["cell_id"]) for r in expected
        ]


def test_shown_among_equals_the_shown_events_it_replaces() -> None:
    """The events of a few candidates a context shows: what ``shown_events(context) & candidates`` gives."""
    rng = random.Random(7)
    ids = [f"C{c:03d}-e{s:04d}" for c in range(1, 4) for s in range(1, 6)] + ["x-C001-e0001", "C001-e00012"]
    seps = [" ", "\n", ", ", "; ", "(", ")", "[", "]", '"', "'", "`", "|", "<", ">", ":", ".", ":.", "x", "-", "/", ""]
    for _ in range(300):

        def text() -> str:
            return "".join(rng.choice(seps) + rng.choice([*ids, "word", "C001-e"]) for _ in range(rng.randint(0, 12)))

        context: dict[str, Any] = {"a": text(), "b": [text(), {"c": text()}], "n": 3}
        candidates = set(rng.sample([*ids, "C001-e0001:", "C0 01-e0001", "nope"], 6))
        assert shown_among(context, candidates) == shown_events(context) & candidates


def test_batch_rows_share_their_keys_and_read_as_plain_dicts() -> None:
    # Sol holds a row per cell (cells and coverage) for its whole run: the rows of one query share
    # one table of keys (~180 bytes an 11-column row, a plain dict ~470), and read as plain dicts.
    import tracemalloc

    from pipeline.sol.corpus import rows

    con = duckdb.connect()
    sql = (
        "SELECT 'C' || lpad(i::VARCHAR, 5, '0') AS cell_id, 't' || (i % 7) AS task_id, 'r1' AS run_id, "
        "'H0' AS harness, 'valid_behavior' AS eligibility, NULL AS exclusion_reason, 'completed' AS outcome, "
        "0.5::DOUBLE AS quality, 1.0::DOUBLE AS completion, i * 1.5::DOUBLE AS cost, 0.9::DOUBLE AS stability "
        "FROM range(2000) r(i) ORDER BY i"
    )

    def plain_rows() -> list[dict[str, Any]]:
        cur = con.execute(sql)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]

    held = []
    plain_rows(), rows(con, sql)  # first calls make what any later one reuses
    for read in (plain_rows, lambda: rows(con, sql)):
        tracemalloc.start()
        got = read()
        held.append(tracemalloc.get_traced_memory()[0])
        tracemalloc.stop()
    plain = plain_rows()
    assert got == plain
    assert all(type(r) is dict for r in got)
    assert json.dumps(got) == json.dumps(plain)  # same keys in the same order
    assert held[0] - held[1] > 250 * len(got), held  # ~290 bytes a row less, with the same values held
    got[0]["extra"] = 1  # a reader may still add a key to one row
    assert "extra" not in got[1]
    assert rows(con, "SELECT 1 AS a, 2 AS a") == [{"a": 2}]  # a repeated name: the last value, as dict(zip())
