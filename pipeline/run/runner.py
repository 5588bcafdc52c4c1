"""``lunasol run``: the stages of one analysis run, in order, up to the first human gate.

Each stage is a function ``stage(ctx) -> str`` (a one-line summary) in its own module. The runner
is ledger-aware (:mod:`pipeline.state.ledger`): a stage whose inputs (the bundle digest for export,
the upstream stage's fingerprint for the others, plus the template hash and model for a model
role) are unchanged and whose outputs are intact is reused, not run; a stage whose inputs changed
is invalidated with the reason, together with everything downstream, and recomputed. Per-cell
model results are reused inside the stage (``CellResults``), so one changed cell costs one Luna
call plus the downstream steps. A :class:`~pipeline.core.errors.Blocked` error writes
``block-receipt.json`` and ends the run with exit 3 and one line.
"""

from __future__ import annotations

import fcntl
import functools
import gc
import itertools
import os
import platform
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import pipeline
from pipeline import coordinator, probes
from pipeline.artifacts.run_info import RUN_SCHEMA_VERSION, read_run_info, run_command, run_pilot
from pipeline.artifacts.rundir import GROUPS, IR_FILE, PATTERNS, SHORTLIST, RunDir
from pipeline.artifacts.schemas import load_document
from pipeline.bundle import verified
from pipeline.bundle.manifest import MANIFEST_FILE, forget_manifests, read_manifest, remember_manifests, verify
from pipeline.bundle.request import REQUEST_FILE, load_request
from pipeline.coordinator.probe_estimate import estimate_groups
from pipeline.core import roles
from pipeline.core.canonical import digest, read_json, sha256_file, write_json
from pipeline.core.context import RunContext, RunOptions
from pipeline.core.errors import BadInput, Blocked, BundleError
from pipeline.core.memory import give_back
from pipeline.core.roles import RoleSpec
from pipeline.core.settings import ModelSettings
from pipeline.core.urls import shown_url
from pipeline.gates import gate1 as gates
from pipeline.gates.gate1 import GATE1
from pipeline.gates.gate2 import GATE2
from pipeline.ir import export
from pipeline.ir.digests import ir_cell_digests, stored_ir_digest
from pipeline.ir.schema import IR_SCHEMA_VERSION
from pipeline.luna.stage import plan as luna_plan
from pipeline.luna.stage import stage as luna_run
from pipeline.models import ROLES, PlannedCall, estimate, format_estimate, template_hash
from pipeline.models.preflight import preflight
from pipeline.models.progress import plain_every
from pipeline.models.store import resolve_settings
from pipeline.run import pilot
from pipeline.sol.shortlist import read_shortlist
from pipeline.sol.stage import plan as sol_plan
from pipeline.sol.stage import stage as sol_run
from pipeline.state import handoff
from pipeline.state.blocking import resolve_block_receipt, write_block_receipt
from pipeline.state.ledger import CellResults, Ledger, describe_changes, output_digests


@dataclass(frozen=True)
class Stage:
    """One stage of the flow, all its facts in one place: a new stage is one spec in :data:`STAGES` plus its code.

    ``run(ctx)`` does the work and returns a one-line summary; a model stage also ``plan(ctx)``s its calls.
    """

    name: str
    run: Callable[[RunContext], str]
    plan: Callable[[RunContext], Iterable[PlannedCall]] | None = None
    outputs: tuple[str, ...] = ()
    """Files (relative to the run) whose digests are its output fingerprint; none: it is deterministic
    in its inputs, so its fingerprint is the digest of its inputs."""
    role: RoleSpec | None = None
    """The model role it calls: the role's template hash and the model are then among its inputs."""
    extra_roles: tuple[RoleSpec, ...] = ()
    """Roles it may also call, their templates inputs too (Sol's map and reduce, when one call cannot hold it all)."""
    phase: handoff.Phase | None = None
    """The run's phase once it succeeds."""


# The order is the flow of the main job.
STAGES: tuple[Stage, ...] = (
    Stage("export", export.stage, phase="exported"),
    Stage("select", pilot.stage),  # a pilot's subset of the cells (--where / --sample); else every eligible cell
    Stage("probes", probes.stage),
    Stage("luna", luna_run, luna_plan, outputs=(PATTERNS.filename,), role=roles.LUNA, phase="patterns"),
    Stage("coordinator", coordinator.stage, outputs=(GROUPS.filename,), phase="aggregated"),
    Stage("sol", sol_run, sol_plan, outputs=(SHORTLIST.filename,), role=roles.SOL,
          extra_roles=(roles.SOL_MAP, roles.SOL_REDUCE), phase="rootCausesMined"),
)  # fmt: skip
_BY_NAME = {s.name: s for s in STAGES}
# Bad input in these leaves no run directory behind when this run created it (a --where matching no cell)
_FIRST_STAGES = ("export", "select")

DEFAULT_TIMEOUT_S = ModelSettings.model_fields["timeout_s"].default
INCOMPLETE = "incomplete: "  # ledger reason of a stage that finished with failed items
MANIFEST = MANIFEST_FILE
REQUEST = REQUEST_FILE
SUPERSEDED_DIR = "superseded"


@dataclass
class RunResult:
    """What one ``run`` did: which stages ran and which were reused."""

    ctx: RunContext
    ran: list[str] = field(default_factory=list)
    reused: list[str] = field(default_factory=list)
    estimate: Any = None
    pending: list[str] = field(default_factory=list)  # stages left pending, with why (failed cells)


# -- inputs and fingerprints ---------------------------------------------------------------------


def bundle_digest(bundle: Path) -> str:
    """The bundle's digest: the sha256 of its manifest (which lists every file's sha256)."""
    manifest = bundle / MANIFEST
    if not manifest.is_file():
        raise BundleError(f"bundle is not frozen: {manifest} missing (run: lunasol bundle freeze {bundle})")
    return sha256_file(manifest)


def default_run_id(bundle: Path) -> str:
    """The bundle's analysis run id, or its directory name."""
    if (bundle / REQUEST).is_file():
        # the strict reader: a request that does not load is one clear line here, before any run dir exists
        return load_request(bundle).analysis_run_id or bundle.resolve().name
    return bundle.resolve().name


def _template_hash(role: str) -> str | None:

    try:
        return template_hash(role)
    except BadInput:  # a missing template is reported by the stage itself, with its own message
        return None


def _versions() -> dict[str, str]:
    out = {"lunasol": pipeline.__version__, "python": platform.python_version()}
    for dist in ("litellm", "instructor", "openai", "pydantic", "duckdb", "jinja2"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "absent"
    return out


def model_inputs(settings: ModelSettings) -> dict[str, Any]:
    """The model settings recorded in run.json (never a key: providers read those from env)."""
    return {
        "model": settings.model,
        "api_base": shown_url(settings.api_base) if settings.api_base else None,  # never a credential either
        "mode": settings.effective_mode(),
        "store": str(settings.store) if settings.store else None,
        "temperature": settings.temperature,
        "max_reasks": settings.max_reasks,
        "concurrency": settings.concurrency,
        "budget_usd": settings.budget_usd,
        "instructor_mode": settings.instructor_mode,
        "max_tokens": settings.max_tokens,
        "context_tokens": settings.context_tokens,
        # only when on: a run without --batch keeps the run.json it always had
        **({"batch": True} if settings.batch else {}),
        **({"batch_queue_tokens": settings.batch_queue_tokens} if settings.batch_queue_tokens else {}),
        # only when not the default (same reason); the resume command repeats it (run_command)
        **({"timeout_s": settings.timeout_s} if settings.timeout_s != DEFAULT_TIMEOUT_S else {}),
    }


def write_run_json(ctx: RunContext, bdigest: str) -> None:
    """Record the run's inputs in run.json, keeping whatever the export stage wrote there."""
    path = RunDir(ctx.run_dir).run_json
    # through pipeline.artifacts.schemas: a newer run.json is refused rather than rewritten as an older one
    data: dict[str, Any] = load_document(path, "run")[0] if path.is_file() else {}
    data.setdefault("schema_version", RUN_SCHEMA_VERSION)
    data.setdefault("run_id", ctx.run_dir.name)
    data["inputs"] = {
        "bundle_path": str(ctx.bundle),
        "bundle_digest": bdigest,
        "models": model_inputs(ctx.options.models),
        "templates": {role: _template_hash(role) for role in ROLES},
        "versions": _versions(),
    }
    if ctx.options.probes_dir is not None:
        data["inputs"]["probes_dir"] = str(ctx.options.probes_dir)
        data["inputs"]["probes"] = probes.probe_list(ctx.options.probes_dir)
    write_json(path, data)


def stage_inputs(name: str, ctx: RunContext, bdigest: str, upstream: tuple[str, str] | None) -> dict[str, str]:
    """The digests a stage is made from."""
    inputs = {"lunasol": pipeline.__version__}
    if upstream is None:
        inputs["bundle"] = bdigest
        if name == "export":
            # an IR of another schema is rebuilt, not migrated (docs/schemas.md)
            inputs["ir_schema"] = str(IR_SCHEMA_VERSION)
    else:
        inputs[f"upstream:{upstream[0]}"] = upstream[1]
    if not ctx.options.redact and name in ("export", "luna"):
        # --no-redact makes other rows (export) and other task summaries in Luna's prompts; absent
        # when redacting, so a redacting run's inputs are what they always were
        inputs["redaction"] = "off"
    if name == "select" and ctx.options.pilot:
        # another pilot selection analyses other cells (absent for a full run: its inputs stay as they were)
        o = ctx.options
        inputs["pilot"] = digest({"where": o.where, "sample": o.sample, "seed": o.seed if o.sample else None})
    if name == "probes":
        # a changed (added, removed) probe file of --probes reruns the probes and what follows
        for p in probes.user_probes(ctx.options.probes_dir):
            inputs[f"probe:{p.probe_id}"] = p.sha256
    spec = _BY_NAME.get(name)
    if spec is not None and spec.role is not None:
        inputs["template"] = _template_hash(spec.role.template) or "missing"
        inputs["model"] = ctx.options.models.model or "default"
        for extra in spec.extra_roles:
            inputs[f"template:{extra.template}"] = _template_hash(extra.template) or "missing"
        if ctx.options.models.context_tokens:
            # another budget plans other requests (Luna's parts, Sol's map/reduce partitions)
            inputs["context_tokens"] = str(ctx.options.models.context_tokens)
    return inputs


def stage_outputs(name: str, ctx: RunContext) -> dict[str, str] | None:
    """Digests of a stage's outputs (None when one is missing)."""
    if name == "export":
        # an IR without its stored per-cell digests (an older lunasol's) is re-exported
        content = stored_ir_digest(ctx.ir_path) if ctx.ir_path.is_file() else None
        return {f"{IR_FILE}#content": content} if content is not None else None
    return output_digests(ctx.run_dir, _BY_NAME[name].outputs if name in _BY_NAME else ())


def fingerprint(inputs: dict[str, str], outputs: dict[str, str]) -> str:
    """What downstream stages depend on: the outputs' digests, or the inputs' for an output-less stage."""
    return digest(outputs) if outputs else digest(inputs)


# -- the run ---------------------------------------------------------------------------------------


def _archive(ctx: RunContext, name: str, entry_outputs: dict[str, str]) -> None:
    """Keep the outputs an invalidated stage is about to overwrite (invalidated work is kept)."""
    for rel, d in entry_outputs.items():
        src = ctx.run_dir / rel
        if "#" in rel or not src.is_file():
            continue
        dest = ctx.run_dir / SUPERSEDED_DIR / f"{d.split(':')[-1][:12]}-{Path(rel).name}"
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest)


def _record_ir_cells(ctx: RunContext, ledger: Ledger) -> None:
    """After export: one ledger entry per cell's IR digest; a changed cell invalidates its model results.

    One batch: the ledger is read and written once, whatever the number of cells.
    """
    now = ir_cell_digests(ctx.ir_path)
    with ledger.batch():
        _record_ir_changes(ledger, now)


def _record_ir_changes(ledger: Ledger, now: dict[str, str]) -> None:
    for name in ledger.names_for_stage("export"):
        cell = name.split("/", 1)[1] if name.startswith("ir/") else None
        if cell and cell not in now:
            ledger.invalidate(name, f"cell {cell} left the IR")
    for cell, d in sorted(now.items()):
        name = f"ir/{cell}"
        entry = ledger.get(name)
        if entry is not None and entry.outputs.get(f"{IR_FILE}#{cell}") != d:
            ledger.invalidate(name, f"cell {cell} IR changed")
            for role in {s.role.name for s in STAGES if s.role is not None}:
                ledger.invalidate(f"{role}/{cell}", f"cell {cell} IR changed")
        if entry is None or entry.state != "verified" or entry.outputs.get(f"{IR_FILE}#{cell}") != d:
            ledger.mark_verified(name, "export", {"cell": cell}, {f"{IR_FILE}#{cell}": d})


def _record_cells(ctx: RunContext, ledger: Ledger, role: str) -> None:
    """After a model stage: one ledger entry per persisted per-cell result (one ledger batch)."""
    store = CellResults(ctx.run_dir, role)
    with ledger.batch():
        _record_results(ctx, ledger, role, store)
    store.forget()


def _record_results(ctx: RunContext, ledger: Ledger, role: str, store: CellResults) -> None:
    for cell, record in store.records().items():  # files the stage just read or wrote are not read again
        inputs = {k: str(v) for k, v in record.inputs.items() if v is not None}
        inputs["key"] = record.key
        rel = f"{role}/{cell}.json"
        name = f"{role}/{cell}"
        entry = ledger.get(name)
        outs = {rel: record.file_digest}
        if entry is not None and entry.state == "verified" and entry.outputs != outs:
            # recomputed: keep the old result's record as invalidated, with why
            ledger.invalidate(name, f"{cell}: {describe_changes(entry.inputs, inputs)}; recomputed")
        if entry is None or entry.state != "verified" or entry.outputs != outs:
            ledger.mark_verified(name, role, inputs, outs)


def _downstream(ledger: Ledger, index: int) -> list[str]:
    """Every ledger entry after stage ``index`` (later stages, their per-cell entries, gates, proposals)."""
    earlier = {s.name for s in STAGES[: index + 1]}
    # per-cell entries are invalidated precisely, by their own cell digest (_invalidate_cells)
    return [n for n, e in ledger.entries(per_cell=False) if e.stage not in earlier and e.state != "invalidated"]


def _unblock_command(ctx: RunContext, exc: Blocked) -> str:
    resume = run_command(ctx.run_dir)
    hint = exc.unblock or ""
    if "lunasol run BUNDLE" in hint:
        # the model layer does not know the bundle or run; give the exact command for this run
        extra = hint.split("lunasol run BUNDLE", 1)[1].split("(")[0].split()
        base = resume.split()
        drop = {
            "--model",
            "--context-tokens",
            "--mode",
            "--max-tokens",
            "--timeout",
            "--concurrency",
            "--batch-queue-tokens",
        } & set(extra)  # flags with a value: the hint's value replaces the run's
        if {"--record", "--replay"} & set(extra):
            drop |= {"--record", "--replay"}  # one store mode only
        for flag in drop:
            if flag in base:
                i = base.index(flag)
                del base[i : i + 2]
        if "--resume" in extra:
            extra.remove("--resume")
        extra = [e for e in extra if not (e.startswith("--") and e in base and e not in drop)]  # e.g. --batch once
        return " ".join(base[:-1] + extra + ["--resume"])
    return hint or resume


def _set_phase(ctx: RunContext, phase: handoff.Phase, event: str) -> None:
    h = handoff.load(ctx.run_dir)
    if h.phase != phase:
        handoff.update(ctx.run_dir, {"phase": phase}, event)


def _after_sol(ctx: RunContext, ledger: Ledger) -> None:
    """Open gate 1 when the shortlist is new; keep a decision made on the very same shortlist."""
    path = RunDir(ctx.run_dir).shortlist
    if not path.is_file():
        return
    sdigest = read_shortlist(path).digest
    h = handoff.load(ctx.run_dir)
    changes: dict[str, Any] = {"phase": "rootCausesMined"}
    if h.shortlist_digest != sdigest or h.userRootCauseConfirmation == "not_started":
        changes.update(
            shortlist_digest=sdigest,
            userRootCauseConfirmation="pending",
            proposalGeneration="not_started",
            proposalSelection="not_started",
            proposals_digest=None,
        )
        if h.shortlist_digest and h.shortlist_digest != sdigest:
            ledger.invalidate("gate1", f"shortlist changed: {h.shortlist_digest[:19]} → {sdigest[:19]}")
    else:
        _restore_gate(ctx, ledger, sdigest)
    handoff.update(ctx.run_dir, changes, "root causes mined")


def _restore_gate(ctx: RunContext, ledger: Ledger, sdigest: str) -> None:
    """A recompute that gives the very same shortlist keeps the decision made on it (bound to its digest)."""
    entry = ledger.get("gate1")
    rel = handoff.load(ctx.run_dir).receipts.get("gate1")
    if entry is None or entry.state != "invalidated" or not rel or not (ctx.run_dir / rel).is_file():
        return
    if read_json(ctx.run_dir / rel).get("subject", {}).get("digest") == sdigest:
        ledger.mark_verified("gate1", "gate1", entry.inputs, entry.outputs)


def run(options: RunOptions, log: Callable[[str], None] = print) -> RunResult:
    """Run every stage in order, reusing what the ledger says is still valid; stop at gate 1."""
    if not options.bundle.is_dir():
        raise BadInput(f"bundle not found: {options.bundle}")
    run_id = options.run_id or default_run_id(options.bundle)
    if not run_id or "/" in run_id or run_id.startswith("."):
        raise BadInput(f"invalid run id: {run_id!r}")
    # `--replay DIR` alone names the recorded model, so replay artifacts equal the recording run's.

    options.models = resolve_settings(options.models)
    ctx = RunContext(options=options, run_dir=options.runs_dir / run_id, log=log)
    if not options.dry_run and not options.models.model and any(s.role is not None for s in STAGES):
        # Known before any work: failing at the first model stage would leave a half-made run and,
        # on a rerun, invalidate everything made with the model the run used.
        raise BadInput(_no_model_message(ctx))
    if not options.dry_run and any(s.role is not None for s in STAGES):
        preflight(options.models, log)  # a missing key or unknown model: one line, exit 2, before any work
    pilot.precheck(ctx.ir_path, options)  # a bad --where: one line before anything is written
    bdigest = bundle_digest(options.bundle)
    if options.dry_run:
        return dry_run(ctx)
    if options.resume:
        _check_resume(ctx, bdigest)
    _check_gates(ctx)
    # the manifest is read and checked once for the run (here, at export, when a reused export is verified)
    with remember_manifests():
        # The bundle's own files are checked before the run dir exists, so a bad one leaves nothing behind.
        read_manifest(options.bundle)
        load_request(options.bundle)
        created = not ctx.run_dir.exists()
        ctx.run_dir.mkdir(parents=True, exist_ok=True)
        with _exclusive_run(ctx.run_dir):
            return _run_stages(ctx, bdigest, created)


def _no_model_message(ctx: RunContext) -> str:
    """Why there is no model, and what this run used last time (if it exists)."""
    settings = ctx.options.models
    if settings.effective_mode() == "replay" and settings.store is not None:
        why = f"replay store {settings.store} holds no recording to name a model"
    else:
        why = "no model given"
    hint = "pass --model (e.g. openai/gpt-4o-mini), set LUNASOL_MODEL, or --replay DIR"
    inputs = read_run_info(ctx.run_dir).inputs
    last = inputs.models if inputs else None
    if last is not None and last.model:
        used = f"--model {last.model}"
        if last.mode in ("replay", "record") and last.store:
            used = f"--{last.mode} {last.store}"
        hint += f"; this run was made with {used}"
    return f"{why}: {hint}"


@contextmanager
def _exclusive_run(run_dir: Path) -> Iterator[None]:
    """One ``lunasol run`` per run directory at a time (a second one is refused, not queued)."""
    fd = os.open(RunDir(run_dir).run_lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BadInput(f"another lunasol run is working on {run_dir}; wait for it to finish") from None
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _run_stages(ctx: RunContext, bdigest: str, created: bool) -> RunResult:
    """The stage loop of :func:`run` (the caller holds the run lock)."""
    options, log = ctx.options, ctx.log
    write_run_json(ctx, bdigest)
    ledger = Ledger(ctx.run_dir)
    result = RunResult(ctx=ctx)
    upstream: tuple[str, str] | None = None
    left_pending: list[str] = []
    for i, target in enumerate(STAGES):
        name = target.name
        if name != "export":
            forget_manifests()  # read at the start and by export (run or reused) only
        inputs = stage_inputs(name, ctx, bdigest, upstream)
        ok, why = ledger.check(name, inputs, target.outputs)
        outputs: dict[str, str] | None = None
        if ok:
            outputs = stage_outputs(name, ctx)
            entry = ledger.get(name)
            if outputs is None or (entry is not None and outputs != entry.outputs):
                ok, why = False, "an output is missing or was modified outside lunasol"
        if ok and outputs is not None:
            if name == "export":
                _verify_bundle(options.bundle, ctx.run_dir)
            log(f"[{name}] reused (verified, inputs unchanged)")
            result.reused.append(name)
            upstream = (name, fingerprint(inputs, outputs))
            continue
        role = target.role.name if target.role is not None else None
        with ledger.batch():  # one ledger write for the whole hand-over to this stage
            _start_stage(ctx, ledger, i, name, inputs, why)
        ctx.incomplete.clear()
        ledger.release()  # no stage reads it while it runs: its entries (2 per cell) are not held under the stage
        give_back()  # ... and the heap they took goes back to the OS (123 MiB at 100,000 cells)
        try:
            summary = target.run(ctx)
        except Blocked as exc:
            if role:
                _record_cells(ctx, ledger, role)  # finished per-cell calls stay reusable for --resume
            raise _blocked(ctx, name, exc) from None
        except BadInput:
            if created and name in _FIRST_STAGES:
                shutil.rmtree(ctx.run_dir, ignore_errors=True)  # bad input leaves no partial run behind
            raise
        # What a stage built for itself is garbage now: hand it back so it does not sit under the next
        # stage (the whole run's peak is the largest stage's own, not the sum of what each left).
        gc.collect()
        give_back()
        outputs = stage_outputs(name, ctx)
        if outputs is None:
            raise BadInput(f"stage {name} finished but its output is missing: {target.outputs or None}")
        with ledger.batch():  # the stage's entry and its per-cell entries: one ledger write
            if ctx.incomplete:
                # The run goes on with what finished; the stage stays pending, so a rerun retries the rest.
                left_pending.append(f"{name}: {'; '.join(ctx.incomplete)}")
                ledger.mark_pending(name, name, inputs, reason=f"{INCOMPLETE}{'; '.join(ctx.incomplete)}")
            else:
                ledger.mark_verified(name, name, inputs, outputs)
            if name == "export":
                _record_ir_cells(ctx, ledger)
            if role:
                _record_cells(ctx, ledger, role)
        if name == "sol":
            _after_sol(ctx, ledger)
        elif target.phase is not None:
            _set_phase(ctx, target.phase, f"{name} done")
        result.ran.append(name)
        upstream = (name, fingerprint(inputs, outputs))
        log(f"[{name}] {summary}")

    resolve_block_receipt(ctx.run_dir)
    if any(s.name == "sol" for s in STAGES):
        _after_sol(ctx, ledger)
    for line in left_pending:
        log(f"NOT verified: {line}; retry exactly those with: {run_command(ctx.run_dir)}")
    result.pending = left_pending
    return result


def _start_stage(ctx: RunContext, ledger: Ledger, index: int, name: str, inputs: dict[str, str], why: str) -> None:
    """Invalidate what this stage's rerun replaces (kept, with why) and mark it pending."""
    entry = ledger.get(name)
    if entry is not None and entry.state == "pending" and (entry.reason or "").startswith(INCOMPLETE):
        why = entry.reason or INCOMPLETE
    elif entry is not None and entry.state == "pending":
        why = "did not finish last time (interrupted or blocked)"
    elif entry is not None and entry.state == "invalidated":
        why = entry.reason or "invalidated"
    if entry is not None and entry.state == "verified":
        ledger.invalidate(name, why)
    if entry is not None:
        _archive(ctx, name, entry.outputs)
        gone = ledger.invalidate_many(_downstream(ledger, index), f"upstream {name} recomputed: {why}")
        if gone:
            ctx.log(f"[{name}] {why}; invalidated downstream: {', '.join(sorted(gone))}")
    phase = _BY_NAME[name].phase
    if phase and handoff.phase_reached(handoff.load(ctx.run_dir), phase):
        # the run is back before this stage until it is recomputed
        _set_phase(ctx, handoff.PHASES[handoff.PHASES.index(phase) - 1], f"{name} recomputed: {why}")
    ledger.mark_pending(name, name, inputs, reason=f"running: {why}")


def _blocked(ctx: RunContext, stage: str, exc: Blocked) -> Blocked:
    """Write the block receipt and return the one-line error the CLI prints (exit 3)."""
    unblock = _unblock_command(ctx, exc)
    if not exc.tried:  # the attempt itself, with its real outcome
        mode = ctx.options.models.effective_mode()
        exc.tried = [
            {"ladder_step": "attempt", "action": f"ran stage {stage} ({mode} mode)", "outcome": exc.one_line()}
        ]
    path = write_block_receipt(ctx.run_dir, exc, stage=stage, unblock=unblock, command=run_command(ctx.run_dir))
    return Blocked(
        f"blocked at {stage}: {exc.one_line()} | receipt: {path} | unblock: {unblock}",
        reason=exc.reason,
        tried=exc.tried,
        unblock=unblock,
    )


def _verify_bundle(bundle: Path, run_dir: Path) -> None:
    """A reused export still needs the frozen bytes to be the frozen bytes (files unchanged since hashed: by stat)."""
    manifest = read_manifest(bundle)
    report = verify(bundle, manifest, verified.load(run_dir, bundle, manifest))
    bad = [*report.changed, *report.missing]
    if bad:
        raise BundleError(
            f"bundle changed since it was frozen: {', '.join(bad[:5])}{' ...' if len(bad) > 5 else ''} "
            f"(re-freeze with: lunasol bundle freeze {bundle})"
        )
    verified.save(run_dir, bundle, manifest, report)


def _check_gates(ctx: RunContext) -> None:
    """Refuse a run into a run id whose gates hold decisions, unless told to supersede them.

    A rerun may change the shortlist and so void what people decided on it; that is theirs to
    choose (``--supersede``), not a side effect of reusing a run id.
    """
    if ctx.options.supersede or not (ctx.run_dir / handoff.HANDOFF_FILE).is_file():
        return
    h = handoff.load(ctx.run_dir)
    held = [(g, r) for g in (GATE1, GATE2) if (r := gates.standing(ctx.run_dir, g, h)) is not None]
    if held:
        said = "; ".join(f"{g.replace('gate', 'gate ')}: {gates.summary(r)}" for g, r in held)
        raise BadInput(
            f"run {ctx.run_dir.name} holds gate decisions ({said}); a rerun into it may void them: add "
            "--supersede to rerun anyway (a decision stays only if the rerun gives the very shortlist it was "
            "made on), or use another --run-id"
        )


def _check_resume(ctx: RunContext, bdigest: str) -> None:
    if not RunDir(ctx.run_dir).run_json.is_file():
        ctx.log(f"[run] nothing to resume in {ctx.run_dir}: starting the run")
        return
    inputs = read_run_info(ctx.run_dir).inputs
    old = inputs.bundle_digest if inputs else None
    if old and old != bdigest:
        change = describe_changes({"bundle": old}, {"bundle": bdigest})
        raise BadInput(
            f"--resume continues the same inputs, but the bundle changed ({change}); "
            "rerun without --resume to recompute what changed"
        )


# -- dry run ---------------------------------------------------------------------------------------


def _dry_progress() -> Callable[[str], None]:
    # What a long dry run is doing, on stderr (stdout holds the estimate); LUNASOL_PROGRESS_EVERY=0: quiet.
    if plain_every() <= 0:
        return lambda _m: None
    return lambda m: print(f"dry run: {m}", file=sys.stderr, flush=True)


def _noted(name: str, plan: Callable[[], Iterable[PlannedCall]], notes: list[str]) -> Iterator[PlannedCall]:
    """``plan()``'s calls, made when the first is asked for; a note when it had none."""
    made = 0
    for call in plan():
        made += 1
        yield call
    if not made:
        notes.append(f"{name}: nothing to plan yet")


def dry_run(ctx: RunContext) -> RunResult:
    """Estimate calls, tokens and cost; no model is called and the runs directory is not touched.

    Deterministic stages run in a temporary directory, role modules' ``plan(ctx)`` list their
    calls, and :func:`pipeline.models.estimate` prices them.
    """
    planned: list[Iterable[PlannedCall]] = []
    notes: list[str] = []
    say = _dry_progress()
    with tempfile.TemporaryDirectory(prefix="lunasol-dry-") as tmp:
        tctx = RunContext(options=ctx.options, run_dir=Path(tmp) / ctx.run_dir.name, log=lambda _m: None)
        tctx.run_dir.mkdir(parents=True)
        model_stage_seen = False
        for target in STAGES:
            name = target.name
            if target.plan is not None:
                model_stage_seen = True
                say(f"planning {name}")
                # counted as they come, never all held at once (Luna's per cell part, Sol's per partition);
                # each role's plan starts when the one before it is counted (one reader of the IR at a time)
                planned.append(_noted(name, functools.partial(target.plan, tctx), notes))
            elif not model_stage_seen:
                say(f"{name} (deterministic, in a temporary directory)")
                target.run(tctx)  # deterministic stage: needed to render real prompts
            elif name == "coordinator":
                # Luna has not run: group the probe hits as stand-ins, so Sol is sized with realistic groups
                hits = estimate_groups(tctx.ir_path, tctx.run_dir)
                notes.append(
                    f"coordinator: {hits} probe hit(s) grouped as stand-ins for Luna's patterns (Luna has not run); "
                    "Sol's request sizes are an estimate"
                )
            else:
                notes.append(f"{name}: deterministic, runs after the model stages (no model call)")
        say("rendering and counting every request (Luna's and Sol's are made as they are counted)")
        est = estimate(itertools.chain.from_iterable(planned), ctx.options.models, progress=say)
        chosen = run_pilot(tctx.run_dir)
        if chosen is not None:  # the estimate is the pilot's: said first
            notes.insert(0, f"{chosen.label()}{f'; {chosen.note}' if chosen.note else ''}")
    ctx.log(format_estimate(est))
    for n in notes:
        ctx.log(f"note: {n}")
    return RunResult(ctx=ctx, estimate=est)
