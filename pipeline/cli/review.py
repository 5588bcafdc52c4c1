"""CLI verbs (placeholder until the owning stage lands)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this module's verbs to the root app."""
