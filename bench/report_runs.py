"""A run of any size for the report benchmark, made from a real one in seconds: its cells cloned in place.

Nothing here is a model's output and nothing runs the pipeline. ``expand_run`` copies a run (normally
a ``bench/scale_demo.py`` run of 1,000 cells, which did run the pipeline against the local server) and
gives each cell ``factor - 1`` clones ``<cell>R<k>``: in the IR's tables the report reads (cells,
coverage, outcomes, luna_cells, probe_hits, events), in patterns.jsonl and in pattern-groups.json
(occurrences, and the groups' support lists). A clone's events point at its source cell's raw lines
in the same frozen bundle (same bytes, same digests), so every cited ref still resolves and verifies.
Luna's ``patterns`` and ``cell_digests`` are cloned too (pattern ids, cited events and probe hits
renamed), so the Coordinator and Sol accept the clone: ``python bench/bench_stage.py RUN coordinator
--fresh --in-place`` regroups its patterns into the pattern tables, then ``... RUN sol --in-place``.
The other IR tables (segments, caches, pattern tables) are copied as they are: the report never reads
them. Synthetic in its shape only: a benchmark, not a run to analyse.

    python bench/report_runs.py SRC_RUN --factor 10      # prints the new run directory beside SRC_RUN
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import duckdb

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# What the report reads per cell, and the id columns of each that name the cell.
_EXPAND = {
    "cells": ("run_id",),
    "coverage": (),
    "outcomes": (),
    "luna_cells": (),
    "probe_hits": ("hit_id",),
    "events": ("event_id", "segment_id"),
    "patterns": ("pattern_id", "evidence[]", "probe_hits[]"),  # what the Coordinator groups (bench_stage)
    "cell_digests": (),  # per-cell caches are keyed on it
}
_SKIP = {"ir.duckdb", "ir.duckdb.wal", "patterns.jsonl", "pattern-groups.json", "report", "report.html", "luna",
         "exchanges"}  # fmt: skip


def _suffix(k: int, width: int) -> str:
    return f"R{k:0{width}d}"


def _expand_ir(src: Path, dst: Path, factor: int, width: int) -> None:
    con = duckdb.connect(str(dst))
    try:
        con.execute("SET enable_progress_bar = false")
        con.execute("ATTACH ? AS s (READ_ONLY)", [str(src)])
        listed = con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = 's'").fetchall()
        tables = [r[0] for r in listed]
        for t in tables:
            if t not in _EXPAND:
                con.execute(f'CREATE TABLE "{t}" AS SELECT * FROM s."{t}"')
                continue
            new = f"(cell_id || 'R' || lpad(k::VARCHAR, {width}, '0'))"
            repl = [f"{new} AS cell_id"]
            for col in _EXPAND[t]:
                if col.endswith("[]"):  # a list of ids of the cell: each renamed
                    col = col[:-2]
                    repl.append(f"list_transform({col}, lambda x: {new} || substr(x, length(cell_id) + 1)) AS {col}")
                elif col == "run_id":
                    repl.append(f"(run_id || 'R' || lpad(k::VARCHAR, {width}, '0')) AS run_id")
                else:  # '<cell>-e0001' -> '<clone>-e0001'
                    repl.append(f"({new} || substr({col}, length(cell_id) + 1)) AS {col}")
            cols = [r[0] for r in con.execute(f'DESCRIBE s."{t}"').fetchall()]
            con.execute(
                f'CREATE TABLE "{t}" AS SELECT * FROM s."{t}" UNION ALL '
                f'SELECT x.* REPLACE ({", ".join(repl)}) FROM s."{t}" AS x, range(1, ?) r(k)',
                [factor],
            )
            assert cols == [r[0] for r in con.execute(f'DESCRIBE "{t}"').fetchall()]
    finally:
        con.close()


def _renamer(cell: str, new: str) -> Any:
    # a cell id as a word of its own (not inside a path: cells/C001/... stays the source's bytes)
    pat = re.compile(rf"(?<![A-Za-z0-9/]){re.escape(cell)}(?![0-9A-Za-z/])")
    return lambda text: pat.sub(new, text)


def expand_run(src: Path, factor: int, dst: Path | None = None) -> Path:
    """A copy of run ``src`` with every cell cloned ``factor - 1`` times (beside it unless ``dst``)."""
    dst = dst or src.parent / f"{src.name}-x{factor}"
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    width = len(str(factor - 1))
    for p in src.iterdir():
        if p.name in _SKIP:
            continue
        (shutil.copytree if p.is_dir() else shutil.copy2)(p, dst / p.name)
    _expand_ir(src / "ir.duckdb", dst / "ir.duckdb", factor, width)
    with (src / "patterns.jsonl").open(encoding="utf-8") as fin, (dst / "patterns.jsonl").open("w") as out:
        for line in fin:
            out.write(line)
            cell = json.loads(line)["cell_id"]
            for k in range(1, factor):
                out.write(_renamer(cell, cell + _suffix(k, width))(line))
    doc = json.loads((src / "pattern-groups.json").read_text(encoding="utf-8"))
    with (dst / "pattern-groups.json").open("w", encoding="utf-8") as out:
        head = {k: v for k, v in doc.items() if k != "groups"}
        out.write(json.dumps(head)[:-1] + ', "groups": [')
        for gi, g in enumerate(doc["groups"]):
            out.write(", " if gi else "")
            sup = dict(g.get("support") or {})
            for key in ("cells", "runs", "patterns", "occurrences"):
                if isinstance(sup.get(key), list):
                    sup[key] = [f"{x}{_suffix(k, width)}" if k else x for x in sup[key] for k in range(factor)]
            for key in ("n_cells", "n_runs"):
                if isinstance(sup.get(key), int):
                    sup[key] *= factor
            rest = {k: v for k, v in g.items() if k not in ("occurrences", "support")}
            out.write(json.dumps({**rest, "support": sup})[:-1] + ', "occurrences": [')
            first = True
            for o in g.get("occurrences") or []:
                text = json.dumps(o)
                for k in range(factor):
                    out.write("" if first else ", ")
                    first = False
                    if k == 0:
                        out.write(text)
                        continue
                    clone = json.loads(_renamer(o["cell_id"], o["cell_id"] + _suffix(k, width))(text))
                    clone["occurrence_id"] = f"{o['occurrence_id']}{_suffix(k, width)}"
                    clone["run_id"] = f"{o.get('run_id')}{_suffix(k, width)}"
                    out.write(json.dumps(clone))
            out.write("]}")
        out.write("]}\n")
    run = json.loads((dst / "run.json").read_text(encoding="utf-8"))
    run["run_id"] = dst.name
    (dst / "run.json").write_text(json.dumps(run, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return dst


def main() -> None:
    """Command line: expand a run; print the new run directory."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("--factor", type=int, required=True)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    print(expand_run(args.src, args.factor, args.out))


if __name__ == "__main__":
    main()
