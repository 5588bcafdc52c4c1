"""What Sol's compact rendering saves, and what showing every cited event's text costs, in tokens.

On the demo (24 cells) and on the demo cloned to N cells (``bench/scale_demo.py``, Luna answered with the
hand-written demo answers), Sol's request sections are rendered two ways from the same batch, in the same
run: the earlier rendering (indented JSON of the cells, the coverage and the pattern groups) and today's
(a cell table under one header line, one line per group and occurrence); then the evidence that the
earlier request did not carry at all (each cited event's text, Luna's words) is counted apart. Tokens are
counted as a request's budget counts them (``pipeline.models.budget``).

    python bench/bench_prompt_sizes.py --cells 24 1000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402
from scale_demo import run_scaled  # noqa: E402  (bench/ is on sys.path as the script's folder)

from pipeline.core.canonical import pretty_json  # noqa: E402
from pipeline.core.settings import ModelSettings  # noqa: E402
from pipeline.models.budget import count_text, model_limits  # noqa: E402
from pipeline.sol.corpus import load_batch  # noqa: E402
from pipeline.sol.evidence import GroupEvidence  # noqa: E402
from pipeline.sol.partition import Renderer  # noqa: E402
from pipeline.sol.stage import single_context  # noqa: E402

pytestmark = pytest.mark.bench
MODEL = "openai/fixture-model"


def tokens(text: str) -> int:
    """Tokens of ``text``, counted by the tokenizer a request's budget uses (``count_text``)."""
    return count_text(model_limits(ModelSettings(model=MODEL)), text)


class _NoEvidence:
    """An evidence store that shows nothing: the groups without Luna's words and event lines."""

    def __init__(self, rank: dict[str, int]) -> None:
        self.rank = rank

    def for_cells(self, cells: Any, occurrences: Any) -> GroupEvidence:
        return GroupEvidence()

    def for_group(self, gid: str) -> GroupEvidence:
        return GroupEvidence()


def sizes(run_dir: Path) -> dict[str, Any]:
    """Token counts of the earlier and today's renderings of the same batch."""
    batch = load_batch(run_dir, run_dir / "ir.duckdb")
    cells = [str(c["cell_id"]) for c in batch.eligible]
    occurrences = dict(batch.group_stream(eligible_only=False))  # Sol reads them per request; this bench, all
    groups = [{**g, "occurrences": occurrences.get(str(g["group_id"]), [])} for g in batch.groups]
    legacy = "\n".join(
        pretty_json(x).strip() for x in (batch.eligible, batch.excluded, batch.coverage, groups)
    )  # what the sections were before: indented JSON, keys on every row
    today = single_context(batch)
    with_evidence = today["groups_text"]
    evidence, batch.evidence = batch.evidence, _NoEvidence(batch.evidence.rank)  # type: ignore[assignment]
    try:
        bare = Renderer(batch).groups_text(cells)  # the same groups, without texts and event lines
    finally:
        batch.evidence = evidence
    compact = "\n".join((today["cell_header"], today["cells_text"], today["excluded_text"], bare))
    cited = {e for occ in occurrences.values() for o in occ for e in o.get("events") or []}
    return {
        "cells": len(cells),
        "groups": len(batch.groups),
        "cited_events": len(cited),
        "legacy_tokens": tokens(legacy),
        "compact_tokens": tokens(compact),
        "evidence_tokens": tokens(with_evidence) - tokens(bare),
        "timeline_tokens": tokens(today["timelines_text"]),
    }


def luna_sizes(run_dir: Path) -> dict[str, Any]:
    """Luna's log rendered as before and as today, the prompt's fixed part, and parts per cell by context."""
    import duckdb

    from pipeline.luna.patterns import LunaAnswer
    from pipeline.luna.render import _EVENT_SQL, load_cells, render_cell, render_event, split_parts
    from pipeline.luna.stage import _sample, part_budget
    from pipeline.models import render
    from pipeline.models.budget import _schema_text
    from pipeline.models.schema_text import schema_text

    con = duckdb.connect(str(run_dir / "ir.duckdb"), read_only=True)
    try:
        cells = load_cells(con)
        con.execute("CREATE TEMP VIEW _bench_cells AS SELECT cell_id FROM cells WHERE eligibility = 'valid_behavior'")
        cur = con.execute(_EVENT_SQL.format(cells="_bench_cells"))
        names = [d[0] for d in cur.description]
        before: dict[str, list[str]] = {}
        last: dict[str, str] = {}
        for tup in cur.fetchall():
            row = dict(zip(names, tup, strict=True))
            cell = row["cell_id"]
            if last.get(cell) != row["segment_id"]:  # the segment header as it was
                last[cell] = row["segment_id"]
                before.setdefault(cell, []).append(
                    f"\n## segment {row['segment_id']} · stage={row['stage'] or '-'} · "
                    f"session={row['session_id'] or '-'} · actor={row['actor'] or '-'}"
                )
            before.setdefault(cell, []).append(render_event(row))
        sample = _sample(con, [c.cell_id for c in cells])
    finally:
        con.close()
    old = {c: "\n".join(lines) for c, lines in before.items()}
    new = {c.cell_id: render_cell(c) for c in cells}
    big = max(new, key=lambda c: len(new[c]))
    settings = ModelSettings(model="openai/smollm2", context_tokens=8192, max_tokens=1024)
    limits = model_limits(settings)
    ctx = {"cell_id": "C000000", "task_id": "T" * 24, "task_summary": "", "run_id": "r" * 32, "harness": "h" * 16,
           "part": "99/99", "part_total": 99, "ir": "", "event_count": 99_999, "candidates": []}  # fmt: skip
    system, user = (m["content"] for m in render("luna", ctx, response_model=LunaAnswer).messages)
    answer = schema_text(LunaAnswer)
    overhead = {
        "instructions": count_text(limits, system.replace(answer, "")),
        "schema_text": count_text(limits, answer),
        "user_framing": count_text(limits, user),
        "schema_sent_max_mode": count_text(limits, _schema_text(LunaAnswer)),
        "counted": part_budget(settings).overhead,
    }
    parts: dict[str, int] = {}
    for label, context, max_tokens in (("8K", 8192, 1024), ("16K", 16384, 1024), ("32K", 32768, 1024),
                                       ("8K default answer room", 8192, None)):  # fmt: skip
        budget = part_budget(ModelSettings(model="openai/smollm2", context_tokens=context, max_tokens=max_tokens),
                             sample=sample)  # fmt: skip
        per_cell = [len(split_parts(c, budget.tokens, budget.chars_per_token, budget.count)) for c in cells]
        parts[label] = max(per_cell)
        parts[label + " total"] = sum(per_cell)
    return {
        "chars_before": sum(map(len, old.values())), "chars_now": sum(map(len, new.values())),
        "tokens_before": sum(count_text(limits, t) for t in old.values()),
        "tokens_now": sum(count_text(limits, t) for t in new.values()),
        "largest": big, "largest_before": len(old[big]), "largest_now": len(new[big]),
        "overhead": overhead, "parts": parts,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> dict[int, dict[str, Any]]:
    """Print the figures per batch size."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, nargs="+", default=[24, 1000])
    ap.add_argument("--luna", action="store_true", help="Luna's log and parts per cell on the demo")
    args = ap.parse_args(argv)
    out: dict[int, dict[str, Any]] = {}
    if args.luna:
        with tempfile.TemporaryDirectory(prefix="lunasol-sizes-") as tmp:
            lu = luna_sizes(run_scaled(Path(tmp), 24, log=lambda _m: None))
        print(
            f"luna, demo (24 cells): log {lu['chars_before']:,} -> {lu['chars_now']:,} chars, "
            f"{lu['tokens_before']:,} -> {lu['tokens_now']:,} tokens ({lu['tokens_now'] / lu['tokens_before']:.3f}x); "
            f"largest cell {lu['largest']} {lu['largest_before']:,} -> {lu['largest_now']:,} chars"
        )
        print("luna prompt without log (est. tokens): " + ", ".join(f"{k} {v:,}" for k, v in lu["overhead"].items()))
        print("luna parts per cell (max; total calls), --max-tokens 1024 unless said: "
              + ", ".join(f"{k} {v}" for k, v in lu["parts"].items()))  # fmt: skip
        out[0] = lu
    for n in args.cells:
        with tempfile.TemporaryDirectory(prefix="lunasol-sizes-") as tmp:
            s = out[n] = sizes(run_scaled(Path(tmp), n, log=lambda _m: None))
        saved = 1 - s["compact_tokens"] / s["legacy_tokens"]
        print(
            f"{s['cells']:>5} cells, {s['groups']} groups, {s['cited_events']:,} cited events: cells+coverage+groups "
            f"{s['legacy_tokens']:,} tokens as indented JSON -> {s['compact_tokens']:,} compact "
            f"({saved:.0%} saved, {s['compact_tokens'] / s['legacy_tokens']:.3f}x); the cited events' text and "
            f"Luna's words add {s['evidence_tokens']:,}; timelines {s['timeline_tokens']:,} (unchanged)"
        )
    return out


def test_bench_prompt_sizes() -> None:
    """The bench as a test (marker ``bench``): the compact sections are smaller than the JSON ones."""
    out = main(["--cells", "24", "--luna"])
    s, lu = out[24], out[0]
    assert s["compact_tokens"] < s["legacy_tokens"] and s["evidence_tokens"] > 0
    assert lu["tokens_now"] < lu["tokens_before"] and lu["parts"]["8K"] <= 6


if __name__ == "__main__":
    main()
