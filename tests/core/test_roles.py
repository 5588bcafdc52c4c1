"""Model roles and stages are specs: one entry each, from which every former hand-kept table is read."""

from __future__ import annotations

import importlib

from pydantic import BaseModel

from pipeline.core import roles
from pipeline.core.settings import ModelSettings
from pipeline.models.batch_submit import BATCHED_ROLES
from pipeline.models.budget import ANSWER_TOKENS
from pipeline.models.prompts import ROLES, prompts_dir


def test_every_role_names_a_real_answer_model_and_template() -> None:
    for spec in (*roles.ROLE_SPECS, *roles.VERB_ROLE_SPECS):
        module, _, cls = spec.answer.partition(":")
        model = getattr(importlib.import_module(module), cls)
        assert isinstance(model, type) and issubclass(model, BaseModel), spec
        assert (prompts_dir() / f"{spec.template}.j2").is_file(), spec


def test_the_derived_tables_say_what_the_specs_say() -> None:
    assert ROLES == ("luna", "sol", "sol_map", "sol_reduce", "proposer", "judge")
    assert {"luna", "ask"} == BATCHED_ROLES
    assert ANSWER_TOKENS == {"luna": 4000, "sol": 8000, "sol_map": 6000, "sol_reduce": 8000, "proposer": 6000,
                             "judge": 4000, "ask": 4000}  # fmt: skip
    s = ModelSettings()
    assert {r: s.max_tokens_for(r) for r in ROLES} == {
        "luna": 4096, "sol": 8192, "sol_map": 2048, "sol_reduce": 2048, "proposer": 4096, "judge": 4096,
    }  # fmt: skip
    assert s.max_tokens_for("ask") == roles.DEFAULT_MAX_TOKENS  # what the demo's ask recordings were made with
    assert s.max_tokens_for("a-role-being-added") == roles.DEFAULT_MAX_TOKENS
    assert ModelSettings(max_tokens=100).max_tokens_for("luna") == 100


def test_the_stages_are_one_spec_each() -> None:
    from pipeline.run.runner import STAGES

    assert [s.name for s in STAGES] == ["export", "select", "probes", "luna", "coordinator", "sol"]
    assert {s.name: s.role.name for s in STAGES if s.role} == {"luna": "luna", "sol": "sol"}
    assert {s.name: s.phase for s in STAGES if s.phase} == {
        "export": "exported", "luna": "patterns", "coordinator": "aggregated", "sol": "rootCausesMined",
    }  # fmt: skip
    assert all(s.plan is not None for s in STAGES if s.role is not None)
