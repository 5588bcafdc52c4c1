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


def sizes(run_dir: Path) -> dict[str, Any]:
    """Token counts of the earlier and today's renderings of the same batch."""
    batch = load_batch(run_dir, run_dir / "ir.duckdb")
    cells = [str(c["cell_id"]) for c in batch.eligible]
    legacy = "\n".join(
        pretty_json(x).strip() for x in (batch.eligible, batch.excluded, batch.coverage, batch.groups)
    )  # what the sections were before: indented JSON, keys on every row
    today = single_context(batch)
    with_evidence = today["groups_text"]
    evidence, batch.evidence = batch.evidence, GroupEvidence()
    try:
        bare = Renderer(batch).groups_text(cells)  # the same groups, without texts and event lines
    finally:
        batch.evidence = evidence
    compact = "\n".join((today["cell_header"], today["cells_text"], today["excluded_text"], bare))
    cited = {e for g in batch.groups for o in g.get("occurrences") or [] for e in o.get("events") or []}
    return {
        "cells": len(cells),
        "groups": len(batch.groups),
        "cited_events": len(cited),
        "legacy_tokens": tokens(legacy),
        "compact_tokens": tokens(compact),
        "evidence_tokens": tokens(with_evidence) - tokens(bare),
        "timeline_tokens": tokens(today["timelines_text"]),
    }


def main(argv: list[str] | None = None) -> dict[int, dict[str, Any]]:
    """Print the figures per batch size."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, nargs="+", default=[24, 1000])
    args = ap.parse_args(argv)
    out: dict[int, dict[str, Any]] = {}
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
    (s,) = main(["--cells", "24"]).values()
    assert s["compact_tokens"] < s["legacy_tokens"] and s["evidence_tokens"] > 0


if __name__ == "__main__":
    main()
