"""Small helpers shared by the verbs: output, run-directory resolution."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer

from pipeline.artifacts.rundir import RunDir
from pipeline.core.canonical import pretty_json
from pipeline.core.errors import BadInput, Blocked, LunasolError

DEFAULT_RUNS_DIR = Path("runs")

JSON_OPTION = typer.Option(False, "--json", help="Print machine-readable JSON instead of text.")

# Model options shared by the verbs that call a model (run, propose): one wording, one default.
TIMEOUT_OPTION = typer.Option(None, "--timeout", help="Seconds per HTTP request (default 120; env LUNASOL_TIMEOUT_S).")
MAX_TOKENS_OPTION = typer.Option(
    None, "--max-tokens", help="Answer bound for every role (0: send none; env LUNASOL_MAX_TOKENS)."
)
MODE_OPTION = typer.Option(
    None, "--mode", help="tools | json_schema | json | md_json (default: from the provider's capabilities)."
)
CONTEXT_TOKENS_OPTION = typer.Option(
    None,
    "--context-tokens",
    help="The model's input limit in tokens (env LUNASOL_CONTEXT_TOKENS; default: litellm's model info).",
)

# Export's redaction switch (run, export): off only when asked by name, and then said loudly.
NO_REDACT_OPTION = typer.Option(
    False,
    "--no-redact",
    help="Keep secrets in the IR's text as written (default: [REDACTED:<kind>]); recorded in run.json.",
)
NO_REDACT_WARNING = (
    "lunasol: WARNING: --no-redact: secret redaction is OFF. Keys, tokens and passwords in the logs go into "
    "the IR as written, hence into the prompts (the model provider and any recording see them) and the "
    "report's timelines; run.json records it (export.redacted: false)."
)


def warn_no_redact() -> None:
    """Say on stderr, before any work, that this run's IR is made without secret redaction."""
    typer.echo(NO_REDACT_WARNING, err=True)


def emit_json(obj: Any) -> None:
    """Print canonical, indented JSON to stdout."""
    sys.stdout.write(pretty_json(obj))


def resolve_run(run: str) -> Path:
    """A RUN argument: a run directory, or a run id under ./runs."""
    path = Path(run)
    if not path.is_dir() and (DEFAULT_RUNS_DIR / run).is_dir():
        path = DEFAULT_RUNS_DIR / run
    if not RunDir(path).is_run():
        raise BadInput(f"not a lunasol run directory: {run} (expected run.json inside)")
    return path


_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def check_digest(value: str | None) -> str | None:
    """A ``--digest`` flag: ``sha256:<64 hex>`` or absent (a malformed one is bad input, not a stale one)."""
    if value is not None and not _DIGEST.fullmatch(value):
        raise BadInput(f"--digest must look like sha256:<64 hex digits> (as status prints it), got {value!r}")
    return value


@contextmanager
def moves_run(run_dir: Path, verb: str) -> Iterator[None]:
    """Around a verb that moves a run on (confirm, propose, select).

    Exit 3 promises a block receipt: a Blocked the library raised without writing one gets one here,
    and its one line names the receipt and the unblocking command. Success means the run went past
    any earlier block, so a receipt left from it is moved to ``block-receipts/`` (kept, resolved).
    """
    from pipeline.state.blocking import (
        read_block_receipt,  # startup: `lunasol --help` and every other verb load none of this
        resolve_block_receipt,
        write_block_receipt,
    )

    before = read_block_receipt(run_dir)
    try:
        yield
    except Blocked as exc:
        if read_block_receipt(run_dir) == before:  # the library wrote none for this block
            # The run's state knows the step that unblocks better than the verb that was refused
            # (select on a run still at export needs `lunasol run`, not `lunasol propose`).
            exc.unblock = _state_next(run_dir) or exc.unblock
            path = write_block_receipt(
                run_dir, exc, stage=verb, unblock=exc.unblock, command=f"lunasol {verb} {run_dir}"
            )
            line = exc.one_line()
            if exc.unblock and exc.unblock not in line:
                line += f" | unblock: {exc.unblock}"
            raise Blocked(
                f"{line} | receipt: {path}", reason=exc.reason, tried=exc.tried, unblock=exc.unblock
            ) from None
        raise
    resolve_block_receipt(run_dir)


def _state_next(run_dir: Path) -> str | None:
    """The next command by the run's state: a rerun when verified outputs are gone, else the handoff's."""
    # startup: `lunasol --help` and every other verb load none of this
    from pipeline.artifacts.run_info import run_command
    from pipeline.run.status import missing_outputs
    from pipeline.state import handoff

    try:
        if missing_outputs(run_dir):
            return run_command(run_dir, resume=False)
        return handoff.next_command(run_dir)
    except LunasolError:  # an unreadable handoff or ledger: keep the library's own suggestion
        return None


def check_dir_option(path: Path | None, flag: str) -> None:
    """A directory flag (``--runs-dir``, ``--parquet``): absent or a directory, never a file."""
    if path is not None and path.exists() and not path.is_dir():
        raise BadInput(f"{flag} {path} is a file; it must be a directory (new or existing)")
