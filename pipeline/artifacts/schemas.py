"""Reading versioned artifacts: refuse newer files, upgrade older ones in memory, validate.

The pydantic models are the single source of truth; each model's ``schema_version`` default is
read from :data:`pipeline.artifacts.versions.VERSIONS`, and :mod:`pipeline.catalog` lists every
artifact with its model (``lunasol schema``). Reading an artifact (:func:`load_document` /
:func:`load_artifact`):

- a ``schema_version`` newer than this lunasol's is refused with one line (:class:`BadInput`,
  exit 2) telling the user to upgrade lunasol;
- an older one (0 = written before the field existed) is upgraded in memory by the steps of
  :mod:`pipeline.artifacts.migrations`, one version at a time; the file on disk is left as it is
  (the next write of that artifact writes the current version);
- a gap in the chain is a bug in lunasol, reported as such.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel

from pipeline.artifacts.migrations import Doc, Migration, steps
from pipeline.artifacts.versions import VERSIONS
from pipeline.core.errors import BadInput

Kind = Literal["json", "jsonl-row", "yaml"]
M = TypeVar("M", bound=BaseModel)


def current_version(name: str) -> int:
    """The version this lunasol writes for artifact ``name``; an unknown name is one line naming the known ones."""
    try:
        return VERSIONS[name]
    except KeyError:
        raise BadInput(f"unknown artifact {name!r}; known: {', '.join(VERSIONS)}") from None


def migrations_for(name: str) -> list[Migration]:
    """The steps of one artifact, in order (the shared v0 rule first)."""
    return steps(name)


def version_of(doc: Any, source: str) -> int:
    """The ``schema_version`` of a document (0 when it has none: written before the field existed)."""
    if not isinstance(doc, dict):
        raise BadInput(f"{source} is not a JSON object")
    version = doc.get("schema_version", 0)
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise BadInput(f"{source} has schema_version {version!r}; expected a whole number")
    return version


def upgrade(doc: Any, name: str, source: str) -> tuple[Doc, int]:
    """``doc`` at the current version of artifact ``name``, and the version it was found at.

    Newer than this lunasol: one line, exit 2. Older: the migration steps, in order.
    """
    current = current_version(name)
    found = version_of(doc, source)
    if found > current:
        raise BadInput(
            f"{source} has schema_version {found}, newer than this lunasol reads (up to {current}): upgrade lunasol"
        )
    out: Doc = dict(doc)
    version = found
    for m in migrations_for(name):
        if m.from_version == version and version < current:
            out = m.upgrade(out)
            out["schema_version"] = m.to_version  # a migration cannot forget to say what it produced
            version = m.to_version
    if version != current:
        # a missing step is lunasol's bug, not the user's; say so plainly
        raise BadInput(
            f"{source} has schema_version {found} and lunasol has no migration from {version} to {current} "
            f"for {name} (a lunasol bug: please report it)"
        )
    return out, found


def read_document(path: Path, kind: Kind = "json") -> Any:
    """Parse an artifact file; unreadable content is one BadInput line."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise BadInput(f"{path} is not UTF-8 text") from None
    return parse_document(text, path, kind)


def parse_document(text: str, path: Path, kind: Kind = "json") -> Any:
    """Parse the text of artifact file ``path`` (read by the caller); unreadable content is one BadInput line."""
    if kind == "yaml":
        import yaml  # only proposals files are YAML; most readers never need it

        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise BadInput(f"{path}: not readable YAML: {' '.join(str(exc).split())}") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise BadInput(f"{path} is not valid JSON ({exc})") from None


def load_document(path: Path, name: str, kind: Kind = "json") -> tuple[Doc, int]:
    """Read artifact ``name`` from ``path`` at the current version (a dict) and the version found on disk."""
    current_version(name)
    if not path.is_file():
        raise BadInput(f"{path} not found")
    return upgrade(read_document(path, kind), name, str(path))


def load_artifact(path: Path, name: str, model: type[M], kind: Kind = "json") -> M:
    """Read, version-check, upgrade and validate artifact ``name`` into ``model``."""
    doc, _ = load_document(path, name, kind)
    return _validate(doc, path, name, model)


def artifact_from_bytes(raw: bytes, path: Path, name: str, model: type[M], kind: Kind = "json") -> M:
    """:func:`load_artifact` of bytes the caller read from ``path`` (which it may compare with later reads)."""
    current_version(name)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadInput(f"{path} is not UTF-8 text") from None
    doc, _ = upgrade(parse_document(text, path, kind), name, str(path))
    return _validate(doc, path, name, model)


def _validate(doc: Doc, path: Path, name: str, model: type[M]) -> M:
    try:
        return model.model_validate(doc)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        first = str(exc).splitlines()
        detail = " ".join(first[:3]) if first else type(exc).__name__
        raise BadInput(f"{path}: not a valid {name} (schema_version {current_version(name)}): {detail}") from None


def upgrade_rows(rows: list[Any], name: str, source: str) -> list[Doc]:
    """Every row of a JSONL artifact at the current version (errors name the 1-based row)."""
    return [upgrade(row, name, f"{source} row {n}")[0] for n, row in enumerate(rows, 1)]


__all__ = [
    "Kind",
    "artifact_from_bytes",
    "current_version",
    "load_artifact",
    "load_document",
    "migrations_for",
    "parse_document",
    "read_document",
    "upgrade",
    "upgrade_rows",
    "version_of",
]
