"""pytest fixtures for model calls through a real local server (filled in by the model layer)."""
