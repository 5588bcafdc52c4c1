"""Each benchmark gets the environment it started with back: one that points ``LUNASOL_PROMPTS_DIR``
at a temporary template folder (bench_models, bench_batch) must not leave it to the next, which then
finds no ``luna.j2`` (``make bench`` runs them all in one process)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _restored_environment() -> Iterator[None]:
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)
