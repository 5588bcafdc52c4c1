"""Test and replay helpers shipped with lunasol (a local OpenAI-compatible server)."""
