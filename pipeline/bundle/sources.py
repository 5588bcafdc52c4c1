"""``manifest.sources.json``: where an imported bundle's bytes came from (object storage), and whether it changed.

A bundle imported from ``s3://``, ``gs://`` or ``az://`` keeps, beside ``manifest.json``, every
listed source object's URL, ETag, version id and size with the sha256 of the bytes fetched, and the
bundle path that holds them (null for an object the import did not keep: a label file, a copy, a
file no format reads). Like the manifest it describes the freeze and is not itself frozen: the
bundle's digest (the manifest's bytes) is the same whether the files came from a bucket or a disk.
``lunasol bundle verify --source`` lists the URL again and names every object changed, gone or
added since. No credential is ever written here: URLs are kept as :func:`pipeline.core.objstore.shown` shows them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.artifacts.versions import VERSIONS
from pipeline.core.canonical import write_json
from pipeline.core.errors import BundleError

SOURCES_FILE = "manifest.sources.json"
SOURCES_SCHEMA_VERSION = VERSIONS["manifest-sources"]


class SourceObject(BaseModel):
    """One object listed under the source URL at import time."""

    model_config = ConfigDict(extra="forbid")

    key: str = Field(description="POSIX path of the object relative to the source URL")
    url: str = Field(description="the object's URL, credentials never included")
    etag: str | None = Field(description="the store's ETag (or content MD5 / generation) when it gives one")
    version_id: str | None = Field(default=None, description="the object version, on a versioned bucket")
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^sha256:[0-9a-f]{64}$", description="of the bytes fetched")
    path: str | None = Field(description="the bundle path holding these bytes; null when not kept")


class SourcesDoc(BaseModel):
    """The schema of ``manifest.sources.json``."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SOURCES_SCHEMA_VERSION
    url: str = Field(description="the URL imported (a prefix or one object), credentials never included")
    single: bool = Field(default=False, description="the URL named one object, not a prefix")
    objects: list[SourceObject] = Field(description="sorted by key")


def write_sources(bundle: Path, doc: SourcesDoc) -> None:
    """Write ``manifest.sources.json`` at the bundle's root (atomically)."""
    write_json(bundle / SOURCES_FILE, doc.model_dump(mode="json"))


def read_sources(bundle: Path) -> SourcesDoc | None:
    """The bundle's source record, or None for a bundle not imported from object storage."""
    path = bundle / SOURCES_FILE
    if not path.is_file() or path.is_symlink():
        return None
    try:
        return SourcesDoc.model_validate_json(path.read_bytes())
    except ValidationError as exc:
        raise BundleError(f"{SOURCES_FILE}: not a valid source record ({exc.error_count()} errors)") from None


@dataclass
class SourceReport:
    """What differs between the source URL now and the record of the freeze."""

    url: str
    objects: int
    changed: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every recorded object is there with its ETag and size, and none was added."""
        return not (self.changed or self.missing or self.added)

    def lines(self) -> list[str]:
        """One line per difference: ``source changed: URL``, ``source missing: URL``, ``source added: URL``."""
        return (
            [f"source changed: {u}" for u in self.changed]
            + [f"source missing: {u}" for u in self.missing]
            + [f"source added: {u}" for u in self.added]
        )

    def to_json(self) -> dict[str, Any]:
        """Machine-readable form for ``--json``."""
        return {
            "url": self.url,
            "objects": self.objects,
            "ok": self.ok,
            "changed": self.changed,
            "missing": self.missing,
            "added": self.added,
        }


def compare(doc: SourcesDoc, listing: dict[str, tuple[str | None, str | None, int]]) -> SourceReport:
    """Compare the record with a fresh ``listing`` (key -> (etag, version id, size)) of the same URL."""
    report = SourceReport(url=doc.url, objects=len(doc.objects))
    seen = {o.key for o in doc.objects}
    for o in doc.objects:
        now = listing.get(o.key)
        if now is None:
            report.missing.append(o.url)
        elif (
            now[2] != o.size
            or (o.etag is not None and now[0] != o.etag)
            or (o.version_id is not None and now[1] is not None and now[1] != o.version_id)
        ):
            report.changed.append(o.url)
    report.added = sorted((doc.url if doc.single else doc.url.rstrip("/") + "/" + k) for k in listing if k not in seen)
    return report
