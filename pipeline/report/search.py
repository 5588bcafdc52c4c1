"""The report's search index, built at report time: words -> cells, sharded by a word's first two characters.

The page's search used to inflate every cell's timeline and scan it (22.9 s at 10,000 cells). Now
it loads one small shard per query word, intersects the cells that hold a word beginning with each
query word, and scans only those cells' timelines for the exact text (stopping once it has a page of
hits). The words are those of what the search has always looked at: each event's kind, detail,
actor, stage, tool and (cut) text, the cited raw lines embedded for it, and the cell's own id.

Built by DuckDB over the IR (attached read-only) with a memory limit and a spill directory, written
one shard at a time: the Python side never holds the postings of more than one shard.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow as pa

from pipeline.report.data import TEXT_CHARS
from pipeline.report.shards import ShardWriter

WORD = r"[\pL\pN]+"  # RE2 (DuckDB) and the page's /[\p{L}\p{N}]+/gu agree on what a word is
WORD_CHARS = 32  # a word is indexed by its first 32 characters (the page cuts query words alike)
PREFIX = 2  # a shard holds the words that begin with the same two characters
PAIR_CELLS = 2_000  # cells whose (word, cell) pairs are made at once
MEMORY_LIMIT = "256MB"  # besides the IR hub's (pipeline.core.duck): the two stay under ~0.8 GiB


def shard_name(prefix: str) -> str:
    """A shard's file name: ``s`` and the prefix's UTF-8 in hex (the page computes the same)."""
    return "s" + prefix.encode("utf-8").hex()


class SearchIndex:
    """Collects the embedded raw lines per cell, then builds the index into shards."""

    def __init__(self, ir_path: Path, spill: Path) -> None:
        self.ir_path = ir_path
        spill.mkdir(parents=True, exist_ok=True)
        # a file of its own (removed with the spill folder), not an in-memory database: the raw lines'
        # table at 100,000 cells (~0.5 GB of text) must be able to leave memory, and it could not
        self.con = duckdb.connect(str(spill / "search.duckdb"))
        self.con.execute(f"SET memory_limit = '{MEMORY_LIMIT}'")
        self.con.execute("SET temp_directory = ?", [str(spill)])
        self.con.execute("SET preserve_insertion_order = false")
        self.con.execute("SET enable_progress_bar = false")
        self.con.execute("CREATE TABLE raw (o INTEGER, t VARCHAR)")
        self._raw: list[tuple[int, str]] = []

    def add_raw(self, ordinal: int, text: str) -> None:
        """Raw lines embedded for one of cell ``ordinal``'s events (searched as the page searches them)."""
        self._raw.append((ordinal, text))
        if len(self._raw) >= 20_000:
            self._flush()

    def _flush(self) -> None:
        if self._raw:  # one Arrow batch (executemany is ~0.3 ms a row)
            batch = pa.table({"o": [o for o, _ in self._raw], "t": [t for _, t in self._raw]})
            self.con.register("raw_batch", batch)
            self.con.execute("INSERT INTO raw SELECT o::INTEGER, t FROM raw_batch")
            self.con.unregister("raw_batch")
            self._raw = []

    def build(self, cell_ids: list[str], writer: ShardWriter) -> list[str]:
        """Write every shard; return their names. ``cell_ids``: the cells in order (a posting is an ordinal)."""
        self._flush()
        if not cell_ids or not self.ir_path.is_file():
            return []
        con = self.con
        con.register("ord_batch", pa.table({"cell_id": cell_ids, "o": list(range(len(cell_ids)))}))
        con.execute("CREATE TABLE ord AS SELECT cell_id, o::INTEGER AS o FROM ord_batch")
        con.unregister("ord_batch")
        try:
            con.execute("ATTACH ? AS ir (READ_ONLY)", [str(self.ir_path)])
            fields = "e.kind, e.detail, e.actor, e.stage, e.tool_name"
            con.execute("SELECT kind, detail, actor, stage, tool_name, text FROM ir.events LIMIT 0")
        except duckdb.Error:  # an IR without events: nothing to search
            return []
        # Every (word, cell) pair once, sorted by word. Made a range of cells at a time: a pair's cell is part
        # of it, so pairs distinct within a range are distinct overall, and DuckDB's hash table holds one
        # range's words (one DISTINCT over the whole batch ran out of memory at 100,000 cells).
        con.execute("CREATE TABLE pairs (w VARCHAR, o INTEGER)")
        for lo in range(0, len(cell_ids), PAIR_CELLS):
            hi = lo + PAIR_CELLS
            con.execute(
                "INSERT INTO pairs WITH words AS ("
                f"  SELECT o.o, unnest(regexp_extract_all(lower(concat_ws(' ', {fields}, "
                f"    left(coalesce(e.text, ''), {TEXT_CHARS}))), '{WORD}')) AS w"
                f"   FROM ir.events e JOIN (SELECT * FROM ord WHERE o >= {lo} AND o < {hi}) o USING (cell_id)"
                f"  UNION ALL SELECT o, unnest(regexp_extract_all(lower(t), '{WORD}')) FROM raw"
                f"   WHERE o >= {lo} AND o < {hi}"
                f"  UNION ALL SELECT o, unnest(regexp_extract_all(lower(cell_id), '{WORD}')) FROM ord"
                f"   WHERE o >= {lo} AND o < {hi}"
                f") SELECT DISTINCT left(w, {WORD_CHARS}) AS w, o FROM words WHERE length(w) >= 2"
            )
        con.execute("CREATE TABLE sorted_pairs AS SELECT w, o FROM pairs ORDER BY w, o")
        con.execute("DROP TABLE pairs")
        # then one shard's words at a time (a range of the sorted table: DuckDB reads only its blocks)
        listed = con.execute(f"SELECT DISTINCT left(w, {PREFIX}) FROM sorted_pairs ORDER BY 1").fetchall()
        prefixes = [r[0] for r in listed]
        shards: list[str] = []
        for i, prefix in enumerate(prefixes):
            # words of one prefix lie between it and the next one (binary order, as sorted)
            upper = prefixes[i + 1] if i + 1 < len(prefixes) else None
            cur = con.execute(
                "SELECT w, o FROM sorted_pairs WHERE w >= ?" + (" AND w < ?" if upper else "") + " ORDER BY w, o",
                [prefix, upper] if upper else [prefix],
            )
            words: dict[str, list[int]] = {}
            word, last = None, 0
            while batch := cur.fetchmany(50_000):
                for w, o in batch:
                    if w != word:
                        word, last = w, 0
                        words[w] = []
                    # delta-encoded ordinals: a word in every cell is a run of 1s, which deflates to almost nothing
                    words[w].append(o - last)
                    last = o
            shards.append(writer.put(shard_name(prefix), words))
        return shards

    def close(self) -> None:
        """Release DuckDB (and its spill files)."""
        self.con.close()
