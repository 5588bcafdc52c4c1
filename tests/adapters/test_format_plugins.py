"""Formats are plugins: a third-party package installed next to lunasol adds a format, no change to lunasol.

The package is built here as a wheel (a zip with its metadata: what any build backend makes) and
installed with ``pip install --no-deps --no-index --target`` (offline); lunasol then runs in a
subprocess whose path holds that target, the way a user's environment would.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_PLUGIN = '''
"""acme-log: one JSON object per line, {"acme": 1, "who": ..., "say": ...} or {"acme": 1, "tool": ..., "args": ...}."""
from pathlib import Path
from typing import Any, Iterator

from pipeline.adapters.base import Adapter, CellSource, Discovery, Emitter, args_digest, load_json
from pipeline.adapters.contract import SourceEvent


def sniff(rel: str, head: str) -> bool:
    return rel.endswith(".acme")


def score(rel: str, head: str) -> tuple[float, str]:
    return (0.9, "acme marker") if rel.endswith(".acme") and '"acme": 1' in head else (0.0, "")


def discover(bundle: Path, paths: list[str]) -> Discovery:
    cells = []
    skipped = []
    for rel in paths:
        if not rel.endswith(".acme"):
            skipped.append((rel, "not an .acme log"))
            continue
        n = len(load_json(bundle / rel, 2, rel).docs)
        cells.append(CellSource(run_id=Path(rel).stem, task_id=Path(rel).stem, path=rel, files=[rel],
                                harness="Acme", step_index_base=0, source_steps=n))
    return Discovery(cells=cells, skipped=skipped, harness="Acme")


def read(bundle: Path, cell: dict[str, Any]) -> Iterator[SourceEvent]:
    em = Emitter(bundle, cell["path"], 2)
    for step, (line, doc) in enumerate(em.jf.docs):
        if "tool" in doc:
            yield em.event("tool_call", "", line=line, step_index=step, actor="agent", tool_name=doc["tool"],
                           args_digest=args_digest(doc["args"]), text=doc["tool"] + " " + doc["args"])
        else:
            yield em.event("message", "", line=line, step_index=step, actor=doc["who"], text=doc["say"])


PROBES = Path(__file__).parent / "probes"  # a probe pack: lunasol.probes entry point

ADAPTER = Adapter(name="acme-log", description="Acme agent logs", sniff=sniff, discover=discover, read=read,
                  score=score, detects="*.acme JSON lines with an acme marker")
'''


_PROBE = """-- type: repeated_exploration
-- proves_unchanged: false
-- summary: every shell call of an acme log (the pack's own probe)
SELECT cell_id, 'target:acme:' || tool_name AS key, list(event_id ORDER BY seq) AS evidence,
       min(seq) AS first_seq, max(seq) AS last_seq, 'acme shell call' AS explanation
FROM probe_events WHERE kind = 'tool_call' AND tool_name = 'shell' GROUP BY cell_id, tool_name
"""


def _wheel(dest: Path) -> Path:
    """A minimal, valid wheel of package ``acme-lunasol`` 0.3.1 registering ``acme-log`` and a probe pack."""
    files = {
        "acme_lunasol/__init__.py": _PLUGIN,
        "acme_lunasol/probes/acme_shell_call.sql": _PROBE,
        "acme_lunasol-0.3.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: acme-lunasol\nVersion: 0.3.1\n",
        "acme_lunasol-0.3.1.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
        "acme_lunasol-0.3.1.dist-info/entry_points.txt": (
            "[lunasol.formats]\nacme-log = acme_lunasol:ADAPTER\n\n[lunasol.probes]\nacme = acme_lunasol:PROBES\n"
        ),
    }
    record = []
    for name, text in files.items():
        h = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={h},{len(text.encode())}")
    record.append("acme_lunasol-0.3.1.dist-info/RECORD,,")
    files["acme_lunasol-0.3.1.dist-info/RECORD"] = "\n".join(record) + "\n"
    whl = dest / "acme_lunasol-0.3.1-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return whl


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    base = tmp_path_factory.mktemp("plugin")
    target = base / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", "--target", str(target),
         str(_wheel(base))],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(target), str(ROOT)])
    return env


def _lunasol(env: dict[str, str], *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    code = "import sys; from pipeline.cli.app import main; sys.argv = ['lunasol', *sys.argv[1:]]; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=300
    )


def test_formats_lists_the_plugin_with_its_package(plugin_env: dict[str, str], tmp_path: Path) -> None:
    proc = _lunasol(plugin_env, "formats", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = {r["name"]: r for r in json.loads(proc.stdout)["formats"]}
    assert rows["acme-log"]["package"] == "acme-lunasol" and rows["acme-log"]["version"] == "0.3.1"
    assert rows["claude-code"]["package"] == "lunasol"
    packs = json.loads(proc.stdout)["probe_packs"]
    assert [(p["name"], p["package"], p["probes"]) for p in packs] == [("acme", "acme-lunasol", ["acme_shell_call"])]
    helped = _lunasol(plugin_env, "bundle", "import", "--help", cwd=tmp_path)
    assert "acme-log" in helped.stdout


def test_auto_imports_the_plugins_logs_beside_a_builtin_format(plugin_env: dict[str, str], tmp_path: Path) -> None:
    src = tmp_path / "logs"
    src.mkdir()
    (src / "run1.acme").write_text(
        '{"acme": 1, "who": "user", "say": "list files"}\n{"acme": 1, "tool": "shell", "args": "ls -la"}\n'
    )
    (src / "cc.jsonl").write_text(
        json.dumps({"type": "system", "subtype": "init", "session_id": "s1", "tools": ["Bash"], "model": "m"})
        + "\n"
        + json.dumps({"type": "assistant", "session_id": "s1", "message": {"role": "assistant", "content": "hi"}})
        + "\n"
    )
    proc = _lunasol(plugin_env, "bundle", "import", "auto", str(src), str(tmp_path / "b"), "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["formats"] == ["acme-log", "claude-code"] and out["cells"] == 2
    exp = _lunasol(plugin_env, "export", str(tmp_path / "b"), "--run-id", "r", cwd=tmp_path)
    assert exp.returncode == 0, exp.stderr
    q = _lunasol(plugin_env, "query", "runs/r", "SELECT kind, tool_name FROM events WHERE tool_name IS NOT NULL",
                 "--json", cwd=tmp_path)  # fmt: skip
    assert q.returncode == 0, q.stderr
    assert "shell" in q.stdout
    # the pack's probe runs in the probes stage beside the shipped ones
    code = (
        "import duckdb; from pipeline.probes import PROBES; from pipeline.probes.packs import pack_probes; "
        "from pipeline.probes.engine import run_probes; con = duckdb.connect('runs/r/ir.duckdb'); "
        "print(sorted({h.probe_id for h in run_probes(con, PROBES + pack_probes())}))"
    )
    hits = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=plugin_env,
                          cwd=tmp_path, timeout=120)  # fmt: skip
    assert hits.returncode == 0, hits.stderr
    assert "acme_shell_call" in hits.stdout


def test_without_the_plugin_the_same_log_is_refused_in_one_line(tmp_path: Path) -> None:
    src = tmp_path / "run1.acme"
    src.write_text('{"acme": 1, "who": "user", "say": "x"}\n')
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT)
    proc = _lunasol(env, "bundle", "import", "auto", str(src), str(tmp_path / "b"), cwd=tmp_path)
    assert proc.returncode == 2
    assert (
        proc.stderr.count("\n") == 1
        and "cannot tell the format" in proc.stderr
        and "name it with FORMAT" in proc.stderr
    )
    assert not (tmp_path / "b").exists()
