"""Deterministic probes: small SQL queries over the IR that find pattern candidates without a model.

Each probe is one file in ``sql/`` returning rows ``(cell_id, key, evidence, first_seq, last_seq,
explanation)``. Probes that establish "nothing changed between the first and the last evidence
event" carry ``proves_unchanged``: where a model claims a change inside such a span, the probe wins
(a determinate result outranks an observation) and the conflict is recorded.
"""

from __future__ import annotations

import functools
import re

import duckdb
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.core.errors import BadInput
from pipeline.probes.files import PatternType, Probe, base_sql, shipped_probes

PROBES: tuple[Probe, ...] = shipped_probes()
"""The shipped probes, read from ``sql/`` through the same contract as a user's (:mod:`.files`)."""

PROBE_HITS_DDL = """
CREATE OR REPLACE TABLE probe_hits (
    hit_id VARCHAR PRIMARY KEY,        -- '<cell>-H<nn>', ordered by first evidence seq then probe
    probe_id VARCHAR NOT NULL,
    cell_id VARCHAR NOT NULL,
    type VARCHAR NOT NULL,             -- the pattern type the probe suggests
    key VARCHAR NOT NULL,              -- normalised concerns key (obligation:/target:/transition:)
    evidence VARCHAR[] NOT NULL,       -- event ids of this cell, in seq order
    first_seq INTEGER NOT NULL,
    last_seq INTEGER NOT NULL,
    proves_unchanged BOOLEAN NOT NULL, -- true: nothing changed between first_seq and last_seq
    explanation VARCHAR NOT NULL
);
"""


class ProbeHit(BaseModel):
    """One deterministic finding, offered to Luna as a candidate."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hit_id: str
    probe_id: str
    cell_id: str
    type: PatternType
    key: str
    evidence: list[str] = Field(min_length=1)
    first_seq: int
    last_seq: int
    proves_unchanged: bool
    explanation: str


def _user_rows_checked(con: duckdb.DuckDBPyConnection, probe: Probe, rows: list[tuple[object, ...]]) -> None:
    """A user's probe must cite events of the cell it names, at least one, by existing ids."""
    cited: set[tuple[str, str]] = set()
    for cell_id, _key, evidence, *_ in rows:
        if not isinstance(evidence, list) or not evidence:
            raise BadInput(f"probe {probe.path}: evidence must be a non-empty list of event ids (cell {cell_id})")
        cited.update((str(cell_id), str(e)) for e in evidence)
    if not cited:
        return
    known = {
        (c, e)
        for c, e in con.execute(
            "SELECT cell_id, event_id FROM events WHERE event_id IN (SELECT unnest(?))", [sorted({e for _, e in cited})]
        ).fetchall()
    }
    bad = sorted(cited - known)
    if bad:
        cell, eid = bad[0]
        raise BadInput(f"probe {probe.path}: evidence {eid} is not an event of cell {cell} ({len(bad)} such)")


def run_probes(con: duckdb.DuckDBPyConnection, probes: tuple[Probe, ...] = PROBES) -> list[ProbeHit]:
    """Run every probe over the IR on ``con``; return hits with deterministic ids (no table written)."""
    con.execute(base_sql())
    raw: list[tuple[str, int, str, Probe, str, list[str], int, str]] = []
    for probe in probes:
        try:
            rows = con.execute(probe.sql).fetchall()
        except duckdb.Error as exc:
            raise BadInput(f"probe {probe.path}: {' '.join(str(exc).split(chr(10))[0].split())}") from None
        if not probe.shipped:
            _user_rows_checked(con, probe, rows)
        for cell_id, key, evidence, first_seq, last_seq, explanation in rows:
            raw.append((cell_id, first_seq, probe.probe_id, probe, key, list(evidence), last_seq, explanation))
    raw.sort(key=lambda r: (r[0], r[1], r[2], r[4], r[5]))
    hits: list[ProbeHit] = []
    counter: dict[str, int] = {}
    for cell_id, first_seq, _pid, probe, key, evidence, last_seq, explanation in raw:
        counter[cell_id] = counter.get(cell_id, 0) + 1
        try:
            hit = ProbeHit(
                hit_id=f"{cell_id}-H{counter[cell_id]:02d}",
                probe_id=probe.probe_id,
                cell_id=cell_id,
                type=probe.type,
                key=normalise_key(key),
                evidence=evidence,
                first_seq=first_seq,
                last_seq=last_seq,
                proves_unchanged=probe.proves_unchanged,
                explanation=explanation,
            )
        except (ValidationError, AttributeError) as exc:  # a user's probe returned a wrongly typed row
            raise BadInput(f"probe {probe.path}: a row does not fit the probe contract ({_short(exc)})") from None
        hits.append(hit)
    return hits


def _short(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        return f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}"
    return str(exc)


def write_probe_hits(con: duckdb.DuckDBPyConnection, hits: list[ProbeHit]) -> None:
    """(Re)create table ``probe_hits`` holding ``hits`` (one bulk insert from Arrow)."""
    con.execute(PROBE_HITS_DDL)
    append_probe_hits(con, hits)


def append_probe_hits(con: duckdb.DuckDBPyConnection, hits: list[ProbeHit]) -> None:
    """Add ``hits`` to table ``probe_hits`` (one bulk insert from Arrow; the table must exist)."""
    import pyarrow as pa

    if not hits:
        return
    s, i32 = pa.string(), pa.int32()
    table = pa.table(
        {
            "hit_id": pa.array([h.hit_id for h in hits], s),
            "probe_id": pa.array([h.probe_id for h in hits], s),
            "cell_id": pa.array([h.cell_id for h in hits], s),
            "type": pa.array([h.type for h in hits], s),
            "key": pa.array([h.key for h in hits], s),
            "evidence": pa.array([h.evidence for h in hits], pa.list_(s)),
            "first_seq": pa.array([h.first_seq for h in hits], i32),
            "last_seq": pa.array([h.last_seq for h in hits], i32),
            "proves_unchanged": pa.array([h.proves_unchanged for h in hits], pa.bool_()),
            "explanation": pa.array([h.explanation for h in hits], s),
        }
    )
    con.register("_lunasol_probe_hits", table)
    try:
        con.execute("INSERT INTO probe_hits BY NAME SELECT * FROM _lunasol_probe_hits")
    finally:
        con.unregister("_lunasol_probe_hits")


def read_probe_hits(
    con: duckdb.DuckDBPyConnection, cell_id: str | None = None, within: str | None = None
) -> list[ProbeHit]:
    """Hits stored in ``probe_hits`` (all, one cell's, or those of the cells of view ``within``), in hit id order."""
    where, params = ("WHERE cell_id = ?", [cell_id]) if cell_id else ("", [])
    if within is not None:  # a trusted view name (lunasol's own), never user text
        where = f"{where} {'AND' if where else 'WHERE'} cell_id IN (SELECT cell_id FROM {within})"
    rows = con.execute(
        "SELECT hit_id, probe_id, cell_id, type, key, evidence, first_seq, last_seq, proves_unchanged, explanation "
        f"FROM probe_hits {where} ORDER BY cell_id, hit_id",
        params,
    ).fetchall()
    fields = ProbeHit.model_fields.keys()
    return [ProbeHit.model_validate(dict(zip(fields, r, strict=True))) for r in rows]


_KEY_KINDS = ("obligation", "target", "transition")
_ARROW = re.compile(r"\s*(->|→)\s*")


# Memoised: a batch names the same few keys thousands of times (every pattern a rerun reuses is
# validated again), and the function depends on its argument only.
@functools.lru_cache(maxsize=1 << 16)
def normalise_key(key: str) -> str:
    """Normalise a concerns key: ``kind:value``, lower case, whitespace folded to one space.

    Keys without a known kind prefix are taken as a target. Equal behaviour named with a
    different case or spacing gets the same key, so the Coordinator can group across cells.
    """
    text = " ".join(key.strip().split()).lower()
    kind, sep, value = text.partition(":")
    if not sep or kind.strip() not in _KEY_KINDS:
        kind, value = "target", text
    value = _ARROW.sub("->", value.strip().strip("`'\""))
    return f"{kind.strip()}:{value}"
