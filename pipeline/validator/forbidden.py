"""What a card must never contain: taxonomy, mutation family, target files, source paths, patches, code.

Prompt diffs too.
A card freezes the behaviour to change, not an implementation guess (how to build it is left to
whoever implements it). The policy for file names, decided here and documented in docs/validator.md:

* A workflow artifact the harness itself produces (``review.md``, ``validation.md``,
  ``tasks.json``: a bare name with an artifact extension md / txt / log / json / jsonl /
  csv / html) may be named anywhere as *observed behaviour*. It becomes a target file only
  when the proposed strategy or its rationale tells someone to edit it ("modify review.md").
* A bare name with a code, config or template extension (``controller.py``, ``flow.yaml``,
  ``reviewer.j2``) is a target file anywhere.
* A path with a directory (``src/flow/controller.ts``, ``prompts/review.md``) or a code
  location (``line 42``, ``第 42 行``, ``foo.py:42``) is a source path anywhere, except a
  bundle source ref (``PATH#L10-L20``) in the evidence section, which is evidence.
* Words naming a forbidden thing ("patch", "mutation family", "target file") are fine in a
  clause that negates them ("this card names no patch", "本卡不指定 target file").
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from pipeline.validator.findings import TextField
from pipeline.validator.text import clauses, negated_before, sentences

RULES: dict[str, str] = {
    "V-NO-TAXONOMY": "names a mechanism taxonomy or category label",
    "V-NO-MUTATION-FAMILY": "names a mutation family / mutation type",
    "V-NO-TARGET-FILE": "names a file to change (target file)",
    "V-NO-SOURCE-PATH": "names a source path or code location",
    "V-NO-PATCH": "contains or asks for a patch / diff",
    "V-NO-PROMPT-DIFF": "prescribes prompt wording (a prompt diff)",
    "V-NO-CODE": "contains code",
}

_CODE_EXT = (
    r"py|pyi|ts|tsx|js|jsx|mjs|cjs|go|rs|java|kt|kts|scala|rb|php|c|cc|cpp|cxx|h|hpp|cs|swift|sh|bash|zsh|ps1|"
    r"toml|ini|cfg|conf|yaml|yml|j2|jinja|jinja2|tmpl|tpl|hbs|mustache|prompt|sql|proto|gradle|xml|lock|vue|svelte"
)
_ARTIFACT_EXT = r"md|markdown|txt|log|json|jsonl|csv|html|rst|patch|diff"
# Directories that hold implementation, not workflow artifacts: a path through them is a source path.
_IMPL_DIRS = frozenset(
    {
        "src",
        "lib",
        "pkg",
        "internal",
        "cmd",
        "app",
        "prompts",
        "prompt",
        "templates",
        "template",
        "config",
        "configs",
        "scripts",
        "tests",
        "test",
    }
)

# Named-thing words (exempt inside a negated clause).
_TAXONOMY = re.compile(
    r"(?i)mechanism[ _-]?(?:taxonomy|class(?:es)?|categor(?:y|ies)|type)|\btaxonom(?:y|ies)\b|"
    r"机制(?:分类|类别|类型|分类法|taxonomy)|分类法"
)
_MUTATION = re.compile(
    r"(?i)mutation[ _-]?(?:family|families|type|class|kind|operator|category)|\bmutation\s*:|"
    r"(?:变异|突变)(?:族|家族|类型|类别|算子)"
)
_TARGET_LABEL = re.compile(
    r"(?i)target[ _-]?files?|files? to (?:change|edit|modify|touch)|目标文件|待修改(?:的)?文件|需(?:要)?修改的文件"
)
# Any patch word (not a file extension such as changes.patch): flagged in the strategy itself.
_PATCH = re.compile(r"(?i)(?<!\.)\bpatch(?:es|ed|ing)?\b|(?<!\.)\bdiffs?\b|\bhunks?\b|\bgit apply\b|补丁|代码差异")
# A patch *prescribed*: flagged anywhere (elsewhere a patch may be observed behaviour: "C013 changed its patch").
_PATCH_PRESCRIBED = re.compile(
    r"(?i)\b(?:apply|applies|write|ship|provide|land|submit|prepare|make)\s+(?:a|the|this|one|our)?\s*(?:small\s+|minimal\s+)?"
    r"(?:patch|diff)\b|\bpatch(?:es|ing)?\s+(?:the|its|our|their)\s+(?:controller|harness|runner|workflow|code|prompt)|"
    r"(?:patch|diff)\s*[:：]|打(?:一个|个)?补丁|(?:提供|应用|编写|提交)(?:一个)?补丁|补丁\s*[:：]"
)
_PROMPT_DIFF = re.compile(
    r"(?i)prompt[ _-]?(?:diff|wording|edit|rewrite|change|text)|system[ _-]?prompt|"
    r"\b(?:reword|rewrite|edit|modify|change|update|tweak|amend)\s+(?:the\s+)?(?:\w+\s+){0,2}prompts?\b|"
    r"\b(?:add|insert|append|prepend|remove|delete|replace|change|reword|rewrite)\b[^.;。；]{0,60}?"
    r"\b(?:in|to|into|from|of)\s+(?:the\s+)?(?:\w+\s+)?prompts?\b|"
    r"(?:提示词|提示语|prompt)\s*(?:中|里)?\s*(?:加入|添加|增加|写入|插入|删除|删去|改为|改成|改写|措辞)|"
    r"(?:在|向|往|把|将)[^，,。；;]{0,20}?(?:提示词|提示语|prompt)"
)

# Concrete things (flagged even in a negated clause: naming them is the defect).
# Every pattern below is linear in the text: a match may only start where the previous character
# cannot continue it (the lookbehinds), and the unbounded runs are possessive (``++``), so a 1 MB word
# costs one pass, not one pass per character (a quadratic ``\w+`` once made a 20 kB word take 45 s).
_PATH_WITH_DIR = re.compile(
    rf"(?<![\w/.-])(?:\.{{0,2}}/)?(?:[\w.-]++/)++[\w.-]+\.(?i:{_CODE_EXT}|{_ARTIFACT_EXT})\b(?:#L\d+(?:-L?\d+)?)?"
)
_CODE_ROOT = re.compile(r"(?<![\w/])(?i:src|lib|pkg|internal|cmd)/[\w./-]+")
# A URL's scheme is blanked before paths are looked for, so ``https://host/src/x.py`` is the path
# ``host/src/x.py`` (the ``:`` and ``//`` would otherwise stop every path pattern).
_URL_SCHEME = re.compile(r"(?i)\b[a-z][a-z0-9+.-]{1,15}://")
_BUNDLE_REF = re.compile(r"#L\d+(?:-L?\d+)?$")
# Extensions in any case: ``OUTPUT_FILTER.PY`` is the same file as ``output_filter.py``.
_CODE_FILE = re.compile(rf"(?<![\w/.-])[\w-]++(?:\.[\w-]++)*\.(?i:{_CODE_EXT})\b(?![\w/])")
_ARTIFACT_FILE = re.compile(rf"(?<![\w/.-])[\w-]++(?:\.[\w-]++)*\.(?i:{_ARTIFACT_EXT})\b(?![\w/])")
_EDIT_VERB = re.compile(
    r"(?i)\b(?:modify|modifies|edit|edits|change|changes|update|updates|patch|rewrite|rewrites|amend|touch)\s+(?:the\s+)?$|"
    r"(?:修改|编辑|改写|更新|改动|调整)\s*$"
)
_LOCATION = re.compile(r"(?i)\bline\s+\d+\b|\blines\s+\d+\s*[-–]\s*\d+|第\s*\d+\s*行|\.\w{1,5}:\d+\b|\bL\d+-L\d+\b")
_CODE = re.compile(
    r"```|\bdef\s+[A-Za-z_]\w*\s*\(|\bclass\s+[A-Z]\w*\s*[:(]|\bfunction\s+[A-Za-z_]\w*\s*\(|=>|^\s*return\b|"
    r"^\s*import\s+[A-Za-z_][\w.]*|\bfrom\s+[A-Za-z_][\w.]*\s+import\s+[A-Za-z_]|\b[a-z]+_[a-z0-9_]+\(|\b[a-z]\w*\.[a-z_]\w*\(|"
    r"\{\s*$|(?<!\w)\w++\s*+(?:==|!=|\+=|-=|:=)\s*\w+|^\s*(?:\+\+\+|---|@@)\s|"
    r"\bif\s*\([^()\n]*+(?:\([^()\n]*+\)[^()\n]*+)*+\)\s*\{"
)


def _named(
    fields: Iterable[TextField],
    pattern: re.Pattern[str],
    rule: str,
    what: str,
    split: Callable[[str], list[str]] = clauses,
) -> list[tuple[str, str, str]]:
    out = []
    for f in fields:
        for clause in split(f.text):
            for m in pattern.finditer(clause):
                if not negated_before(clause, m.start()):
                    out.append((rule, f.path, f"{what} ({m.group(0).strip()!r}); a card names the behaviour, not it"))
                    break
            else:
                continue
            break
    return out


def check_forbidden(fields: list[TextField]) -> list[tuple[str, str, str]]:
    """Return (rule, path, message) for every forbidden thing in the card's text."""
    out: list[tuple[str, str, str]] = []
    out += _named(fields, _TAXONOMY, "V-NO-TAXONOMY", "names a mechanism taxonomy")
    out += _named(fields, _MUTATION, "V-NO-MUTATION-FAMILY", "names a mutation family")
    out += _named(fields, _TARGET_LABEL, "V-NO-TARGET-FILE", "names a target file")
    prompt_diff = _named(fields, _PROMPT_DIFF, "V-NO-PROMPT-DIFF", "prescribes prompt wording")
    out += prompt_diff
    patch_paths = {p for _, p, _ in prompt_diff}
    strategy = [f for f in fields if f.path.endswith((".proposed_strategy", ".rationale"))]
    others = [f for f in fields if f not in strategy]
    patch = _named(strategy, _PATCH, "V-NO-PATCH", "asks for a patch or diff")
    patch += _named(others, _PATCH_PRESCRIBED, "V-NO-PATCH", "asks for a patch or diff", split=sentences)
    out += [x for x in patch if x[1] not in patch_paths]
    for f in fields:
        out += _concrete(f)
    return out


def _concrete(f: TextField) -> list[tuple[str, str, str]]:
    out: list[tuple[str, str, str]] = []
    text = f.text
    # Same length as the text, so match offsets still index ``text``.
    paths_text = _URL_SCHEME.sub(lambda m: " " * len(m.group(0)), text)
    path_spans: list[tuple[int, int]] = []
    artifacts: list[re.Match[str]] = []
    for m in list(_PATH_WITH_DIR.finditer(paths_text)) + list(_CODE_ROOT.finditer(paths_text)):
        if any(s <= m.start() < e for s, e in path_spans):
            continue
        path_spans.append((m.start(), m.end()))
        if f.area == "evidence" and _BUNDLE_REF.search(m.group(0)):
            continue  # a bundle source ref is evidence, not a source path
        if _is_artifact_path(m.group(0)):
            artifacts.append(m)  # a workflow artifact the harness writes (.workflow/tasks.md): observed behaviour
            continue
        out.append(("V-NO-SOURCE-PATH", f.path, f"names the source path {m.group(0)!r}; name the behaviour instead"))
        break
    loc = _LOCATION.search(text)
    if loc and not out and f.area != "evidence":
        out.append(("V-NO-SOURCE-PATH", f.path, f"names a code location {loc.group(0)!r}"))
    for m in _CODE_FILE.finditer(paths_text):
        if any(s <= m.start() < e for s, e in path_spans):
            continue
        out.append(("V-NO-TARGET-FILE", f.path, f"names the file {m.group(0)!r}; a card names no target file"))
        break
    if f.path.endswith((".proposed_strategy", ".rationale")):
        for m in artifacts + list(_ARTIFACT_FILE.finditer(text)):
            if _EDIT_VERB.search(text[max(0, m.start() - 30) : m.start()]):
                out.append(
                    ("V-NO-TARGET-FILE", f.path, f"tells someone to edit {m.group(0)!r}; that makes it a target file")
                )
                break
    code = _first_code(text)
    if code:
        out.append(("V-NO-CODE", f.path, f"contains code ({code!r}); a card describes behaviour, not code"))
    return out


def _is_artifact_path(path: str) -> bool:
    """A path to a workflow artifact: an artifact extension and no implementation directory on the way."""
    if _BUNDLE_REF.search(path):
        return False
    parts = path.strip("./").split("/")
    ext = parts[-1].rsplit(".", 1)[-1].lower() if "." in parts[-1] else ""
    return bool(re.fullmatch(_ARTIFACT_EXT, ext)) and not any(p.lower() in _IMPL_DIRS for p in parts[:-1])


def _first_code(text: str) -> str | None:
    for line in text.splitlines() or [text]:
        m = _CODE.search(line)
        if m:
            return m.group(0).strip() or line.strip()
    return None
