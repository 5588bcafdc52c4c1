"""`lunasol config` and config files: flags > env > lunasol.toml > pyproject [tool.lunasol] > defaults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.cli.app import app
from pipeline.core.errors import BadInput
from pipeline.core.settings import ModelSettings

runner = CliRunner()


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    for var in ("LUNASOL_MODEL", "LUNASOL_CONCURRENCY", "LUNASOL_BUDGET_USD", "LUNASOL_API_BASE"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


def test_config_shows_a_model_set_in_lunasol_toml(here: Path) -> None:
    (here / "lunasol.toml").write_text('model = "openai/gpt-4o-mini"\nconcurrency = 4\n')
    res = runner.invoke(app, ["config"])
    assert res.exit_code == 0, res.output
    row = next(line for line in res.stdout.splitlines() if line.startswith("model "))
    assert "openai/gpt-4o-mini" in row and row.rstrip().endswith("lunasol.toml")
    data = json.loads(runner.invoke(app, ["config", "--json"]).stdout)
    assert data["settings"]["model"] == {"value": "openai/gpt-4o-mini", "source": "lunasol.toml"}
    assert data["settings"]["timeout_s"]["source"] == "default"
    assert ModelSettings.from_env().model == "openai/gpt-4o-mini"  # what `lunasol run` uses


def test_precedence(here: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (here / "pyproject.toml").write_text("[tool.lunasol]\nbudget_usd = 1.5\nconcurrency = 2\nmodel = 'openai/a'\n")
    (here / "lunasol.toml").write_text("concurrency = 4\nmodel = 'openai/b'\n")
    monkeypatch.setenv("LUNASOL_MODEL", "openai/c")
    settings, source = ModelSettings.resolve(concurrency=9)
    assert (settings.budget_usd, source["budget_usd"]) == (1.5, "pyproject.toml [tool.lunasol]")
    assert (settings.model, source["model"]) == ("openai/c", "LUNASOL_MODEL")
    assert (settings.concurrency, source["concurrency"]) == (9, "--concurrency")
    monkeypatch.delenv("LUNASOL_MODEL")
    assert ModelSettings.resolve()[0].model == "openai/b"  # lunasol.toml over pyproject.toml


@pytest.mark.parametrize(
    ("text", "phrase"),
    [
        ("modle = 'x'\n", "unknown setting modle"),
        ("concurrency = 0\n", "concurrency in lunasol.toml"),
        ("model = [\n", "not valid TOML"),
        ("mode = 'replay'\n", "unknown setting mode"),
    ],
)
def test_bad_config_file_is_one_line_exit_2(here: Path, text: str, phrase: str) -> None:
    (here / "lunasol.toml").write_text(text)
    with pytest.raises(BadInput, match=phrase):
        ModelSettings.from_env()
    res = runner.invoke(app, ["config"])
    assert res.exit_code == 2 and phrase in res.stderr and "Traceback" not in res.output


def test_config_shows_an_api_base_without_its_credentials(here: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LUNASOL_API_BASE", "https://me:pw-81@proxy.example/v1?api-key=k-81")
    for args in (["config"], ["config", "--json"]):
        res = runner.invoke(app, args)
        assert res.exit_code == 0, res.output
        assert "pw-81" not in res.stdout and "k-81" not in res.stdout
        assert "https://me:[REDACTED:url-password]@proxy.example/v1?api-key=[REDACTED:secret-value]" in res.stdout
    assert ModelSettings.from_env().api_base == "https://me:pw-81@proxy.example/v1?api-key=k-81"  # what a run uses
