"""Luna's output written straight into an IR, for tests and benchmarks of Sol at scale.

Hundreds of Luna calls would only add time there: what Sol reads is the patterns table, so each cell
gets three noise patterns (repeated reads of a random module) and, where the caller says, the
planted omission whose group Sol must find.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import duckdb

from pipeline.luna.stage import TABLES_DDL

PLANTED = "obligation:review-gate"
"""The planted omission's concern (the group Sol must find)."""


def write_patterns(
    ir: Path | duckdb.DuckDBPyConnection, plants: Callable[[str, random.Random], bool], seed: int = 3
) -> None:
    """Write ``patterns`` and ``luna_cells`` for every cell; ``plants(cell, rng)`` says where the omission goes.

    ``plants`` is called once per cell in cell order with the same generator the noise is drawn from,
    so a seeded choice there (e.g. 10% of failed cells) is part of the same reproducible draw.
    """
    con = duckdb.connect(str(ir)) if isinstance(ir, Path) else ir
    try:
        con.execute(TABLES_DDL)
        rng = random.Random(seed)
        events = dict(
            con.execute("SELECT cell_id, list(event_id ORDER BY seq) FROM events GROUP BY cell_id").fetchall()
        )
        rows = []
        for cell in sorted(events):
            ev = events[cell]
            kinds = [(f"target:src/mod{rng.randrange(12)}.py", "repeated_exploration") for _ in range(3)]
            if plants(cell, rng):
                kinds.append((PLANTED, "omission"))
            for n, (concerns, ptype) in enumerate(kinds, 1):
                k = rng.randrange(len(ev) - 2)
                rows.append([f"{cell}-P{n:02d}", cell, ptype, concerns, "observed", "fits", ev[k : k + 2], "medium",
                             False, [], "luna", False])  # fmt: skip
        con.executemany("INSERT INTO patterns VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
        con.executemany(
            "INSERT INTO luna_cells VALUES (?, 'ok', 1, 100, 1, ?, NULL, FALSE)",
            [[c, sum(1 for r in rows if r[1] == c)] for c in events],
        )
    finally:
        if isinstance(ir, Path):
            con.close()
