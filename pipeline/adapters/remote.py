"""``lunasol bundle import FORMAT URL DEST`` for object storage: fetch, then import the local copy.

The objects listed under the URL are fetched (a bounded number at a time, each streamed to disk,
never held whole in memory) into a staging folder beside DEST (``.DEST.fetch/``), then the local
import reads that folder exactly as it reads a folder on disk: detection, adapters, bounds and the
frozen bundle are the same, and so is its digest. ``manifest.sources.json`` records each object's
URL, ETag, version and size with the sha256 of its bytes (see :mod:`pipeline.bundle.sources`).

Resumable: the staging folder keeps every object fetched whole (written to ``.part`` and renamed)
and ``fetched.jsonl`` its ETag and size; an interrupted import run again fetches only the objects
missing or changed since. A finished import, or one refused as bad input, removes the staging folder.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.adapters.importer import ImportResult
from pipeline.bundle.request import check_relative
from pipeline.bundle.sources import SourceObject, SourcesDoc, write_sources
from pipeline.core.canonical import sha256_file
from pipeline.core.errors import BadInput, BundleError
from pipeline.core.objstore import join, list_objects, open_url, shown, storage_errors

FETCH_WORKERS = 8  # objects fetched at a time: enough to hide a store's per-request latency, bounded
STATE_FILE = "fetched.jsonl"
_RAW = "raw"

Listing = dict[str, tuple[str | None, str | None, int]]
LocalImport = Callable[[Path, Path, Callable[[Path], None]], ImportResult]


@dataclass
class FetchStats:
    """What one import fetched and what it found already fetched by an interrupted run."""

    objects: int = 0
    fetched: int = 0
    reused: int = 0
    bytes_fetched: int = 0


def staging_dir(dest: Path) -> Path:
    """Where objects for ``dest`` are fetched to (kept across an interruption, removed when done)."""
    return dest.parent / f".{dest.name}.fetch"


def _source_name(path: str) -> str:
    name = path.rstrip("/").rsplit("/", 1)[-1]
    return name or "source"


def _read_state(stage: Path, url: str) -> dict[str, tuple[str | None, int, str]]:
    """Objects an earlier run fetched whole: key -> (etag, size, sha256); empty when it was another URL."""
    marker = stage / "source.json"
    try:
        same = json.loads(marker.read_text()).get("url") == url
    except (OSError, ValueError, AttributeError):  # absent, or cut by the interruption
        same = False
    if not same:
        shutil.rmtree(stage, ignore_errors=True)
        return {}
    state: dict[str, tuple[str | None, int, str]] = {}
    state_path = stage / STATE_FILE
    if state_path.is_file():
        for line in state_path.read_text().split("\n"):  # an object name may hold U+2028
            try:
                row = json.loads(line)
                state[row["key"]] = (row["etag"], int(row["size"]), row["sha256"])
            except (ValueError, KeyError, TypeError):
                continue  # a line cut by the interruption: that object is fetched again
    return state


def _fetch_one(fs: Any, remote: str, local: Path, size: int) -> str:
    """Fetch one object to ``local`` (via ``.part``, renamed when whole); the sha256 of its bytes."""
    local.parent.mkdir(parents=True, exist_ok=True)
    part = local.with_name(local.name + ".part")
    fs.get_file(remote, str(part))
    got = part.stat().st_size
    if got != size:
        part.unlink(missing_ok=True)
        raise BundleError(f"{remote}: {got} bytes fetched, {size} listed (the object changed while fetching?)")
    digest = sha256_file(part)
    os.replace(part, local)
    return digest


def _keys_checked(listing: Listing) -> None:
    for key in listing:
        check_relative(key, "object key")
        if any(part in ("", ".") for part in key.split("/")):
            raise BadInput(f"object key {key!r} has an empty or '.' path part; cannot copy it to a folder")


def fetch(
    url: str, dest: Path, single: bool, listing: Listing, opened: tuple[Any, str] | None = None
) -> tuple[Path, dict[str, str], FetchStats]:
    """Fetch every listed object into the staging folder: (local source to import, key -> sha256, stats)."""
    fs, root = opened or open_url(url)
    root = root.rstrip("/")
    name = _source_name(root)
    stage = staging_dir(dest)
    state = _read_state(stage, shown(url))
    base = stage / "objects"
    src = base / name

    def local_of(key: str) -> Path:
        return base / key if single else src / key

    def remote_of(key: str) -> str:
        return root if single else f"{root}/{key}"

    stage.mkdir(parents=True, exist_ok=True)
    (stage / "source.json").write_text(json.dumps({"url": shown(url)}))
    stats = FetchStats(objects=len(listing))
    digests: dict[str, str] = {}
    todo: list[str] = []
    for key, (etag, _, size) in sorted(listing.items()):
        done = state.get(key)
        local = local_of(key)
        if done is not None and done[:2] == (etag, size) and local.is_file() and local.stat().st_size == size:
            digests[key] = done[2]
            stats.reused += 1
        else:
            todo.append(key)
    with (stage / STATE_FILE).open("a") as log, ThreadPoolExecutor(max_workers=FETCH_WORKERS) as pool:
        pending: dict[Future[str], str] = {}
        keys = iter(todo)

        def record(fut: Future[str]) -> None:
            key = pending.pop(fut)
            digests[key] = fut.result()
            etag, _, size = listing[key]
            log.write(json.dumps({"key": key, "etag": etag, "size": size, "sha256": digests[key]}) + "\n")
            log.flush()
            stats.fetched += 1
            stats.bytes_fetched += size

        def stop() -> None:
            # what finished whole before the failure is kept for the next run; the rest is cancelled
            for fut in list(pending):
                if fut.done() and not fut.cancelled() and fut.exception() is None:
                    record(fut)
                else:
                    fut.cancel()

        try:
            with storage_errors(url, "fetch from"):
                while True:
                    # at most FETCH_WORKERS * 2 submitted: a listing of a million keys is not a million futures
                    for key in keys:
                        size = listing[key][2]
                        pending[pool.submit(_fetch_one, fs, remote_of(key), local_of(key), size)] = key
                        if len(pending) >= FETCH_WORKERS * 2:
                            break
                    if not pending:
                        break
                    finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                    for fut in finished:
                        record(fut)
        except BadInput as exc:
            stop()
            raise BadInput(
                f"{exc.one_line()}; {len(digests)} of {len(listing)} objects fetched "
                f"(kept in {stage}: run the same command again to resume)"
            ) from None
        except BaseException:
            stop()
            raise
    return (base / name), digests, stats


def import_url(fmt: str, url: str, dest: Path, local_import: LocalImport) -> tuple[ImportResult, FetchStats]:
    """Import the objects under ``url`` into the new bundle ``dest`` (see the module docstring)."""
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise BadInput(f"destination {dest} exists and is not empty; choose a new directory")
    opened = open_url(url)  # one client for the listing and every fetch
    single, listing = list_objects(url, opened)
    _keys_checked(listing)
    src, digests, stats = fetch(url, dest, single, listing, opened)
    base = shown(url).rstrip("/")

    def record(bundle: Path) -> None:
        objects = []
        for key, (etag, version, size) in sorted(listing.items()):
            rel = f"{_RAW}/{src.name}" if single else f"{_RAW}/{key}"
            objects.append(
                SourceObject(
                    key=key,
                    url=base if single else join(base, key),
                    etag=etag,
                    version_id=version,
                    size=size,
                    sha256=digests[key],
                    path=rel if (bundle / rel).is_file() else None,
                )
            )
        write_sources(bundle, SourcesDoc(url=base, single=single, objects=objects))

    try:
        result = local_import(src, dest, record)
    except BadInput:
        shutil.rmtree(staging_dir(dest), ignore_errors=True)  # refused: nothing left behind
        raise
    shutil.rmtree(staging_dir(dest), ignore_errors=True)
    return result, stats


def source_listing(url: str) -> Listing:
    """The objects under a recorded source URL now (for ``bundle verify --source``)."""
    with storage_errors(url, "list"):
        return list_objects(url)[1]
