"""A replay and a propose from the store never import litellm, instructor or openai.

The demo is replayed through the CLI in a subprocess where those packages cannot be imported (a
meta-path finder refuses them, so any import fails loudly), then confirmed and proposed from its
store; the artifacts must be byte-identical to a normal replay's, and the process must end with
none of them in ``sys.modules``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.cli.app import app
from pipeline.diff import diff_run_dirs
from tests.conftest import DEMO_BUNDLE, DEMO_RECORDINGS

BLOCKED = ("litellm", "instructor", "openai")
ARTIFACTS = ("patterns.jsonl", "pattern-groups.json", "weakness-shortlist.json", "handoff.json", "ledger.json")

SCRIPT = """
import json, sys
BLOCKED = {blocked!r}

class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"blocked by the test: {{name}}")
        return None

sys.meta_path.insert(0, Block())
from pipeline.cli.app import main
for argv in {commands!r}:
    sys.argv = ["lunasol", *argv]
    try:
        main()
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)))
"""


def _lunasol(tmp: Path, *commands: list[str]) -> list[str]:
    """Run CLI commands in one process with litellm, instructor and openai unimportable."""
    code = SCRIPT.format(blocked=BLOCKED, commands=[list(c) for c in commands])
    env = {**os.environ, "LUNASOL_DEBUG": "1"}  # a blocked import shows its traceback, not one line
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    loaded: list[str] = json.loads(out.stdout.strip().splitlines()[-1])
    return loaded


def _confirm_and_propose(run_dir: Path) -> list[list[str]]:
    from pipeline.state import handoff as hf

    digest = hf.load(run_dir).shortlist_digest
    decide = ["--decision", "W-01=confirm", "--decision", "W-02=confirm", "--by", "demo-fixture"]
    return [["confirm", str(run_dir), *decide, "--digest", digest], ["propose", str(run_dir)]]


def test_demo_replay_and_propose_need_no_litellm(demo_gate1: Path, tmp_path: Path) -> None:
    if not any(DEMO_RECORDINGS.glob("*/*.json")):
        pytest.skip("demo recordings absent")
    runs = tmp_path / "runs"
    loaded = _lunasol(tmp_path, ["run", str(DEMO_BUNDLE), "--replay", str(DEMO_RECORDINGS), "--runs-dir", str(runs)])
    assert loaded == []
    run_dir = runs / demo_gate1.name
    for name in ARTIFACTS:
        assert (run_dir / name).read_bytes() == (demo_gate1 / name).read_bytes(), name
    for cell in sorted((demo_gate1 / "luna").glob("*.json")):
        assert (run_dir / "luna" / cell.name).read_bytes() == cell.read_bytes(), cell.name

    assert diff_run_dirs(demo_gate1, run_dir).identical

    # propose from the store: without litellm, then the same with it, in a copy of the same run
    normal = tmp_path / "normal" / "runs" / run_dir.name
    shutil.copytree(run_dir, normal)
    assert _lunasol(tmp_path, *_confirm_and_propose(run_dir)) == []
    for argv in _confirm_and_propose(normal):
        result = CliRunner().invoke(app, argv)
        assert result.exit_code == 0, result.output
    for name in ("proposals.yaml", "validation.json"):
        assert (run_dir / name).read_bytes() == (normal / name).read_bytes(), name


def test_the_blocker_catches_an_import(tmp_path: Path) -> None:
    """The harness is honest: a command that needs litellm fails under it (the dry run counts with litellm)."""
    code = SCRIPT.format(blocked=BLOCKED, commands=[["run", str(DEMO_BUNDLE), "--dry-run", "--model", "openai/gpt-4o"]])
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert "blocked by the test: litellm" in out.stderr
