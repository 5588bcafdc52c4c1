"""Prompt rendering: pure, strict, hashed (pipeline.models.prompts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.core.canonical import sha256_bytes
from pipeline.models import PromptError, render, template_hash, template_hashes
from pipeline.models.prompts import prompts_dir, render_source

TEMPLATE = """{# comment outside blocks is ignored #}
{% block system %}You describe cell {{ cell_id }} only.{% endblock %}
{% block user %}
Events:
{% for e in events %}
- {{ e.id }}: {{ e.text }}
{% endfor %}
{% endblock %}
"""


@pytest.fixture
def pdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "prompts"
    d.mkdir()
    (d / "luna.j2").write_text(TEMPLATE, encoding="utf-8")
    monkeypatch.setenv("LUNASOL_PROMPTS_DIR", str(d))
    return d


def test_render_system_and_user_messages(pdir: Path) -> None:
    ctx = {"cell_id": "C004", "events": [{"id": "C004-e1", "text": "ran tests"}, {"id": "C004-e2", "text": "ok"}]}
    out = render("luna", ctx)
    assert [m["role"] for m in out.messages] == ["system", "user"]
    assert out.messages[0]["content"] == "You describe cell C004 only."
    assert out.messages[1]["content"] == "Events:\n- C004-e1: ran tests\n- C004-e2: ok"
    assert out.template_name == "luna.j2"
    assert out.template_hash == sha256_bytes((pdir / "luna.j2").read_bytes())


def test_render_is_pure_and_deterministic(pdir: Path) -> None:
    ctx = {"cell_id": "C1", "events": []}
    assert render("luna", ctx) == render("luna", ctx)
    assert ctx == {"cell_id": "C1", "events": []}  # context not mutated


def test_missing_variable_is_a_clear_error(pdir: Path) -> None:
    with pytest.raises(PromptError, match=r"luna\.j2.*'cell_id' is undefined"):
        render("luna", {"events": []})


def test_missing_attribute_is_a_clear_error(pdir: Path) -> None:
    with pytest.raises(PromptError, match="text"):
        render("luna", {"cell_id": "C1", "events": [{"id": "x"}]})


def test_log_text_with_jinja_syntax_is_not_rerendered(pdir: Path) -> None:
    raw = "{{ secret }} {% if x %} {# not a comment #}"
    out = render("luna", {"cell_id": "C1", "events": [{"id": "e", "text": raw}]})
    assert raw in out.messages[1]["content"]


def test_user_block_required_and_system_optional() -> None:
    with pytest.raises(PromptError, match=r"no \{% block user %\}"):
        render_source("{% block system %}s{% endblock %}", {}, name="x.j2")
    only_user = render_source("{% block user %}hi {{ n }}{% endblock %}", {"n": 1})
    assert only_user.messages == [{"role": "user", "content": "hi 1"}]


def test_syntax_error_names_template_and_line() -> None:
    with pytest.raises(PromptError, match=r"bad\.j2 line 2"):
        render_source("{% block user %}\n{% if %}{% endblock %}", {}, name="bad.j2")


def test_missing_template_and_bad_role(pdir: Path) -> None:
    with pytest.raises(PromptError, match="not found"):
        render("sol", {})
    with pytest.raises(PromptError, match="invalid role"):
        render("../etc/passwd", {})


def test_hash_changes_with_template_bytes(pdir: Path) -> None:
    before = template_hash("luna")
    (pdir / "luna.j2").write_text(TEMPLATE + "\n", encoding="utf-8")
    after = template_hash("luna")
    assert before != after and after.startswith("sha256:")
    # the compiled template is keyed on source: an edit is picked up immediately
    assert render("luna", {"cell_id": "C", "events": []}).template_hash == after


def test_template_hashes_lists_existing_roles(pdir: Path) -> None:
    hashes = template_hashes()
    assert list(hashes) == ["luna"]
    assert hashes["luna"] == template_hash("luna")


def test_default_dir_is_repo_prompts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LUNASOL_PROMPTS_DIR", raising=False)
    assert prompts_dir() == Path(__file__).resolve().parents[2] / "prompts"
