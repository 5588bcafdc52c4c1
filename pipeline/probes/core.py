"""Deterministic probes: small SQL queries over the IR that find pattern candidates without a model.

Each probe is one file in ``sql/`` returning rows ``(cell_id, key, evidence, first_seq, last_seq,
explanation)``. Probes that establish "nothing changed between the first and the last evidence
event" carry ``proves_unchanged``: where a model claims a change inside such a span, the probe wins
(seed 002: a determinate probe overrides observation) and the conflict is recorded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from typing import Literal

import duckdb
from pydantic import BaseModel, ConfigDict, Field

PatternType = Literal["omission", "repeated_exploration", "zero_information_gain"]


@dataclass(frozen=True)
class Probe:
    """One probe: its SQL file, the pattern type it suggests, and whether it proves no change."""

    probe_id: str
    type: PatternType
    proves_unchanged: bool
    summary: str


PROBES: tuple[Probe, ...] = (
    Probe(
        "repeat_call_same_state",
        "repeated_exploration",
        True,
        "same read-only tool call, same arguments, unchanged controller state and source",
    ),
    Probe(
        "check_rerun_unchanged_source",
        "repeated_exploration",
        True,
        "same check on the same target re-run with unchanged controller state and source",
    ),
    Probe(
        "identical_result",
        "zero_information_gain",
        True,
        "same actor, same stage, same tool call, byte-identical result, nothing changed in between",
    ),
    Probe(
        "repeated_failure",
        "zero_information_gain",
        True,
        "same actor, same tool call, the same failure again, nothing changed in between",
    ),
    Probe(
        "obligation_unclosed",
        "omission",
        False,
        "obligation opened, its stage ran, never closed",
    ),
    Probe(
        "report_only_rewrite",
        "zero_information_gain",
        True,
        "report artifact rewritten with no source, artifact, input or controller state change",
    ),
)

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


def _sql(name: str) -> str:
    return resources.files("pipeline.probes").joinpath("sql", f"{name}.sql").read_text(encoding="utf-8")


def run_probes(con: duckdb.DuckDBPyConnection, probes: tuple[Probe, ...] = PROBES) -> list[ProbeHit]:
    """Run every probe over the IR on ``con``; return hits with deterministic ids (no table written)."""
    con.execute(_sql("_base"))
    raw: list[tuple[str, int, str, Probe, str, list[str], int, str]] = []
    for probe in probes:
        rows = con.execute(_sql(probe.probe_id)).fetchall()
        for cell_id, key, evidence, first_seq, last_seq, explanation in rows:
            raw.append((cell_id, first_seq, probe.probe_id, probe, key, list(evidence), last_seq, explanation))
    raw.sort(key=lambda r: (r[0], r[1], r[2], r[4], r[5]))
    hits: list[ProbeHit] = []
    counter: dict[str, int] = {}
    for cell_id, first_seq, _pid, probe, key, evidence, last_seq, explanation in raw:
        counter[cell_id] = counter.get(cell_id, 0) + 1
        hits.append(
            ProbeHit(
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
        )
    return hits


def write_probe_hits(con: duckdb.DuckDBPyConnection, hits: list[ProbeHit]) -> None:
    """(Re)create table ``probe_hits`` holding ``hits``."""
    con.execute(PROBE_HITS_DDL)
    if hits:
        con.executemany(
            "INSERT INTO probe_hits VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                [
                    h.hit_id,
                    h.probe_id,
                    h.cell_id,
                    h.type,
                    h.key,
                    h.evidence,
                    h.first_seq,
                    h.last_seq,
                    h.proves_unchanged,
                    h.explanation,
                ]
                for h in hits
            ],
        )


def read_probe_hits(con: duckdb.DuckDBPyConnection, cell_id: str | None = None) -> list[ProbeHit]:
    """Hits stored in ``probe_hits`` (all, or one cell's), in hit id order."""
    where, params = ("WHERE cell_id = ?", [cell_id]) if cell_id else ("", [])
    rows = con.execute(
        "SELECT hit_id, probe_id, cell_id, type, key, evidence, first_seq, last_seq, proves_unchanged, explanation "
        f"FROM probe_hits {where} ORDER BY cell_id, hit_id",
        params,
    ).fetchall()
    fields = ProbeHit.model_fields.keys()
    return [ProbeHit.model_validate(dict(zip(fields, r, strict=True))) for r in rows]


_KEY_KINDS = ("obligation", "target", "transition")


def normalise_key(key: str) -> str:
    """Normalise a concerns key: ``kind:value``, lower case, whitespace folded to one space.

    Keys without a known kind prefix are taken as a target. Equal behaviour named with a
    different case or spacing gets the same key, so the Coordinator can group across cells.
    """
    text = " ".join(key.strip().split()).lower()
    kind, sep, value = text.partition(":")
    if not sep or kind.strip() not in _KEY_KINDS:
        kind, value = "target", text
    value = re.sub(r"\s*(->|→)\s*", "->", value.strip().strip("`'\""))
    return f"{kind.strip()}:{value}"
