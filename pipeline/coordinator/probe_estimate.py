"""Pattern groups estimated from probe hits, for a dry run before Luna has run (labelled an estimate).

Each probe hit stands in for the pattern Luna would confirm (same type, same concerns key, the hit's
events), so the Coordinator's SQL groups them as it will group Luna's patterns, and Sol's requests
can be sized with groups of a realistic count and shape. Only ever run on a scratch copy of a run
(the dry run's temporary directory): it writes the ``patterns`` table.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.coordinator.groups import run_coordinator
from pipeline.core import duck

_PATTERNS_DDL = """
CREATE TABLE IF NOT EXISTS patterns (
    pattern_id VARCHAR PRIMARY KEY, cell_id VARCHAR NOT NULL, type VARCHAR NOT NULL, concerns VARCHAR NOT NULL,
    observed VARCHAR NOT NULL, definition_fit VARCHAR NOT NULL, evidence VARCHAR[] NOT NULL,
    confidence VARCHAR NOT NULL, state_changed BOOLEAN NOT NULL, probe_hits VARCHAR[] NOT NULL,
    origin VARCHAR NOT NULL, overruled BOOLEAN NOT NULL
);
"""


def estimate_groups(ir_path: Path, run_dir: Path) -> int:
    """Write probe-based patterns into the (scratch) IR and coordinate them; return how many patterns."""
    con = duck.connect(ir_path)
    try:
        con.execute(_PATTERNS_DDL)
        if not duck.has_table(con, "probe_hits"):
            return 0
        con.execute(
            "INSERT INTO patterns SELECT cell_id || '-H' || lpad(CAST(row_number() OVER (PARTITION BY cell_id "
            "ORDER BY hit_id) AS VARCHAR), 3, '0'), cell_id, type, key, explanation, 'probe hit (estimate)', "
            "evidence, 'low', NOT proves_unchanged, [hit_id], 'probe', FALSE FROM probe_hits "
            "WHERE hit_id NOT IN (SELECT unnest(probe_hits) FROM patterns)"
        )
        row = con.execute("SELECT count(*) FROM patterns").fetchone()
        n = int(row[0]) if row else 0
    finally:
        con.close()
    run_coordinator(ir_path, run_dir)
    return n
