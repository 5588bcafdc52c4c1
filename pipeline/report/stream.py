"""The two artifacts that grow with the batch, read without holding them whole.

``patterns.jsonl``: one pass notes where each cell's lines are (and its pattern count, types and ids);
a shard of cells is then read back by seeking to its lines. ``pattern-groups.json``: one group at a
time (ijson), so a group's occurrences are in memory only while its shards are written. At 100,000
cells the two are hundreds of MB as text and several GB as Python objects.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ijson

from pipeline.artifacts.rundir import GROUPS, RunDir
from pipeline.artifacts.schemas import current_version
from pipeline.core.errors import BadInput

Row = dict[str, Any]


@dataclass
class CellPatterns:
    """What the page needs about one cell's patterns without reading them: count, types, where they are."""

    offsets: list[int] = field(default_factory=list)
    types: set[str] = field(default_factory=set)


class PatternIndex:
    """Where each cell's rows of ``patterns.jsonl`` are; read a few cells' rows back on demand."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.cells: dict[str, CellPatterns] = {}
        self.ids: dict[str, str] = {}  # pattern id -> cell id (the page links a pattern id to its cell)
        self.types: set[str] = set()
        self.total = 0
        with path.open("rb") as fh:
            offset = 0
            for n, line in enumerate(fh, start=1):
                if line.strip():
                    row = _parse(line, path, n)
                    cell = str(row.get("cell_id"))
                    entry = self.cells.setdefault(cell, CellPatterns())
                    entry.offsets.append(offset)
                    entry.types.add(str(row.get("type")))
                    if isinstance(row.get("pattern_id"), str) and row["pattern_id"]:
                        self.ids[row["pattern_id"]] = cell
                    self.total += 1
                offset += len(line)
        for entry in self.cells.values():
            self.types |= entry.types

    def count(self, cell: str) -> int:
        """How many patterns the cell has."""
        entry = self.cells.get(cell)
        return len(entry.offsets) if entry else 0

    def cell_types(self, cell: str) -> set[str]:
        """The cell's pattern types."""
        entry = self.cells.get(cell)
        return entry.types if entry else set()

    def rows(self, cells: list[str]) -> dict[str, list[Row]]:
        """The rows of these cells, in file order, read by seeking to them."""
        out: dict[str, list[Row]] = {}
        with self.path.open("rb") as fh:
            for cell in cells:
                entry = self.cells.get(cell)
                if entry is None:
                    continue
                rows = out.setdefault(cell, [])
                for offset in entry.offsets:
                    fh.seek(offset)
                    rows.append(_parse(fh.readline(), self.path, None))
        return out


def _parse(line: bytes, path: Path, n: int | None) -> Row:
    try:
        row = json.loads(line)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError alike
        raise BadInput(f"{path}{f':{n}' if n else ''}: not valid JSON ({exc})") from None
    if not isinstance(row, dict):
        raise BadInput(f"{path}{f':{n}' if n else ''}: expected a JSON object")
    return row


def groups(run: RunDir) -> Iterator[Row]:
    """The run's pattern groups in order, one at a time (none when there is no pattern-groups.json).

    A document at the current schema version is streamed; an older one is read whole and upgraded
    as :meth:`RunDir.read` does (older runs are small: streaming came with the 100,000-cell report).
    """
    path = run.groups
    if not path.is_file():
        return
    try:
        with path.open("rb") as fh:
            version = next((v for prefix, _, v in ijson.parse(fh) if prefix == "schema_version"), None)
        if version != current_version("pattern-groups"):
            doc = run.document(GROUPS)
            listed = (doc or {}).get("groups")
            if not isinstance(listed, list):
                raise BadInput(f"{path}: expected a list under 'groups'")
            yield from (g for g in listed if isinstance(g, dict))
            return
        with path.open("rb") as fh:
            for g in ijson.items(fh, "groups.item", use_float=True):
                if isinstance(g, dict):
                    yield g
    except ijson.JSONError as exc:
        raise BadInput(f"{path}: not valid JSON ({exc})") from None
