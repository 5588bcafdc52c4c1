from __future__ import annotations

import typer
from typer.testing import CliRunner

from pipeline.cli.app import app


def test_help_lists_verbs() -> None:
    """Every top-level verb is a row of the help's command table (a missing one fails)."""
    verbs = sorted(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
    assert {"run", "status", "confirm", "propose", "select", "report", "bundle"} <= set(verbs)
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    listed = {line.split()[1] for line in result.output.splitlines() if line.startswith("│ ") and len(line.split()) > 1}
    assert set(verbs) <= listed, f"verbs missing from --help: {sorted(set(verbs) - listed)}"


def test_bad_bundle_is_one_line_exit_2(tmp_path) -> None:
    result = CliRunner().invoke(app, ["run", str(tmp_path / "nope"), "--runs-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "bundle not found" in result.output
