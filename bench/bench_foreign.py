"""Foreign logs end to end: every dataset of ../shared/data in one bundle, live to gate 1, then the report.

Run: ``python bench/bench_foreign.py [--context-tokens 32000] [--copies 1] [--keep DIR] [--json]``.

``lunasol bundle import auto`` over a copy of all of ../shared/data (each file read by the adapter
whose format it looks like: a ``mixed`` bundle), then ``lunasol run`` in a child process against the
shipped local server with the scripted model (pipeline.testing.scripted), a small declared context so
Sol runs map/reduce, then ``lunasol report``. ``--copies N`` adds N-1 copies of every Who&When run,
each with its first message changed (N runs per task family, as a batch of repeated runs has).
Printed: cells, events, redactions, calls per role, Sol's plan, CPU and peak RSS of the run (via
bench_scale), the report's size and its refs (embedded, hash mismatches, unresolved: any
unresolved ref is a claim that does not resolve to raw bytes).

``--formats`` instead prints one row per installed format (every adapter of the registry, plugins
included): its samples (the test subsets of ../shared/data and tests/fixtures/foreign, or with
``--full`` the whole datasets of bench_adapters.py) imported with ``auto``, exported and probed
offline: cells, events by kind, probe hits, refs resolved, and import MB/s with, as the baseline
measured in the same run, the MB/s of only reading and parsing the same files with orjson.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_scale import lunasol_run, start_server  # the same child run, server and figures as the scale bench

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the tests package: where the shared data is (beside the clone, or LUNASOL_SHARED_DIR)

from pipeline.adapters import adapters, import_bundle  # noqa: E402
from pipeline.report.build import write_report  # noqa: E402
from pipeline.testing.scripted import ScriptedModel  # noqa: E402
from tests.adapters.adapter_helpers import SHARED_DATA as SHARED  # noqa: E402


def stage(dest: Path, copies: int) -> None:
    """Copy every dataset (writable), plus ``copies - 1`` edited copies of each Who&When run."""
    shutil.copytree(SHARED, dest, ignore=shutil.ignore_patterns("SOURCE.md", "README.md", "LICENSE*"))
    for p in dest.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    for k in range(1, copies):
        for p in sorted((SHARED / "who-and-when").rglob("*.json")):
            doc = json.loads(p.read_text(encoding="utf-8"))
            if not (isinstance(doc, dict) and isinstance(doc.get("history"), list) and doc["history"]):
                continue
            doc["history"][0]["content"] = f"{doc['history'][0].get('content', '')}\n(run {k + 1})"
            out = dest / f"who-and-when-run{k + 1}" / p.relative_to(SHARED / "who-and-when")
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(doc, indent=4, ensure_ascii=False), encoding="utf-8")


def measure(work: Path, context_tokens: int, copies: int) -> dict[str, Any]:
    """Import, run live to gate 1 and render the report; the figures."""
    src, bundle = work / "src", work / "bundle"
    stage(src, copies)
    t0 = time.perf_counter()
    imported = import_bundle("auto", src, bundle)
    import_s = time.perf_counter() - t0
    model = ScriptedModel()
    server, _ = start_server(model)
    try:
        budget = ("--context-tokens", str(context_tokens))
        run = lunasol_run(bundle, work / "runs", server, model, False, extra_args=budget)
    finally:
        server.stop()
    t0 = time.perf_counter()
    _, stats = write_report(work / "runs" / "r")
    report_s = time.perf_counter() - t0
    return {
        "cells": imported.cells,
        "formats": imported.formats,
        "not_runs": len(imported.skipped),
        "import_s": round(import_s, 2),
        "run": {k: run[k] for k in ("exit", "cpu", "stages", "peak_tree_rss_mib", "calls") if k in run},
        "lines": [line for line in run["lines"] if line.startswith(("[export]", "[luna]", "[sol]"))],
        "report": {**stats, "seconds": round(report_s, 2)},
    }


def _sample_sets(full: bool) -> dict[str, list[tuple[Path, list[str]]]]:
    """Per format: (folder, files) to import; an empty file list means the whole folder."""
    from bench_adapters import DATASETS  # the full datasets, when asked for

    from tests.adapters.adapter_helpers import SUBSETS

    out: dict[str, list[tuple[Path, list[str]]]] = {}
    if full:
        for fmt, folder in DATASETS:
            if fmt != "auto":
                out.setdefault(fmt, []).append((SHARED / folder, []))
    else:
        for fmt, (folder, files) in SUBSETS.items():
            out.setdefault(fmt, []).append((SHARED / folder, files))
    for fmt in ("codex", "gemini-cli"):  # real public samples committed with the tests
        out[fmt] = [(ROOT / "tests/fixtures/foreign" / fmt, [])]
    return out


def _copy(folder: Path, files: list[str], dest: Path) -> int:
    """Copy the sample files (all of ``folder`` when ``files`` is empty); their total bytes."""
    chosen = files or [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()]
    total = 0
    for rel in chosen:
        if rel.endswith(("README.md", "LICENSE")):
            continue
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(folder / rel, out)
        total += out.stat().st_size
    return total


def _parse_baseline(src: Path) -> float:
    """Seconds to read and parse every JSON / JSON Lines file under ``src`` with orjson (the baseline)."""
    import orjson  # the parser the adapters use

    t0 = time.perf_counter()
    for p in sorted(src.rglob("*")):
        if not p.is_file():
            continue
        raw = p.read_bytes()
        try:
            orjson.loads(raw)
        except orjson.JSONDecodeError:
            for line in raw.splitlines():
                with contextlib.suppress(orjson.JSONDecodeError):
                    orjson.loads(line)
    return time.perf_counter() - t0


def per_format(work: Path, full: bool) -> list[dict[str, Any]]:
    """Import, export and probe every installed format's samples; one row of figures per format."""
    import duckdb  # the IR, read back for the counts

    from pipeline.ir.export import export
    from pipeline.probes import run_probes
    from tests.adapters.adapter_helpers import check_refs, events_of

    sets = _sample_sets(full)
    rows: list[dict[str, Any]] = []
    for fmt in adapters():
        if fmt not in sets:
            rows.append({"format": fmt, "samples": 0})
            continue
        src = work / fmt / "src"
        size = sum(_copy(folder, files, src / f"s{i}") for i, (folder, files) in enumerate(sets[fmt]))
        parse_s = min(_parse_baseline(src) for _ in range(3))
        t0 = time.perf_counter()
        result = import_bundle("auto", src, work / fmt / "bundle")
        import_s = time.perf_counter() - t0
        run = work / fmt / "runs" / "r"
        export(work / fmt / "bundle", run)
        events = events_of(run)
        ok, bad = check_refs(work / fmt / "bundle", events)
        con = duckdb.connect(str(run / "ir.duckdb"))
        try:
            hits = run_probes(con)
        finally:
            con.close()
        kinds: dict[str, int] = {}
        for e in events:
            kinds[e["kind"]] = kinds.get(e["kind"], 0) + 1
        probes: dict[str, int] = {}
        for h in hits:
            probes[h.probe_id] = probes.get(h.probe_id, 0) + 1
        mb = size / 1e6
        rows.append(
            {
                "format": fmt,
                "read_by": result.formats,
                "samples": sum(1 for p in src.rglob("*") if p.is_file()),
                "mb": round(mb, 3),
                "cells": result.cells,
                "events": len(events),
                "by_kind": dict(sorted(kinds.items(), key=lambda kv: -kv[1])),
                "probe_hits": len(hits),
                "hit_cells": len({h.cell_id for h in hits}),
                "by_probe": probes,
                "refs_resolved": ok,
                "refs_failed": len(bad),
                "import_mb_s": round(mb / import_s, 2),
                "parse_mb_s": round(mb / parse_s, 2) if parse_s else None,
                "import_vs_parse": round(parse_s / import_s, 3),
            }
        )
    return rows


def print_formats(rows: list[dict[str, Any]]) -> None:
    """The per-format table."""
    print("format          files     MB  cells events  hits(cells)  refs ok/failed  import MB/s  (x orjson parse)")
    for r in rows:
        if not r.get("samples"):
            print(f"{r['format']:<14}  no samples")
            continue
        print(
            f"{r['format']:<14} {r['samples']:>5} {r['mb']:>6.2f} {r['cells']:>6} {r['events']:>6} "
            f"{r['probe_hits']:>6}({r['hit_cells']:>3})  {r['refs_resolved']:>7}/{r['refs_failed']:<6} "
            f"{r['import_mb_s']:>10.2f}  x{r['import_vs_parse']:.3f}"
        )
        kinds = ", ".join(f"{k} {n}" for k, n in r["by_kind"].items())
        probes = ", ".join(f"{k} {n}" for k, n in r["by_probe"].items()) or "none"
        print(f"    read by {', '.join(r['read_by'])}; kinds: {kinds}; probes: {probes}")


def main() -> None:
    """CLI: print the figures (or JSON)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--context-tokens", type=int, default=32000, help="declared context (small: Sol maps)")
    ap.add_argument("--copies", type=int, default=1, help="runs per Who&When task (1: the data as it is)")
    ap.add_argument("--keep", type=Path, help="work here and keep it (default: a temp dir, removed)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--formats", action="store_true", help="per installed format: samples imported, probed (offline)")
    ap.add_argument("--full", action="store_true", help="with --formats: the whole datasets, not the test subsets")
    args = ap.parse_args()
    if args.formats:
        with tempfile.TemporaryDirectory(prefix="bench-formats-") as tmp:
            rows = per_format(Path(tmp), args.full)
        if args.json:
            print(json.dumps(rows, indent=1))
        else:
            print_formats(rows)
        return
    if not SHARED.is_dir():
        sys.exit(f"shared data not found at {SHARED}")
    work = args.keep or Path(tempfile.mkdtemp(prefix="bench-foreign-"))
    if args.keep and work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    try:
        res = measure(work, args.context_tokens, args.copies)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(res, indent=1))
        return
    run, rep = res["run"], res["report"]
    formats = ", ".join(res["formats"])
    print(f"import: {res['cells']} cells, formats {formats}; {res['not_runs']} files not runs; {res['import_s']} s")
    rss = run["peak_tree_rss_mib"]
    print(f"run: exit {run['exit']}, CPU {run['cpu']:.1f} s, peak RSS {rss:.0f} MiB, calls {run['calls']}")
    for line in res["lines"]:
        print(f"  {line[:300]}")
    print(
        f"report: {rep['bytes']:,} bytes, {rep['refs']} refs embedded, {rep['hash_mismatches']} hash mismatches, "
        f"{rep['unresolved']} unresolved, {rep['seconds']} s"
    )


if __name__ == "__main__":
    main()
