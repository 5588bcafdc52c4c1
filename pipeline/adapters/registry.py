"""The one registry of formats: every adapter installed under the ``lunasol.formats`` entry point.

lunasol's own formats are declared in its ``pyproject.toml`` exactly like a third-party package's
(docs/adapters.md, "Adding a format"). Detection asks every adapter how sure it is that a file is
its format (:attr:`Adapter.score`, from distinctive fields); the best score wins only when it is
clear (at least :data:`SURE` and :data:`MARGIN` ahead of the next), so a file is never misrouted to
the first format whose loose check happens to match.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from pipeline.adapters import (
    aider,
    atif,
    claude_code,
    codex,
    copilot_cli,
    gemini_cli,
    inspect_log,
    mast,
    mini_swe_agent,
    opencode,
    openhands,
    otel,
    swe_agent,
    tau,
    who_and_when,
)
from pipeline.adapters.base import Adapter
from pipeline.core import plugins
from pipeline.core.errors import BadInput

SURE = 0.5  # below this no adapter claims a file
MARGIN = 0.2  # the winner must lead the runner-up by this much
HEAD_BYTES = 32768  # enough for the markers that follow a long system prompt (mini-SWE-agent, Magentic-One)

# lunasol's own formats, as its pyproject.toml registers them (a test keeps the two equal). Used
# as they are only when the installed metadata lists none of lunasol's (an install made before the
# entry points existed: `pip install -e .` again fixes it).
BUILTIN: dict[str, Adapter] = {
    a.name: a
    for a in (
        mini_swe_agent.ADAPTER,
        who_and_when.ADAPTER,
        mast.ADAPTER,
        swe_agent.ADAPTER,
        openhands.ADAPTER,
        inspect_log.ADAPTER,
        claude_code.ADAPTER,
        atif.ADAPTER,
        tau.ADAPTER,
        codex.ADAPTER,
        gemini_cli.ADAPTER,
        otel.ADAPTER,
        copilot_cli.ADAPTER,
        opencode.ADAPTER,
        aider.ADAPTER,
    )
}


@dataclass(frozen=True)
class Installed:
    """One registered format and the package that provides it."""

    adapter: Adapter
    package: str
    version: str
    entry: str  # "module:attribute", or "(built-in, not in the installed metadata)"


@lru_cache(maxsize=1)
def installed() -> dict[str, Installed]:
    """Every installed format by name: lunasol's own first (in :data:`BUILTIN` order), then the others."""
    found: dict[str, Installed] = {}
    for p in plugins.plugins(plugins.FORMATS_GROUP):
        obj = plugins.load(p)
        if not isinstance(obj, Adapter):
            raise BadInput(
                f"lunasol.formats plugin {p.name!r} of package {p.package} points at {p.value}, "
                f"which is a {type(obj).__name__}, not a pipeline.adapters.base.Adapter"
            )
        if obj.name != p.name:
            raise BadInput(
                f"lunasol.formats plugin {p.name!r} of package {p.package} names its adapter {obj.name!r}; "
                "the entry-point name must be the format name"
            )
        found[p.name] = Installed(obj, p.package, p.version, p.value)
    if not any(i.package == plugins.OWN_PACKAGE for i in found.values()):
        own = {n: Installed(a, plugins.OWN_PACKAGE, "?", "(built-in, not in the installed metadata)")
               for n, a in BUILTIN.items()}  # fmt: skip
        found = {**own, **{n: i for n, i in found.items() if n not in own}}
    order = list(BUILTIN)
    return dict(sorted(found.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else len(order), kv[0])))


def adapters() -> dict[str, Adapter]:
    """Format name -> adapter, for every installed format."""
    return {n: i.adapter for n, i in installed().items()}


def format_names() -> list[str]:
    """The installed formats' names, from the metadata alone (no adapter is imported: the CLI's help)."""
    names = plugins.names(plugins.FORMATS_GROUP)
    own = list(BUILTIN)
    return [*own, *(n for n in names if n not in own)]


def adapter(fmt: str) -> Adapter:
    """The adapter of one format name; an unknown name is BadInput."""
    found = adapters().get(fmt)
    if found is None:
        raise BadInput(f"unknown format {fmt!r}; known: auto, {', '.join(adapters())} (see `lunasol formats`)")
    return found


@dataclass
class Verdict:
    """Which format one file is, with every adapter's score (best first)."""

    rel: str
    scores: list[tuple[str, float, str]] = field(default_factory=list)  # (format, score, why)

    @property
    def name(self) -> str | None:
        """The clear winner, or None."""
        if not self.scores or self.scores[0][1] < SURE:
            return None
        if len(self.scores) > 1 and self.scores[0][1] - self.scores[1][1] < MARGIN:
            return None
        return self.scores[0][0]

    def why_not(self) -> str:
        """Why no format was chosen, in words: the closest candidate(s) and their reasons."""
        live = [s for s in self.scores if s[1] > 0]
        if not live:
            return "no installed format recognises it"
        top = live[0]
        if top[1] >= SURE and len(live) > 1 and top[1] - live[1][1] < MARGIN:
            rival = live[1]
            return f"closest: {top[0]} (because {top[2]}) and {rival[0]} (because {rival[2]}), too close to choose"
        return f"closest: {top[0]} (because {top[2]}), not sure enough"


def head_of(path: Path) -> str:
    """The first :data:`HEAD_BYTES` of a file as text ("" when unreadable)."""
    try:
        with path.open("rb") as fh:
            return fh.read(HEAD_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return ""


def judge(path: Path, rel: str) -> Verdict:
    """Every installed adapter's score for one file, best first (ties keep registry order)."""
    head = head_of(path)
    scored = []
    for name, ad in adapters().items():
        sure, why = ad.sureness(rel, head)
        scored.append((name, float(sure), why))
    scored.sort(key=lambda s: -s[1])  # stable
    return Verdict(rel, scored)


def detect_file(path: Path, rel: str) -> tuple[str | None, str]:
    """(format, "") for a file whose format is clear, else (None, why not)."""
    v = judge(path, rel)
    name = v.name
    return (name, "") if name else (None, v.why_not())


def cannot_tell(src: Path, why: str) -> BadInput:
    """The one-line refusal when the format of ``src`` is not clear."""
    return BadInput(f"cannot tell the format of {src}; {why}; name it with FORMAT: {', '.join(adapters())}")
