"""``lunasol run``: the main job."""

from __future__ import annotations

from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import typer

from pipeline.cli.common import (
    CONTEXT_TOKENS_OPTION,
    JSON_OPTION,
    MAX_TOKENS_OPTION,
    MODE_OPTION,
    NO_REDACT_OPTION,
    TIMEOUT_OPTION,
    check_dir_option,
    emit_json,
    warn_no_redact,
)
from pipeline.core.context import RunOptions
from pipeline.core.errors import BadInput
from pipeline.core.settings import ModelSettings


def register(app: typer.Typer) -> None:
    """Add ``run`` to the root app."""

    @app.command("run")
    def run_cmd(
        bundle: Path = typer.Argument(..., help="Frozen bundle directory."),
        run_id: str | None = typer.Option(None, "--run-id", help="Run id (default: the bundle's analysis run id)."),
        runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="Where run directories live."),
        model: str | None = typer.Option(None, "--model", help="litellm model string (env LUNASOL_MODEL)."),
        api_base: str | None = typer.Option(
            None,
            "--api-base",
            help="OpenAI-compatible base URL; a comma list (URL#N: N calls in flight there) spreads calls over a fleet "
            "with litellm's Router (docs/models.md). Credentials in it (user:pw@, ?api-key=) are kept out of run.json, "
            "receipts and error lines; a later propose or resume then takes the URL from LUNASOL_API_BASE.",
        ),
        replay: Path | None = typer.Option(None, "--replay", help="Serve model answers only from this store."),
        record: Path | None = typer.Option(None, "--record", help="Call live and store every exchange here."),
        resume: bool = typer.Option(False, "--resume", help="Continue without repeating finished calls."),
        concurrency: int | None = typer.Option(None, "--concurrency", help="Concurrent model calls (default 8)."),
        budget_usd: float | None = typer.Option(None, "--budget-usd", help="Stop cleanly past this spend."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Estimate calls, tokens and cost; call nothing."),
        batch: bool = typer.Option(
            False, "--batch", help="Luna's calls as one provider batch (about half price, hours); env LUNASOL_BATCH."
        ),
        batch_queue_tokens: int | None = typer.Option(
            None,
            "--batch-queue-tokens",
            help="With --batch: the most prompt tokens enqueued at once (your tier's batch queue limit; "
            "default: learned when the provider refuses a batch as full); env LUNASOL_BATCH_QUEUE_TOKENS.",
        ),
        timeout: float | None = TIMEOUT_OPTION,
        max_tokens: int | None = MAX_TOKENS_OPTION,
        instructor_mode: str | None = MODE_OPTION,
        context_tokens: int | None = CONTEXT_TOKENS_OPTION,
        probes_dir: Path | None = typer.Option(
            None,
            "--probes",
            help="A folder of your own probe files (<id>.sql, docs/patterns.md), run beside the shipped.",
        ),
        where: str | None = typer.Option(
            None,
            "--where",
            help="A pilot on the eligible cells this SQL condition matches, over cell_id, task_id, run_id, harness "
            "and outcome (the sidecar's label; you choose the cells, no model reads it). The IR stays whole; only "
            "these cells go through Luna, the Coordinator and Sol, and every rate and Sol's support are over them.",
        ),
        sample: int | None = typer.Option(
            None, "--sample", min=1, help="A pilot on a seeded draw of N of the (matching) cells; all when fewer."
        ),
        seed: int | None = typer.Option(
            None, "--seed", help="Seed of the --sample draw (same seed, same cells; default 0)."
        ),
        no_redact: bool = NO_REDACT_OPTION,
        supersede: bool = typer.Option(
            False,
            "--supersede",
            help="Rerun into a run id whose gates hold decisions (refused without it): a decision stays only "
            "if the rerun gives the very shortlist (and proposals) it was made on.",
        ),
        as_json: bool = JSON_OPTION,
    ) -> None:
        """Export the IR, find patterns, mine root causes, and stop at gate 1.

        Rerunning with the same run id reuses everything still valid (an unchanged rerun makes no
        model call); a changed input invalidates and recomputes only what depends on it. A run id
        whose gates hold decisions is refused (exit 2) unless --supersede.

        A pilot (--where / --sample) is labelled as one in run.json, status, show, the report, the
        shortlist and gate 1's receipt. A later run of the same bundle, under any run id of the same
        --runs-dir, takes every answer another of its runs already received for the very same request
        (a pilot's Luna calls, say) instead of paying for it again; use another --runs-dir for fresh answers.
        """
        # startup: `lunasol --help` and every other verb load none of this
        from pipeline.models.store import check_store
        from pipeline.probes import user_probes
        from pipeline.run.runner import run
        from pipeline.run.status import gate_report, status

        if replay and record:
            raise BadInput("--replay and --record exclude each other")
        if seed is not None and sample is None:
            raise BadInput("--seed draws a --sample: give --sample N with it")
        check_dir_option(runs_dir, "--runs-dir")
        mode = "replay" if replay else "record" if record else None
        settings = ModelSettings.from_env(
            model=model,
            api_base=api_base,
            mode=mode,
            store=replay or record,
            concurrency=concurrency,
            budget_usd=budget_usd,
            batch=batch or None,  # None: LUNASOL_BATCH decides
            batch_queue_tokens=batch_queue_tokens,
            timeout_s=timeout,
            max_tokens=max_tokens,
            instructor_mode=instructor_mode,
            context_tokens=context_tokens,
        )
        check_store(settings)
        user_probes(probes_dir)  # a bad probe file is one line before anything is written
        if no_redact:
            warn_no_redact()
        opts = RunOptions(
            bundle=bundle,
            run_id=run_id,
            runs_dir=runs_dir,
            resume=resume,
            dry_run=dry_run,
            models=settings,
            probes_dir=probes_dir,
            redact=not no_redact,
            supersede=supersede,
            where=where,
            sample=sample,
            seed=seed or 0,
        )
        # With --json the stage lines go to stderr, so stdout is one JSON document.
        result = run(opts, log=(lambda m: typer.echo(m, err=True)) if as_json else typer.echo)
        if as_json:
            out: dict[str, Any] = {"run_dir": str(result.ctx.run_dir), "ran": result.ran, "reused": result.reused}
            if dry_run:
                est = result.estimate
                out["estimate"] = asdict(est) if is_dataclass(est) and not isinstance(est, type) else None
            else:
                out["status"] = status(result.ctx.run_dir)
            emit_json(out)
            return
        if not dry_run:
            typer.echo(gate_report(result.ctx.run_dir))
