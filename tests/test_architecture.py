"""The package's shape: one-way layers (import-linter), no import cycles, no hidden imports.

Imports inside functions count: grimp (import-linter's graph) reads every import statement.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "pipeline"
# Allowed at the top of pipeline/: the package itself and the catalog of artifacts (above every layer).
LOOSE_MODULES = {"__init__.py", "catalog.py"}


def test_layers_contract_is_kept() -> None:
    """`lint-imports` checks the layers contract of pyproject.toml (arrows point down)."""
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("lint-imports")), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "1 kept, 0 broken" in proc.stdout


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    adj = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in sorted(graph.modules)}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in adj:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on_stack.add(v)
            if i < len(adj[v]):
                work.append((v, i + 1))
                w = adj[v][i]
                if w not in index:
                    work.append((w, 0))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return found


def test_no_import_cycles_counting_imports_in_functions() -> None:
    graph = grimp.build_graph("pipeline", include_external_packages=False)
    assert _cycles(graph) == []


def test_cycle_finder_finds_a_cycle() -> None:
    """The check above could fail: a two-module cycle is found."""

    class Fake:
        modules = frozenset({"a", "b", "c"})

        def find_modules_directly_imported_by(self, m: str) -> set[str]:
            return {"a": {"b"}, "b": {"a"}, "c": {"a"}}[m]

    assert _cycles(Fake()) == [["a", "b"]]  # type: ignore[arg-type]


def _function_imports(path: Path) -> list[tuple[int, str]]:
    """Imports of lunasol's own modules inside a function (not under TYPE_CHECKING) with no reason given."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    tree = ast.parse(source)
    guarded = {
        n.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for n in ast.walk(node)
        if hasattr(n, "lineno")
    }
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Import | ast.ImportFrom) or node.col_offset == 0 or node.lineno in guarded:
            continue
        module = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
        if isinstance(node, ast.ImportFrom) and node.level:
            module = "pipeline"  # a relative import is one of ours
        if not (module or "").startswith("pipeline"):
            continue
        first = node.lineno - 1  # a block of imports shares one reason: walk up to its first line
        while first > 0 and lines[first - 1].strip().startswith(("from ", "import ")):
            first -= 1
        text = " ".join(lines[max(first - 1, 0) : node.end_lineno or node.lineno])
        if "#" not in text:  # a comment on the block or the line above it says why (startup cost, ...)
            out.append((node.lineno, lines[node.lineno - 1].strip()))
    return out


def test_imports_inside_functions_say_why() -> None:
    hidden = {str(p.relative_to(ROOT)): _function_imports(p) for p in PACKAGE.rglob("*.py")}
    assert {k: v for k, v in hidden.items() if v} == {}


def test_function_import_check_flags_an_unexplained_import(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text(
        "def f():\n    from pipeline.core import errors\n\n"
        "def g():\n    # startup: litellm takes 3 s to import\n    from pipeline.models import transport\n"
    )
    assert _function_imports(src) == [(2, "from pipeline.core import errors")]


def test_no_module_lookup_by_name() -> None:
    """The places that choose an implementation hold explicit registries, not importlib lookups.

    Formats and probe packs are plugins: their registries (pipeline.core.plugins) load what the
    installed packages declare under the ``lunasol.formats`` / ``lunasol.probes`` entry points
    (importlib.metadata), which is a declared registry too, not a lookup of a module by a name
    built at run time; lunasol's own formats are in that registry through its pyproject.toml.
    """
    offenders = [
        str(p.relative_to(ROOT))
        for p in PACKAGE.rglob("*.py")
        if "importlib.import_module" in p.read_text(encoding="utf-8") or "__import__(" in p.read_text(encoding="utf-8")
    ]
    assert offenders == []


def test_at_most_three_modules_loose_at_the_top() -> None:
    loose = {p.name for p in PACKAGE.glob("*.py")}
    assert loose <= LOOSE_MODULES, f"modules loose at the top of pipeline/: {sorted(loose - LOOSE_MODULES)}"
