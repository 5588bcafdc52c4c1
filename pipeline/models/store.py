"""Content-addressed recording store: one readable JSON file per model exchange.

The key is ``sha256:`` of the canonical request: model, messages, the output schema
(tools / tool_choice / response_format), sampling parameters and the instructor mode.
It leaves out what cannot change the answer (api_base, keys, timeouts, retries,
concurrency), so a recording made against one endpoint replays against any other.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from pipeline.artifacts.versions import VERSIONS
from pipeline.core.canonical import canonical_json, digest, read_json, write_json
from pipeline.core.errors import BadInput
from pipeline.core.settings import ModelSettings

STORE_SCHEMA_VERSION = VERSIONS["recording"]


class Recording(BaseModel):
    """One recording file (``<store>/<2 hex>/<key hex>.json``): a model exchange, raw bodies kept."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = STORE_SCHEMA_VERSION
    key: str = Field(description="sha256 of the canonical request (KEY_FIELDS only)")
    role: str
    cell_id: str | None
    template_hash: str
    model: str
    attempt: int
    request: dict[str, Any] = Field(description="the request body as sent (no key, header or api_base)")
    response: dict[str, Any] = Field(description="the raw response body")
    response_source: str
    versions: dict[str, str | None] = Field(default_factory=dict, description="library versions that made it")


KEY_FIELDS = (
    "model",
    "messages",
    "tools",
    "tool_choice",
    "response_format",
    "functions",
    "function_call",
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "seed",
    "stop",
    "n",
    "presence_penalty",
    "frequency_penalty",
)
"""Request fields that can change the answer; everything else (api_base, api_key, timeout, retries) is left out."""

StoreMode = Literal["record", "replay"]
STALE_TEMP_S = 10.0  # a temp file untouched this long was left by a killed writer


def canonical_request(kwargs: dict[str, Any], instructor_mode: str) -> dict[str, Any]:
    """The part of a litellm request that defines the answer, as plain JSON data."""
    import json

    picked = {k: kwargs[k] for k in KEY_FIELDS if kwargs.get(k) is not None}
    # Round-trip through canonical JSON so pydantic message objects (instructor's re-ask
    # messages) become plain dicts and the stored request equals what was hashed.
    plain: dict[str, Any] = json.loads(canonical_json(picked))
    plain["instructor_mode"] = instructor_mode
    return plain


def request_key(request: dict[str, Any]) -> str:
    """``sha256:<hex>`` of the canonical request."""
    return digest(request)


@functools.cache
def library_versions() -> dict[str, str]:
    """Versions whose prompt wording ends up in requests (a bump means re-record)."""
    out = {}
    for name in ("litellm", "instructor", "pydantic", "openai"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:  # pragma: no cover - all are dependencies
            out[name] = "absent"
    return out


class RecordingStore:
    """A directory of exchanges ``<root>/<hex[:2]>/<hex>.json``, in record or replay mode."""

    def __init__(self, root: Path, mode: StoreMode) -> None:
        self.root = Path(root)
        self.mode: StoreMode = mode
        self._lock = threading.Lock()
        self.written: set[str] = set()  # keys recorded by this store object (this run)
        self.served: set[str] = set()  # keys answered from disk
        self._scanned: tuple[frozenset[str], frozenset[str]] | None = None

    def path_for(self, key: str) -> Path:
        """File of one exchange."""
        hexpart = key.split(":", 1)[-1]
        return self.root / hexpart[:2] / f"{hexpart}.json"

    def has(self, key: str) -> bool:
        """Whether an exchange for ``key`` is on disk (recorded by this run or an earlier one)."""
        return self.path_for(key).is_file()

    def load(self, key: str) -> dict[str, Any] | None:
        """The stored exchange for ``key``, or None."""
        path = self.path_for(key)
        if not path.is_file():
            return None
        record: dict[str, Any] = read_json(path)
        with self._lock:
            self.served.add(key)
        return record

    def save(self, record: dict[str, Any]) -> Path:
        """Write one exchange atomically (pretty canonical JSON, so diffs are readable)."""
        path = self.path_for(record["key"])
        write_json(path, record)
        with self._lock:
            self.written.add(record["key"])
        return path

    def remove_stale_temps(self, older_than_s: float = STALE_TEMP_S) -> int:
        """Remove the temp files a killed writer left (``<xx>/.<key>.json.*.tmp``); how many went.

        Only those untouched for ``older_than_s``: a writer finishes a temp file in milliseconds, so
        one that old belongs to no live process (another verb may be writing to the same run).
        """
        if not self.root.is_dir():
            return 0
        cutoff = time.time() - older_than_s
        removed = 0
        for tmp in self.root.glob("*/.*.tmp"):
            with contextlib.suppress(OSError):  # gone meanwhile: someone else cleaned it
                if tmp.stat().st_mtime < cutoff:
                    tmp.unlink()
                    removed += 1
        return removed

    def keys(self) -> list[str]:
        """Every key in the store, sorted."""
        if not self.root.is_dir():
            return []
        return sorted("sha256:" + p.stem for p in self.root.glob("*/*.json"))

    def unused(self) -> list[str]:
        """Keys in the store this replay never served (a stale or oversized recording)."""
        return [k for k in self.keys() if k not in self.served and k not in self.written]

    def models(self) -> set[str]:
        """Model strings found in the recordings."""
        return set(self._summary()[0])

    def instructor_modes(self) -> set[str]:
        """Instructor modes found in the recordings' requests."""
        return set(self._summary()[1])

    def _summary(self) -> tuple[frozenset[str], frozenset[str]]:
        # One pass over the files, kept: a replay asks for both before its first call.
        if self._scanned is None:
            models: set[str] = set()
            modes: set[str] = set()
            for key in self.keys():
                rec = read_json(self.path_for(key))
                if not isinstance(rec, dict):
                    continue
                if rec.get("model"):
                    models.add(str(rec["model"]))
                mode = (rec.get("request") or {}).get("instructor_mode")
                if isinstance(mode, str):
                    modes.add(mode)
            self._scanned = (frozenset(models), frozenset(modes))
        return self._scanned


def make_record(
    *,
    key: str,
    request: dict[str, Any],
    response: dict[str, Any],
    response_source: str,
    role: str,
    cell_id: str | None,
    template_hash: str,
    model: str,
    attempt: int,
) -> dict[str, Any]:
    """One recording file's content (never contains a key, header or api_base)."""
    return {
        "schema_version": STORE_SCHEMA_VERSION,
        "key": key,
        "role": role,
        "cell_id": cell_id,
        "template_hash": template_hash,
        "model": model,
        "attempt": attempt,
        "request": request,
        "response": response,
        "response_source": response_source,
        "versions": library_versions(),
    }


def check_record(record: Any, path: Path) -> dict[str, Any]:
    """Refuse a recording of a newer schema version or without a response."""
    if not isinstance(record, dict) or "response" not in record:
        raise BadInput(f"not a lunasol recording: {path}")
    version = record.get("schema_version", 1)
    if not isinstance(version, int) or version > STORE_SCHEMA_VERSION:
        raise BadInput(f"recording {path} has schema_version {version}; this lunasol reads <= {STORE_SCHEMA_VERSION}")
    return record


def resolve_settings(settings: Any) -> Any:
    """Settings with ``model`` (and the instructor mode) filled from a replay store when not given.

    Call it once before the stages run, so every artifact that names the model names the same one
    in a recording run and in its replay (``--replay DIR`` alone is then enough).
    """
    if (settings.model and settings.instructor_mode) or settings.effective_mode() != "replay" or not settings.store:
        return settings
    store = RecordingStore(Path(settings.store), "replay")
    if not store.root.is_dir():
        raise BadInput(f"replay store not found: {settings.store}")
    update: dict[str, Any] = {}
    models = store.models()
    if not settings.model:
        if len(models) > 1:
            raise BadInput(f"replay store holds several models ({', '.join(sorted(models))}); pass --model")
        if models:
            update["model"] = next(iter(models))
    modes = store.instructor_modes()
    if not settings.instructor_mode and len(modes) == 1:
        update["instructor_mode"] = next(iter(modes))
    return settings.model_copy(update=update) if update else settings


def check_store(settings: ModelSettings) -> None:
    """Before any work (the CLI calls it): the record / replay store fits the mode and the model.

    Without it a file given as a store surfaces late, and a replay under another ``--model`` would
    fail late with a replay miss on the first call instead of one clear line up front.
    """
    store, mode = settings.store, settings.mode
    if store is None:
        return
    if mode == "record" and store.exists() and not store.is_dir():
        raise BadInput(f"record store {store} is a file; --record needs a directory (new or existing)")
    if mode == "replay":
        if not store.is_dir():
            raise BadInput(f"replay store not found: {store}")
        if settings.model:
            recorded = RecordingStore(store, "replay").models()
            if recorded and settings.model not in recorded:
                raise BadInput(
                    f"replay store {store} was recorded with {', '.join(sorted(recorded))}, not {settings.model}; "
                    "drop --model to replay it as recorded, or record with this model"
                )
