"""``lunasol mcp`` and ``lunasol handoff``: hand the selected card to the coding agent that implements it."""

from __future__ import annotations

from pathlib import Path

import typer

from pipeline.cli.common import resolve_run


def register(app: typer.Typer) -> None:
    """Add ``mcp`` and ``handoff`` to the root app."""

    @app.command("mcp")
    def mcp_cmd(
        runs: list[str] = typer.Argument(
            ..., metavar="RUN [RUN ...]", help="Run directories (or run ids under ./runs); the first is the default."
        ),
    ) -> None:
        """A read-only MCP server over the runs, on stdio (no network listener), for a coding agent.

        Tools: run_state, get_proposal, get_weakness, get_pattern_group, weakness_cells, show_ref,
        query (read-only SQL), get_followup; resources: each run's summary and cards. Every answer is
        bounded, secrets redacted, log text marked as untrusted data. Client configs: docs/handoff.md.
        """
        # startup: the mcp SDK and the run readers load only for this verb
        from pipeline.agent.server import serve
        from pipeline.agent.tools import Runs

        served = Runs([resolve_run(r) for r in runs])  # bad runs: one line and exit 2, before serving
        # stderr: stdout carries the protocol alone; a person who starts it in a terminal learns what it is
        typer.echo(
            f"lunasol mcp: serving {', '.join(served.ids)} read-only on stdio (close stdin or Ctrl-C to stop)", err=True
        )
        serve(served)

    @app.command("handoff")
    def handoff_cmd(
        run: str = typer.Argument(..., metavar="RUN", help="Run directory (or run id under ./runs)."),
        proposal: str | None = typer.Option(
            None, "--proposal", help="The card to brief (default: the one selected at gate 2)."
        ),
        out: Path | None = typer.Option(None, "-o", "--output", help="Markdown file (default RUN/handoff-P-...md)."),
    ) -> None:
        """Write the brief for the coding agent that implements the selected card.

        The card, its evidence with a few resolved raw excerpts, the rejection conditions it will be
        judged on, the single-lever rule, the follow-up command, and how to reach the MCP server.
        A selection is not an authorisation to change anything outside the card's lever.
        """
        # startup: the run readers load only for this verb
        from pipeline.agent import write_handoff

        path, pid = write_handoff(resolve_run(run), proposal, out)
        typer.echo(f"wrote {path} (brief for {pid})")
