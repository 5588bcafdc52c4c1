"""Probe files: the contract every probe meets, shipped (``sql/``) or the user's (``--probes DIR``).

A probe is one ``<probe_id>.sql`` file: a header of ``-- key: value`` comment lines, then one
read-only ``SELECT`` (or ``WITH ... SELECT``) over the IR returning exactly the columns
:data:`HIT_COLUMNS`. The header names the pattern type the probe suggests, whether its hits prove
that nothing changed between the first and the last evidence event, and a one-line summary::

    -- type: repeated_exploration            (omission | repeated_exploration | zero_information_gain)
    -- proves_unchanged: true                (true | false)
    -- summary: same read-only call again with nothing changed

The query may use the IR tables (``events``, ``cells``, ...) and everything ``sql/_base.sql``
defines (``probe_events``, ``probe_changes``, the repeat chains and the ``lunasol_*`` macros; see
docs/patterns.md). A file is checked when it is loaded, before a run starts: header, one SELECT
statement, and the query run against an empty IR, so a typo, an unknown column or a wrong
result shape is one :class:`BadInput` line naming the file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Literal, cast, get_args

import duckdb

from pipeline.core.canonical import sha256_text
from pipeline.core.errors import BadInput
from pipeline.ir.schema import DDL

PatternType = Literal["omission", "repeated_exploration", "zero_information_gain"]

HIT_COLUMNS = ("cell_id", "key", "evidence", "first_seq", "last_seq", "explanation")
"""What a probe returns, in this order: the cell, a concerns key (``target:`` / ``obligation:`` /
``transition:``), the evidence event ids of that cell (a list), the first and last evidence
``seq`` and a one-line explanation."""

_HEADER = re.compile(r"^--\s*([a-z_]+)\s*:\s*(.*?)\s*$")
_ID = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_BOOL = {"true": True, "false": False}


@dataclass(frozen=True)
class Probe:
    """One probe: its SQL, the pattern type it suggests, whether it proves no change, and its source."""

    probe_id: str
    type: PatternType
    proves_unchanged: bool
    summary: str
    sql: str = ""
    path: str = ""  # the file as given (shipped: sql/<id>.sql)
    sha256: str = ""  # of the file's text: a changed probe reruns the probes stage
    shipped: bool = True


def base_sql() -> str:
    """The shared definitions every probe may use (``sql/_base.sql``)."""
    return resources.files("pipeline.probes").joinpath("sql", "_base.sql").read_text(encoding="utf-8")


def parse_probe(text: str, probe_id: str, path: str, *, shipped: bool) -> Probe:
    """A probe from its file text; anything off the contract is one BadInput line naming ``path``."""
    if not _ID.match(probe_id):
        raise BadInput(f"probe {path}: the file name must be <probe_id>.sql, lower case letters, digits and _")
    header: dict[str, str] = {}
    for line in text.splitlines():
        if not line.startswith("--"):
            break
        m = _HEADER.match(line)
        if m and m.group(1) in ("type", "proves_unchanged", "summary"):
            header.setdefault(m.group(1), m.group(2))
    missing = [k for k in ("type", "proves_unchanged", "summary") if not header.get(k)]
    if missing:
        raise BadInput(f"probe {path}: header line(s) missing: {', '.join(f'-- {k}: ...' for k in missing)}")
    if header["type"] not in get_args(PatternType):
        raise BadInput(f"probe {path}: type {header['type']!r} is not one of {', '.join(get_args(PatternType))}")
    if header["proves_unchanged"].lower() not in _BOOL:
        raise BadInput(f"probe {path}: proves_unchanged must be true or false, got {header['proves_unchanged']!r}")
    try:
        statements = duckdb.extract_statements(text)
    except duckdb.Error as exc:
        raise BadInput(f"probe {path}: {_first_line(exc)}") from None
    if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
        kinds = ", ".join(s.type.name for s in statements) or "none"
        raise BadInput(f"probe {path}: must be exactly one SELECT statement (found: {kinds})")
    return Probe(
        probe_id=probe_id,
        type=cast(PatternType, header["type"]),
        proves_unchanged=_BOOL[header["proves_unchanged"].lower()],
        summary=header["summary"],
        sql=text,
        path=path,
        sha256=sha256_text(text),
        shipped=shipped,
    )


def _first_line(exc: BaseException) -> str:
    return " ".join(str(exc).split("\n")[0].split())


def check_against_empty_ir(probes: tuple[Probe, ...]) -> None:
    """Run each probe over an empty IR: SQL errors and a wrong result shape fail here, naming the file."""
    con = duckdb.connect(":memory:")
    try:
        con.execute(DDL)
        con.execute(base_sql())
        for probe in probes:
            try:
                cur = con.execute(probe.sql)
            except duckdb.Error as exc:
                raise BadInput(f"probe {probe.path}: {_first_line(exc)}") from None
            columns = tuple(d[0] for d in cur.description or ())
            if columns != HIT_COLUMNS:
                raise BadInput(
                    f"probe {probe.path}: returns columns ({', '.join(columns)}); "
                    f"a probe returns ({', '.join(HIT_COLUMNS)})"
                )
    finally:
        con.close()


def shipped_probes() -> tuple[Probe, ...]:
    """The probes lunasol ships (``sql/*.sql`` but ``_base``), loaded through the same contract."""
    folder = resources.files("pipeline.probes").joinpath("sql")
    names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".sql") and not p.name.startswith("_"))
    return tuple(
        parse_probe(folder.joinpath(n).read_text(encoding="utf-8"), n.removesuffix(".sql"), f"sql/{n}", shipped=True)
        for n in names
    )


def load_probe_dir(folder: Path, taken: tuple[Probe, ...] = ()) -> tuple[Probe, ...]:
    """The user's probes: every ``*.sql`` in ``folder``, checked against the contract and an empty IR.

    A probe id already used (by a shipped probe, in ``taken``) is refused: a hit names its probe.
    """
    if not folder.is_dir():
        raise BadInput(f"--probes {folder}: not a directory")
    files = sorted(p for p in folder.iterdir() if p.suffix == ".sql" and p.is_file())
    if not files:
        raise BadInput(f"--probes {folder}: no .sql probe files in it")
    used = {p.probe_id: p.path for p in taken}
    out: list[Probe] = []
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise BadInput(f"probe {f}: not UTF-8 text") from None
        probe = parse_probe(text, f.stem, str(f), shipped=False)
        if probe.probe_id in used:
            raise BadInput(f"probe {f}: id {probe.probe_id!r} is already the probe {used[probe.probe_id]}")
        used[probe.probe_id] = str(f)
        out.append(probe)
    check_against_empty_ir(tuple(out))
    return tuple(out)
